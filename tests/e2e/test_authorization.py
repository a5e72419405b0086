"""Who may do what, through the doors clients use: users and groups, the
per-destination authorization map (read, write, admin), temporary queues kept
to their owner, failed logins rate-limited per address, and connection,
subscription and destination limits refused with their reason."""

from __future__ import annotations

import base64
import http.client
import json
import signal
import time
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.auth import hash_password
from gateway.mqtt.codec import packets as p
from tests.support.auth_helpers import ACL, ITER, USERS, login
from tests.support.helpers import RawClient, unique, wait_for
from tests.support.processes import free_port


@pytest.fixture
def secured(broker_factory):
    return broker_factory(auth={"users": USERS, "acl": ACL})


def refusal(broker, **connect_headers):
    """CONNECT over a raw socket and return the ERROR (or CONNECTED) frame."""
    client = RawClient(broker.stomp_address)
    try:
        client.send_frame("CONNECT", {"accept-version": "1.2", "host": "h", **connect_headers})
        return client.next_frame()
    finally:
        client.close()


def raw_session(raw_client, broker, name):
    client = raw_client(broker)
    assert client.connect(**login(name)).command == "CONNECTED"
    return client


def test_a_granted_send_and_subscribe_work_and_the_others_are_refused_with_the_reason(secured, stomp_client, raw_client):
    queue = f"/queue/orders.{unique()}"
    producer = stomp_client(secured, headers=login("app"))
    producer.send(queue, b"order 1")  # app: write, and admin to create the queue
    consumer = stomp_client(secured, headers=login("reader"))
    consumer.subscribe(queue)
    assert consumer.wait_messages(1)[0].body == b"order 1"

    denied = raw_session(raw_client, secured, "reader")
    denied.send_frame("SEND", {"destination": queue, "receipt": "r"}, b"not mine to send")
    error = denied.expect("ERROR")
    assert "'reader' may not write '/queue/orders." in error.headers["message"]
    denied.wait_closed()

    denied = raw_session(raw_client, secured, "app")
    denied.send_frame("SUBSCRIBE", {"destination": queue, "id": "0", "receipt": "r"})
    assert "'app' may not read" in denied.expect("ERROR").headers["message"]

    consumer.barrier()
    assert consumer.bodies == [b"order 1"]  # nothing from the refused SEND leaked


def test_creating_a_queue_takes_admin_as_in_activemq(secured, stomp_client, raw_client):
    queue = f"/queue/orders.{unique()}"
    late = raw_session(raw_client, secured, "late")
    late.send_frame("SEND", {"destination": queue}, b"first")
    assert "'late' may not admin" in late.expect("ERROR").headers["message"]
    stomp_client(secured, headers=login("app")).send(queue, b"made by app")
    # Once the queue exists, writing is all "late" needs.
    stomp_client(secured, headers=login("late")).send(queue, b"second")
    consumer = stomp_client(secured, headers=login("reader"))
    consumer.subscribe(queue)
    assert [m.body for m in consumer.wait_messages(2)] == [b"made by app", b"second"]


def test_a_wildcard_subscription_needs_a_grant_covering_all_of_it(secured, stomp_client, raw_client):
    fine = stomp_client(secured, headers=login("reader"))
    fine.subscribe("/topic/plant.>")  # read is granted to everyone on plant.>
    fine.subscribe("/topic/plant.*.temp")
    too_wide = raw_session(raw_client, secured, "reader")
    too_wide.send_frame("SUBSCRIBE", {"destination": "/topic/>", "id": "0"})
    assert "may not read '/topic/>'" in too_wide.expect("ERROR").headers["message"]
    stomp_client(secured, headers=login("sensor")).send("/topic/plant.7.temp", b"21.5")
    assert fine.wait_messages(2)[0].body == b"21.5"


def test_request_reply_through_a_temporary_queue_that_only_its_owner_reads(secured, stomp_client, raw_client):
    requester = stomp_client(secured, headers=login("reader"))
    reply_to = f"/temp-queue/{unique('reply')}"
    requester.subscribe(reply_to)
    responder = stomp_client(secured, headers=login("app"))
    responder.subscribe("/queue/replies")  # app reads it, reader writes it (the map's entry)
    requester.send("/queue/replies", b"the question", **{"reply-to": reply_to})
    private = responder.wait_messages(1)[0].headers["reply-to"]
    responder.send(private, b"the answer")  # anyone may reply; the map does not name temporaries
    assert requester.wait_messages(1)[0].body == b"the answer"
    thief = raw_session(raw_client, secured, "ops")
    thief.send_frame("SUBSCRIBE", {"destination": private, "id": "0"})
    assert "belongs to another connection" in thief.expect("ERROR").headers["message"]


def test_temporaries_are_capped_per_connection_and_cannot_use_up_the_destination_limit(broker_factory, raw_client):
    # The attack: a user with no grants at all creates temporary queues through
    # reply-to headers until max_destinations is reached, locking everyone out.
    broker = broker_factory(
        auth={"users": USERS, "acl": ACL}, broker={"max_destinations": 3, "max_temporaries_per_client": 5}
    )
    attacker = raw_session(raw_client, broker, "late")  # latecomers: no read, no admin anywhere
    for i in range(4):  # with /temp-queue/sink itself, five
        attacker.send_frame("SEND", {"destination": "/temp-queue/sink", "reply-to": f"/temp-queue/r{i}", "receipt": f"{i}"})
        attacker.expect("RECEIPT")
    attacker.send_frame("SEND", {"destination": "/temp-queue/sink", "reply-to": "/temp-queue/r4", "receipt": "over"})
    error = attacker.expect_error_and_close()
    assert error.headers["message"] == "too many temporary destinations on this connection (limit 5)"
    assert error.headers["receipt-id"] == "over"
    # Everyone else is unaffected: new queues and temporary queues still work.
    app = raw_session(raw_client, broker, "app")
    app.send_frame("SEND", {"destination": f"/queue/orders.{unique()}", "reply-to": "/temp-queue/r0", "receipt": "q"})
    app.expect("RECEIPT")
    app.send_frame("SUBSCRIBE", {"destination": "/temp-queue/sink", "id": "1", "receipt": "t"})
    app.expect("RECEIPT")


def test_mqtt_denied_publish_is_acknowledged_and_dropped_and_a_denied_filter_fails_alone(secured, paho):
    topic = f"plant/{unique()}/temp"
    watcher = paho(secured, unique("watch"), username="reader", password="reader-pw")
    assert watcher.subscribe((topic, 1), ("secret/#", 1)) == [1, 0x80]  # only the second is refused
    stranger = paho(secured, unique("stranger"), username="reader", password="reader-pw")
    stranger.publish(topic, b"forged", qos=1)  # PUBACKed [MQTT-3.3.5-2] ...
    sensor = paho(secured, unique("sensor"), username="sensor", password="sensor-pw")
    sensor.publish(topic, b"19.0", qos=1)
    assert watcher.wait(1)[0].payload == b"19.0"
    time.sleep(0.2)
    assert watcher.payloads == [b"19.0"]  # ... but never delivered
    stranger.publish(topic, b"still connected", qos=1)  # the connection stays usable
    assert stranger.client.is_connected()


def test_mqtt_retained_publish_is_denied_too(secured, paho):
    topic = f"plant/{unique()}/state"
    paho(secured, unique("s"), username="reader", password="reader-pw").publish(topic, b"forged", qos=1, retain=True)
    paho(secured, unique("s"), username="sensor", password="sensor-pw").publish(f"{topic}/ok", b"real", qos=1, retain=True)
    late = paho(secured, unique("late"), username="reader", password="reader-pw")
    late.subscribe((f"plant/{topic.split('/')[1]}/#", 1))
    assert [m.payload for m in late.wait(1)] == [b"real"]
    time.sleep(0.2)
    assert late.payloads == [b"real"]


def test_a_last_will_is_authorized_like_a_publish_retained_value_included(secured, paho):
    topic = f"plant/{unique('wills')}"
    watcher = paho(secured, unique("watch"), username="reader", password="reader-pw")
    watcher.subscribe((f"{topic}/#", 1))
    paho(secured, unique("s"), will=(f"{topic}/forged", b"forged", 1, True), username="reader", password="reader-pw").drop()
    paho(secured, unique("s"), will=(f"{topic}/real", b"real", 1, True), username="sensor", password="sensor-pw").drop()
    assert watcher.wait(1)[0].payload == b"real"
    late = paho(secured, unique("late"), username="reader", password="reader-pw")
    late.subscribe((f"{topic}/#", 1))
    late.wait(1)
    time.sleep(0.3)
    assert [(m.topic, m.payload) for m in watcher.messages + late.messages] == [(f"{topic}/real", b"real")] * 2


def test_failed_logins_are_rate_limited_per_address_and_the_window_ends(broker_factory, raw_mqtt):
    broker = broker_factory(auth={"users": USERS, "max_failed_logins": 3, "failed_login_window_s": 1.5})
    for _ in range(3):
        assert refusal(broker, login="app", passcode="guess").headers["message"] == "authentication failed"
    # Even the right password is refused, unchecked, while the address is locked out ...
    locked = refusal(broker, **login("app"))
    assert locked.command == "ERROR" and "too many failed logins from 127.0.0.1" in locked.headers["message"]
    mqtt = raw_mqtt(broker)
    mqtt.send(p.Connect(unique("d"), username="app", password=b"app-pw"))
    assert mqtt.next() == p.ConnAck(False, p.NOT_AUTHORIZED)  # ... over MQTT too
    time.sleep(1.6)
    assert refusal(broker, **login("app")).command == "CONNECTED"


def test_failed_logins_are_logged_with_the_peer(gateway, tmp_path):
    config = tmp_path / "gateway.toml"
    config.write_text('[auth]\nusers = [{name = "app", password_hash = "%s"}]\n' % USERS[0]["password_hash"])
    port = free_port()
    process = gateway("--config", str(config), "--stomp-port", str(port), "--log-format", "json")
    process.wait_listening(port)
    frame = refusal(SimpleNamespace(stomp_address=("127.0.0.1", port)), login="app", passcode="nope")
    assert frame.headers["message"] == "authentication failed"
    process.signal(signal.SIGTERM)
    assert process.wait_exit(10) == 0
    events = [json.loads(line) for line in process.stderr.splitlines() + process.stdout.splitlines() if line.startswith("{")]
    refused = [e for e in events if e["event"] == "login_refused"]
    assert len(refused) == 1, events
    assert refused[0]["peer"].startswith("127.0.0.1:") and refused[0]["login"] == "app"
    assert refused[0]["reason"] == "authentication failed" and refused[0]["conn_id"].startswith("stomp-")


def test_connections_past_the_per_address_limit_are_refused_with_the_reason(broker_factory, raw_mqtt, raw_client):
    broker = broker_factory(max_connections_per_address=2)
    first, second = raw_client(broker), raw_client(broker)
    assert first.connect().command == "CONNECTED" and second.connect().command == "CONNECTED"
    refused = refusal(broker)
    assert refused.command == "ERROR"
    assert refused.headers["message"] == "too many connections from 127.0.0.1 (limit 2)"
    mqtt = raw_mqtt(broker)
    mqtt.send(p.Connect(unique("d")))
    assert mqtt.next() == p.ConnAck(False, p.SERVER_UNAVAILABLE)
    first.close()
    wait_for(lambda: broker.call(lambda: broker.running.server.admitted) == 1, what="the slot freed")
    assert refusal(broker).command == "CONNECTED"


def test_the_total_connection_limit(broker_factory, raw_client):
    broker = broker_factory(max_connections=1)
    held = raw_client(broker)
    assert held.connect().command == "CONNECTED"
    assert refusal(broker).headers["message"] == "too many connections (limit 1)"


def test_subscription_and_destination_limits(broker_factory, paho, raw_client):
    broker = broker_factory(broker={"max_subscriptions_per_client": 2, "max_destinations": 3})
    client = raw_client(broker)
    client.connect()
    for i in range(2):
        client.send_frame("SUBSCRIBE", {"destination": f"/topic/t{i}", "id": str(i), "receipt": f"r{i}"})
        client.expect("RECEIPT")
    client.send_frame("SUBSCRIBE", {"destination": "/topic/t9", "id": "9"})
    assert client.expect("ERROR").headers["message"] == "too many subscriptions (limit 2)"

    device = paho(broker, unique("d"))
    assert device.subscribe(("a/1", 1), ("a/2", 1), ("a/3", 0)) == [1, 1, 0x80]

    sender = raw_client(broker)
    sender.connect()
    for i in range(3):
        sender.send_frame("SEND", {"destination": f"/queue/q{i}", "receipt": f"s{i}"}, b"x")
        sender.expect("RECEIPT")
    sender.send_frame("SEND", {"destination": "/queue/one-too-many"}, b"x")
    assert sender.expect("ERROR").headers["message"] == "too many destinations (limit 3)"


def test_refusals_and_denials_are_counted_in_the_metrics(broker_factory, raw_client):
    ops = {"name": "ops", "password_hash": hash_password("ops-pw", iterations=ITER), "role": "read"}
    broker = broker_factory(auth={"users": USERS, "acl": ACL, "max_failed_logins": 1}, admin={"users": [ops]})
    assert refusal(broker, login="app", passcode="guess").command == "ERROR"  # credentials
    assert refusal(broker, **login("app")).command == "ERROR"  # now rate limited
    denied = raw_client(broker)
    denied.send_frame("CONNECT", {"accept-version": "1.2", "host": "h"})
    denied.expect("ERROR")
    connection = http.client.HTTPConnection("127.0.0.1", broker.admin_port, timeout=5)
    try:
        connection.request("GET", "/metrics", headers={"Authorization": "Basic " + base64.b64encode(b"ops:ops-pw").decode()})
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("gateway_logins_refused_total", (("reason", "credentials"),))] == 1
    assert samples[("gateway_logins_refused_total", (("reason", "rate_limited"),))] == 2
    assert samples[("gateway_tls_handshakes_failed_total", ())] == 0


def test_denied_operations_are_counted_by_operation(secured, raw_client):
    client = raw_session(raw_client, secured, "reader")
    client.send_frame("SEND", {"destination": "/queue/orders.x"}, b"no")
    client.expect("ERROR")
    other = raw_session(raw_client, secured, "app")
    other.send_frame("SUBSCRIBE", {"destination": "/topic/>", "id": "1"})
    other.expect("ERROR")
    assert secured.call(lambda: dict(secured.running.broker.stats.denied)) == {"write": 1, "read": 1}
