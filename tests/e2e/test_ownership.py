"""Durable state belongs to the user that made it: a STOMP durable
subscription, a RabbitMQ-style durable without client-id and an MQTT session
are resumed, replaced, removed or taken over by their owner only, across a
restart too.  Bob (a consumer) makes them, Alice (a producer) fills them,
Mallory (no grants beyond the open topics) tries to take them, through the
doors a client uses."""

from __future__ import annotations

import base64
import http.client
import json

import pytest

from gateway.auth import hash_password
from gateway.mqtt.codec import packets as p
from persistence import records
from persistence.records import encode_subscription
from persistence.settings import StoreSettings
from persistence.store import Store
from tests.support.helpers import unique

ITER = 1000


def user(name, *groups):
    return {"name": name, "password_hash": hash_password(f"{name}-pw", iterations=ITER), "groups": list(groups)}


USERS = [user("alice", "producers"), user("bob", "consumers"), user("mallory")]
ACL = [
    {"destination": "/topic/secret.>", "read": ["consumers"], "write": ["producers"]},
    {"destination": "/topic/open.>", "read": ["*"], "write": ["producers"]},
    {"destination": "/topic/barrier.>", "write": ["*"]},
]
AUTH = {"users": USERS, "acl": ACL}
PERSISTENT = {"persistent": "true"}
DURABLE = {"activemq.subscriptionName": "news"}


def login(name):
    return {"login": name, "passcode": f"{name}-pw"}


@pytest.fixture
def secured(broker_factory):
    return broker_factory(auth=AUTH)


def restart(broker_factory, running):
    running.stop()
    return broker_factory(auth=AUTH)


def publish(stomp_client, broker, topic, *bodies):
    alice = stomp_client(broker, headers=login("alice"))
    for body in bodies:
        alice.send(topic, body, **PERSISTENT)
    alice.close()


def bob_away(stomp_client, broker, topic, client_id, **dialect):
    """Bob subscribes durably and leaves; returns nothing, his state stays."""
    bob = stomp_client(broker, headers={**login("bob"), **({"client-id": client_id} if client_id else {})})
    bob.subscribe(topic, "d", ack="client-individual", **dialect)
    bob.close()


def bob_back(stomp_client, broker, topic, client_id, n, **dialect):
    bob = stomp_client(broker, headers={**login("bob"), **({"client-id": client_id} if client_id else {})})
    bob.subscribe(topic, "d", ack="client-individual", **dialect)
    bob.wait_messages(n)
    bob.barrier()
    bob.close()
    return bob.bodies


def mallory_refused(raw_client, broker, command, headers, client_id="bob-app"):
    mallory = raw_client(broker)
    mallory.connect(**login("mallory"), **{"client-id": client_id})
    mallory.send_frame(command, {**headers, "receipt": "r"})
    error = mallory.expect_error_and_close()
    assert error.headers["receipt-id"] == "r"
    return error.headers["message"]


# -- STOMP durable subscriptions ------------------------------------------------


def test_another_user_cannot_unsubscribe_a_durable_subscription_and_its_backlog_stays(secured, stomp_client, raw_client):
    topic = f"/topic/secret.{unique('news')}"
    bob_away(stomp_client, secured, topic, "bob-app", **DURABLE)
    publish(stomp_client, secured, topic, b"one", b"two")
    reason = mallory_refused(raw_client, secured, "UNSUBSCRIBE", {"id": "d", **DURABLE})
    assert "another user" in reason and "news" in reason
    assert bob_back(stomp_client, secured, topic, "bob-app", 2, **DURABLE) == [b"one", b"two"]


@pytest.mark.parametrize("same_topic", [True, False], ids=["resume", "replace-with-another-topic"])
def test_another_user_cannot_subscribe_under_the_same_client_id_and_name(secured, stomp_client, raw_client, same_topic):
    topic = f"/topic/open.{unique('news')}"  # Mallory may read it: only ownership stands in her way
    bob_away(stomp_client, secured, topic, "bob-app", **DURABLE)
    publish(stomp_client, secured, topic, b"one", b"two")
    theirs = topic if same_topic else f"/topic/open.{unique('other')}"
    reason = mallory_refused(raw_client, secured, "SUBSCRIBE", {"destination": theirs, "id": "d", "ack": "client", **DURABLE})
    assert "another user" in reason
    assert bob_back(stomp_client, secured, topic, "bob-app", 2, **DURABLE) == [b"one", b"two"]


def test_a_rabbitmq_style_durable_id_is_each_users_own(secured, stomp_client):
    topic = f"/topic/open.{unique('feed')}"
    rabbit = {"durable": "true", "auto-delete": "false"}
    bob_away(stomp_client, secured, topic, None, **rabbit)
    publish(stomp_client, secured, topic, b"for bob")
    mallory = stomp_client(secured, headers=login("mallory"))
    mallory.subscribe(topic, "d", ack="client-individual", **rabbit)  # the same id: her own subscription
    mallory.barrier()  # the backlog, had she got it, came before the SUBSCRIBE's receipt
    assert mallory.bodies == [] and mallory.rec.errors == []
    mallory.close()
    assert bob_back(stomp_client, secured, topic, None, 1, **rabbit) == [b"for bob"]


def test_a_stomp_client_id_cannot_reach_into_mqtt_sessions(secured, paho, stomp_client, raw_client):
    topic = unique("open/phone").replace("open-", "open/")
    phone = paho(secured, "bob-phone", clean=False, username="bob", password="bob-pw")
    assert phone.subscribe((f"{topic}/#", 1)) == [1]
    phone.close()
    publish(stomp_client, secured, "/topic/" + topic.replace("/", ".") + ".x", b"queued")
    for client_id in ("mqtt:bob-phone", "user:bob"):
        mallory = raw_client(secured)
        mallory.send_frame("CONNECT", {"accept-version": "1.2", "host": "h", **login("mallory"), "client-id": client_id})
        assert "reserved" in mallory.expect_error_and_close().headers["message"]
    back = paho(secured, "bob-phone", clean=False, username="bob", password="bob-pw")
    assert back.connacks == [(True, 0)]
    assert [m.payload for m in back.wait(1)] == [b"queued"]


def test_anonymous_clients_hold_no_durable_state_on_a_broker_with_users(broker_factory, stomp_client, raw_mqtt):
    broker = broker_factory(auth={**AUTH, "anonymous": "true"})
    anonymous = stomp_client(broker, headers={"client-id": "anon"})
    anonymous.conn.subscribe(f"/topic/open.{unique('x')}", "d", headers=DURABLE)
    assert "anonymous" in anonymous.wait_error().headers["message"]
    raw = raw_mqtt(broker)
    raw.send(p.Connect("anon-device", clean_session=False))
    assert raw.next() == p.ConnAck(False, p.NOT_AUTHORIZED)
    raw.wait_closed()


def test_the_owner_resumes_and_removes_their_own_durable_subscription(secured, stomp_client):
    topic = f"/topic/secret.{unique('news')}"
    bob_away(stomp_client, secured, topic, "bob-app", **DURABLE)
    publish(stomp_client, secured, topic, b"one")
    assert bob_back(stomp_client, secured, topic, "bob-app", 1, **DURABLE) == [b"one"]
    bob = stomp_client(secured, headers={**login("bob"), "client-id": "bob-app"})
    rid = unique("unsub-")
    bob.conn.unsubscribe("d", headers={**DURABLE, "receipt": rid})
    bob.wait_receipt(rid)
    assert bob.rec.errors == []


# -- MQTT client ids --------------------------------------------------------------


def mallory_mqtt(raw_mqtt, broker, clean):
    raw = raw_mqtt(broker)
    raw.send(p.Connect("bob-phone", clean_session=clean, username="mallory", password=b"mallory-pw"))
    assert raw.next() == p.ConnAck(False, p.NOT_AUTHORIZED)
    raw.wait_closed()


@pytest.mark.parametrize("clean", [False, True], ids=["resume", "clean-start"])
def test_another_user_cannot_take_an_mqtt_client_id_online_or_offline(secured, paho, raw_mqtt, stomp_client, clean):
    topic = unique("open/t").replace("open-", "open/")
    stomp_topic = "/topic/" + topic.replace("/", ".")
    bob = paho(secured, "bob-phone", clean=False, username="bob", password="bob-pw")
    assert bob.subscribe((topic, 1)) == [1]
    mallory_mqtt(raw_mqtt, secured, clean)  # while bob is connected: he stays
    publish(stomp_client, secured, stomp_topic, b"live")
    assert [m.payload for m in bob.wait(1)] == [b"live"]
    bob.close()
    publish(stomp_client, secured, stomp_topic, b"queued")
    mallory_mqtt(raw_mqtt, secured, clean)  # while he is away: his session stays
    back = paho(secured, "bob-phone", clean=False, username="bob", password="bob-pw")
    assert back.connacks == [(True, 0)]
    assert [m.payload for m in back.wait(1)] == [b"queued"]


def test_the_same_user_still_takes_over_their_own_mqtt_session(secured, paho, raw_mqtt):
    first = raw_mqtt(secured, "bob-phone", clean_session=False, username="bob", password=b"bob-pw")
    second = raw_mqtt(secured, "bob-phone", clean_session=False, username="bob", password=b"bob-pw")
    assert second.connack == p.ConnAck(True, 0)  # his session, handed to his new connection
    first.wait_closed()


# -- across a restart ---------------------------------------------------------------


def test_ownership_survives_a_restart(broker_factory, stomp_client, raw_client, paho, raw_mqtt):
    broker = broker_factory(auth=AUTH)
    topic = f"/topic/open.{unique('news')}"
    mqtt_topic = topic[len("/topic/") :].replace(".", "/")
    bob_away(stomp_client, broker, topic, "bob-app", **DURABLE)
    phone = paho(broker, "bob-phone", clean=False, username="bob", password="bob-pw")
    assert phone.subscribe((mqtt_topic, 1)) == [1]
    phone.close()
    publish(stomp_client, broker, topic, b"kept")
    broker = restart(broker_factory, broker)
    assert "another user" in mallory_refused(raw_client, broker, "UNSUBSCRIBE", {"id": "d", **DURABLE})
    mallory_mqtt(raw_mqtt, broker, clean=True)
    assert bob_back(stomp_client, broker, topic, "bob-app", 1, **DURABLE) == [b"kept"]
    back = paho(broker, "bob-phone", clean=False, username="bob", password="bob-pw")
    assert back.connacks == [(True, 0)]
    assert [m.payload for m in back.wait(1)] == [b"kept"]


def test_a_durable_subscription_stored_without_an_owner_is_left_to_an_administrator(tmp_path, broker_factory, raw_client, stomp_client):
    # A folder written before owners were recorded: the subscription has none.
    store = Store.in_data_dir(str(tmp_path / "data"), StoreSettings(sync="always"))
    store.open()
    key = "durable:7:bob-app:news"
    store.add_subscription(key, "/topic/open.legacy")
    store.close()
    ops = {"name": "ops", "password_hash": hash_password("ops-pw", iterations=ITER), "role": "write"}
    broker = broker_factory(auth=AUTH, admin={"users": [ops]})
    bob = raw_client(broker)
    bob.connect(**login("bob"), **{"client-id": "bob-app"})
    bob.send_frame("SUBSCRIBE", {"destination": "/topic/open.legacy", "id": "d", **DURABLE})
    assert "without an owner" in bob.expect_error_and_close().headers["message"]
    connection = http.client.HTTPConnection("127.0.0.1", broker.admin_port, timeout=10)
    auth = {"Authorization": "Basic " + base64.b64encode(b"ops:ops-pw").decode()}
    connection.request("DELETE", "/api/v1/destinations/" + key.replace(":", "%3A"), headers=auth)
    response = connection.getresponse()
    assert (response.status, json.loads(response.read())["deleted"]) == (200, key)
    connection.close()
    assert bob_back(stomp_client, broker, "/topic/open.legacy", "bob-app", 0, **DURABLE) == []


def decode_subscription(stored: str) -> tuple[str, str | None, str | None]:
    """(pattern, selector, owner) of a stored description."""
    return tuple(records.decode_subscription("durable:7:bob-app:news", stored))[1:]  # type: ignore[return-value]


def test_the_stored_description_keeps_the_owner_and_older_ones_still_read():
    assert decode_subscription("/topic/a") == ("/topic/a", None, None)
    assert decode_subscription("/topic/a\x00x = 1") == ("/topic/a", "x = 1", None)
    for selector, owner in ((None, "bob"), ("x = 1", "bob"), (None, ""), ("x = 1", "a\x00b")):
        assert decode_subscription(encode_subscription("/topic/a", selector, owner)) == ("/topic/a", selector, owner)


# -- how many a user may hold ---------------------------------------------------------


def test_a_user_past_max_durable_subscriptions_is_refused_and_others_are_not(broker_factory, stomp_client, raw_client, paho):
    broker = broker_factory(auth=AUTH, broker={"max_durable_subscriptions_per_user": 2})
    topic = f"/topic/open.{unique('many')}"
    bob = stomp_client(broker, headers={**login("bob"), "client-id": "bob-app"})
    bob.subscribe(topic, "one", **{"activemq.subscriptionName": "one"})
    bob.subscribe(topic, "two", **{"activemq.subscriptionName": "two"})
    third = raw_client(broker)
    third.connect(**login("bob"), **{"client-id": "bob-other"})  # another client id: the same budget
    third.send_frame("SUBSCRIBE", {"destination": topic, "id": "s", "activemq.subscriptionName": "three", "receipt": "r"})
    error = third.expect_error_and_close()
    assert error.headers["receipt-id"] == "r"
    assert error.headers["message"] == "too many durable subscriptions for user 'bob' (limit 2)"
    # MQTT persistent sessions draw on it too: each filter is a durable subscription.
    phone = paho(broker, "bob-phone", clean=False, username="bob", password="bob-pw")
    assert phone.subscribe(("open/x", 1)) == [0x80]
    # Others have their own budget, and Bob's subscriptions work on.
    mallory = paho(broker, "mallory-phone", clean=False, username="mallory", password="mallory-pw")
    assert mallory.subscribe(("open/x", 1), ("open/y", 1), ("open/z", 1)) == [1, 1, 0x80]
    publish(stomp_client, broker, topic, b"still served")
    assert [m.body for m in bob.wait_messages(2)] == [b"still served", b"still served"]
    # Removing one makes room; replacing one (another topic) needs none.
    bob.conn.unsubscribe("two", headers={"activemq.subscriptionName": "two"})
    bob.conn.unsubscribe("one")  # detached, kept
    bob.subscribe(f"{topic}.other", "one-again", **{"activemq.subscriptionName": "one"})
    assert phone.subscribe(("open/x", 1)) == [1]


def test_anonymous_clients_of_an_open_broker_are_bound_by_the_broker_wide_limit(broker_factory, paho, raw_client):
    """On a broker without users every device is anonymous: the per-user cap
    would make one budget of the whole fleet, so the broker-wide one bounds them."""
    broker = broker_factory(broker={"max_durable_subscriptions_per_user": 1, "max_durable_subscriptions": 2})
    first = paho(broker, "device-1", clean=False)
    assert first.subscribe(("open/a", 1)) == [1]
    second = paho(broker, "device-2", clean=False)
    assert second.subscribe(("open/a", 1), ("open/b", 0)) == [1, 0x80]  # two devices pass the per-user 1; a third durable passes the broker's 2
    stomp = raw_client(broker)
    stomp.connect(**{"client-id": "app"})
    stomp.send_frame("SUBSCRIBE", {"destination": "/topic/open.a", "id": "s", "persistent": "true", "receipt": "r"})
    error = stomp.expect_error_and_close()
    assert (error.headers["receipt-id"], error.headers["message"]) == (
        "r", "too many durable subscriptions on the broker (limit 2)")
    assert second.subscribe(("open/b", 1)) == [0x80]  # still refused; the connection stays
    first.close()
    assert paho(broker, "device-1", clean=True).connacks == [(False, 0)]  # a clean start removes it
    assert second.subscribe(("open/b", 1)) == [1]


# -- persistent MQTT sessions are bounded ------------------------------------------


def refused_session(raw_mqtt, broker, client_id, **login):
    raw = raw_mqtt(broker)
    raw.send(p.Connect(client_id, clean_session=False, **login))
    assert raw.next() == p.ConnAck(False, p.NOT_AUTHORIZED)
    raw.wait_closed()


def test_persistent_mqtt_sessions_are_capped_per_user_and_broker_wide(broker_factory, raw_mqtt):
    """A user cycling through client ids with clean session 0 leaves a session
    kept for each: past the cap CONNACK 0x05, while resuming one already kept,
    and a clean session that ends one, still work; the cap survives a restart."""
    limits = {"max_persistent_sessions_per_user": 2, "max_persistent_sessions": 3}
    broker = broker_factory(auth=AUTH, mqtt=limits)
    bob = {"username": "bob", "password": b"bob-pw"}
    alice = {"username": "alice", "password": b"alice-pw"}
    first = raw_mqtt(broker, "bob-1", clean_session=False, **bob)
    first.send(p.Subscribe(1, [("open/kept", 1)]))  # stored: this session outlives a restart
    assert first.next() == p.SubAck(1, [1])
    first.close()
    raw_mqtt(broker, "bob-2", clean_session=False, **bob).close()
    refused_session(raw_mqtt, broker, "bob-3", **bob)
    assert raw_mqtt(broker, "bob-1", clean_session=False, **bob).connack == p.ConnAck(True, 0)  # resuming needs no room
    raw_mqtt(broker, "bob-2", clean_session=True, **bob).close()  # a clean session ends one
    raw_mqtt(broker, "bob-3", clean_session=False, **bob).close()
    raw_mqtt(broker, "alice-1", clean_session=False, **alice).close()  # bob's cap is not alice's
    refused_session(raw_mqtt, broker, "alice-2", **alice)  # but the broker's 3 binds everyone
    broker.stop()
    broker = broker_factory(auth=AUTH, mqtt={**limits, "max_persistent_sessions_per_user": 1})
    refused_session(raw_mqtt, broker, "bob-4", **bob)  # bob-1's stored session still counts
    assert raw_mqtt(broker, "bob-1", clean_session=False, **bob).connack == p.ConnAck(True, 0)


def test_anonymous_devices_of_an_open_broker_are_bound_by_the_broker_wide_session_limit(broker_factory, raw_mqtt):
    broker = broker_factory(mqtt={"max_persistent_sessions_per_user": 1, "max_persistent_sessions": 2})
    raw_mqtt(broker, "device-1", clean_session=False).close()
    raw_mqtt(broker, "device-2", clean_session=False).close()  # past the per-user 1: a fleet, not a user
    refused_session(raw_mqtt, broker, "device-3")
    raw_mqtt(broker, "device-4", clean_session=True).close()  # clean sessions keep nothing, so need no room
