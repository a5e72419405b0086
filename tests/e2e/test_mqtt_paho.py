"""MQTT 3.1.1 end to end: paho-mqtt and raw sockets against the real server."""

from __future__ import annotations

import base64
import http.client
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.auth import hash_password

from gateway.mqtt.codec import packets as p
from tests.support.helpers import unique, wait_for


@pytest.fixture
def mqtt_clients(paho):
    return paho


# -- CONNECT -------------------------------------------------------------------


def test_an_unsupported_protocol_level_gets_connack_1_and_a_close(broker, raw_mqtt):
    raw = raw_mqtt(broker)
    raw.send(p.Connect("x", protocol_level=6))
    assert raw.next() == p.ConnAck(False, p.UNACCEPTABLE_PROTOCOL_VERSION)
    raw.wait_closed()


def test_mqtt_5_is_served_on_the_same_port_with_a_v5_connack(broker, raw_mqtt):
    raw = raw_mqtt(broker)
    raw.send(p.Connect("x", protocol_level=5))  # a v5 CONNECT: the raw client's codec speaks v5 from here
    connack = raw.next()
    assert connack.return_code == 0 and connack.properties is not None
    assert connack.properties.receive_maximum == 1024  # the server's limits are announced


def test_an_empty_client_id_needs_clean_session(broker, raw_mqtt):
    accepted = raw_mqtt(broker)
    accepted.send(p.Connect("", clean_session=True))
    assert accepted.next() == p.ConnAck(False, p.ACCEPTED)
    refused = raw_mqtt(broker)
    refused.send(p.Connect("", clean_session=False))
    assert refused.next() == p.ConnAck(False, p.IDENTIFIER_REJECTED)
    refused.wait_closed()


def test_keep_alive_is_enforced_at_one_and_a_half_times(broker, raw_mqtt):
    raw = raw_mqtt(broker)
    raw.send(p.Connect("sleepy", keep_alive=1))
    assert raw.next() == p.ConnAck(False, 0)
    waited = raw.wait_closed(timeout=5)
    assert 1.2 <= waited <= 3.0


@pytest.mark.parametrize(
    "first",
    [
        b"\x30\x03\x00\x01t",  # a PUBLISH before CONNECT
        b"\x10\xff\xff\xff\xff\x01",  # a remaining length of five bytes
    ],
    ids=["publish-first", "bad-remaining-length"],
)
def test_a_bad_first_packet_closes_only_that_connection(broker, raw_mqtt, mqtt_clients, first):
    bystander = mqtt_clients(broker, "bystander")
    bystander.subscribe(("still/here", 0))
    raw = raw_mqtt(broker)
    raw.send_raw(first)
    raw.wait_closed()
    bystander.publish("still/here", b"ok")
    assert bystander.wait(1)[0].payload == b"ok"


@pytest.mark.parametrize(
    "packet",
    [
        b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00",  # a second CONNECT
        b"\x31\x05\x00\x03a\x00b",  # NUL in a topic
        b"\x30\x04\x00\x02\xc3\x28",  # invalid UTF-8
        b"\x41\x02\x00\x01",  # reserved flags on PUBACK
    ],
    ids=["second-connect", "nul-topic", "bad-utf8", "reserved-flags"],
)
def test_malformed_packets_after_connect_close_the_connection(broker, raw_mqtt, packet):
    raw = raw_mqtt(broker)
    raw.send(p.Connect("bad"))
    assert raw.next() == p.ConnAck(False, 0)
    raw.send_raw(packet)
    raw.wait_closed()


def test_a_packet_over_the_size_limit_closes_the_connection(broker_factory, raw_mqtt):
    broker = broker_factory(mqtt={"max_packet_bytes": 1024})
    raw = raw_mqtt(broker)
    raw.send(p.Connect("big"))
    assert raw.next() == p.ConnAck(False, 0)
    raw.send(p.Publish("t", b"x" * 2000))
    raw.wait_closed()


# -- publish and subscribe -----------------------------------------------------


def test_qos_0_1_2_in_both_directions_at_the_lower_of_published_and_granted(broker, mqtt_clients):
    topic = unique("q")
    subscriber = mqtt_clients(broker, "sub")
    assert subscriber.subscribe((f"{topic}/one", 1), (f"{topic}/two", 2), (f"{topic}/zero", 0)) == [1, 2, 0]
    publisher = mqtt_clients(broker, "pub")
    for qos in (0, 1, 2):
        for level in ("zero", "one", "two"):
            publisher.publish(f"{topic}/{level}", f"{level}-{qos}".encode(), qos=qos)
    messages = subscriber.wait(9)
    granted = {"zero": 0, "one": 1, "two": 2}
    for message in messages:
        level, published = message.payload.decode().split("-")
        assert message.qos == min(int(published), granted[level]), message.payload


def test_wildcards_and_system_topics(broker, mqtt_clients):
    root = unique("w")
    subscriber = mqtt_clients(broker)
    subscriber.subscribe((f"{root}/+/temp", 0), ("#", 0))
    publisher = mqtt_clients(broker)
    publisher.publish(f"{root}/3/temp", b"a")
    publisher.publish(f"$SYS/{root}", b"system")
    publisher.publish(f"{root}/3/humidity", b"b")
    time.sleep(0.3)
    got = sorted(m.payload for m in subscriber.messages)
    assert got == [b"a", b"a", b"b"]  # '#' saw both of its topics, nobody saw $SYS


def test_an_invalid_filter_fails_alone(broker, raw_mqtt):
    raw = raw_mqtt(broker)
    raw.send(p.Connect("filters"))
    assert raw.next() == p.ConnAck(False, 0)
    raw.send(p.Subscribe(1, [("a/#/b", 0), ("ok/+", 1), ("a+", 0)]))
    assert raw.next() == p.SubAck(1, [p.SUBACK_FAILURE, 1, p.SUBACK_FAILURE])


def test_an_inbound_qos2_message_resent_with_dup_is_delivered_once(broker, raw_mqtt, mqtt_clients):
    topic = unique("once")
    subscriber = mqtt_clients(broker)
    subscriber.subscribe((topic, 2))
    raw = raw_mqtt(broker)
    raw.send(p.Connect("qos2"))
    assert raw.next() == p.ConnAck(False, 0)
    raw.send(p.Publish(topic, b"exactly once", qos=2, packet_id=7))
    assert raw.next() == p.PubRec(7)
    raw.send(p.Publish(topic, b"exactly once", qos=2, dup=True, packet_id=7))
    assert raw.next() == p.PubRec(7)
    raw.send(p.PubRel(7))
    assert raw.next() == p.PubComp(7)
    subscriber.wait(1)
    time.sleep(0.3)
    assert subscriber.payloads == [b"exactly once"]


def test_the_in_flight_window_holds_back_the_rest_until_acks(broker_factory, raw_mqtt, mqtt_clients):
    broker = broker_factory(mqtt={"max_inflight": 4})
    topic = unique("window")
    raw = raw_mqtt(broker)
    raw.send(p.Connect("slow"))
    assert raw.next() == p.ConnAck(False, 0)
    raw.send(p.Subscribe(1, [(topic, 1)]))
    assert raw.next() == p.SubAck(1, [1])
    publisher = mqtt_clients(broker)
    for i in range(10):
        publisher.publish(topic, str(i).encode(), qos=1)
    first = [raw.next() for _ in range(4)]
    with pytest.raises(AssertionError):
        raw.next(timeout=0.3)  # the window is full
    for packet in first:
        raw.send(p.PubAck(packet.packet_id))
    rest = [raw.next() for _ in range(4)]
    assert [x.payload for x in first + rest] == [str(i).encode() for i in range(8)]


# -- retained messages ---------------------------------------------------------


def test_retained_messages_replace_clear_and_survive_a_restart(broker_factory, mqtt_clients):
    broker = broker_factory()
    topic = unique("retained")
    publisher = mqtt_clients(broker)
    publisher.publish(f"{topic}/a", b"old", qos=1, retain=True)
    publisher.publish(f"{topic}/a", b"new", qos=1, retain=True)
    publisher.publish(f"{topic}/b", b"gone", qos=0, retain=True)
    publisher.publish(f"{topic}/b", b"", qos=0, retain=True)
    publisher.close()
    broker.stop()
    broker = broker_factory()
    late = mqtt_clients(broker)
    late.subscribe((f"{topic}/#", 1))
    message = late.wait(1)[0]
    time.sleep(0.3)
    assert [(m.topic, m.payload, m.retain) for m in late.messages] == [(f"{topic}/a", b"new", True)]
    live = mqtt_clients(broker)
    live.publish(f"{topic}/a", b"live", qos=1, retain=True)
    assert late.wait(2)[1].retain is False and message.qos == 1  # live deliveries are not flagged


def metrics(broker) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", broker.admin_port, timeout=10)
    conn.request("GET", "/metrics", headers={"Authorization": "Basic " + base64.b64encode(b"ops:ops-pw").decode()})
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    assert response.status == 200
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples if not s.labels}


ADMIN = {"users": [{"name": "ops", "password_hash": hash_password("ops-pw", iterations=1000), "role": "read"}]}


def test_retained_topics_past_the_limits_are_published_but_not_kept(broker_factory, mqtt_clients):
    broker = broker_factory(broker={"max_retained_messages": 2, "max_retained_bytes": 1000}, admin=ADMIN)
    topic = unique("bounded")
    watcher = mqtt_clients(broker)
    watcher.subscribe((f"{topic}/#", 1))
    publisher = mqtt_clients(broker)
    sent = [
        ("a", b"a1"), ("b", b"b1"),
        ("c", b"c1"),  # a third topic: routed, not kept
        ("a", b"a2"),  # replacing a kept one always works
        ("b", b"x" * 2000),  # a larger value past max_retained_bytes: routed, b1 stays
        ("b", b""),  # clearing always works
        ("d", b"d1"),  # and made room
    ]
    for level, payload in sent:
        publisher.publish(f"{topic}/{level}", payload, qos=1, retain=True)
    assert [(m.topic, m.payload) for m in watcher.wait(len(sent))] == [(f"{topic}/{l}", b) for l, b in sent]
    late = mqtt_clients(broker)
    late.subscribe((f"{topic}/#", 1))
    late.wait(2)
    time.sleep(0.3)
    assert sorted((m.topic, m.payload, m.retain) for m in late.messages) == [
        (f"{topic}/a", b"a2", True), (f"{topic}/d", b"d1", True)]
    assert publisher.client.is_connected()
    counts = metrics(broker)
    assert (counts["gateway_retained_refused_total"], counts["gateway_retained_messages"]) == (2, 2)
    assert counts["gateway_retained_bytes"] == 4


def test_a_narrow_wildcard_gets_only_its_retained_messages(broker, mqtt_clients):
    topic = unique("tree")
    publisher = mqtt_clients(broker)
    for name in ("a/x/1", "a/y/1", "a/y/2", "b/x/1", "a"):
        publisher.publish(f"{topic}/{name}", name.encode(), qos=1, retain=True)
    for pattern, expected in (("+/x/1", {"a/x/1", "b/x/1"}), ("a/#", {"a", "a/x/1", "a/y/1", "a/y/2"}),
                              ("a/+/2", {"a/y/2"}), ("a/+", set())):
        late = mqtt_clients(broker)
        late.subscribe((f"{topic}/{pattern}", 0))
        if expected:
            late.wait(len(expected))
        time.sleep(0.2)
        assert {m.payload.decode() for m in late.messages} == expected, pattern
        late.close()


def test_one_subscribe_packet_with_many_filters_is_bounded_and_answered_in_full(broker_factory, raw_mqtt, mqtt_clients):
    """A filter repeated in one SUBSCRIBE replaces itself and gets the retained
    messages once; past max_subscriptions_per_client each filter gets 0x80, as
    does an invalid one, and the connection stays."""
    broker = broker_factory(broker={"max_subscriptions_per_client": 3})
    topic = unique("many")
    mqtt_clients(broker).publish(f"{topic}/kept", b"retained", qos=1, retain=True)
    raw = raw_mqtt(broker, unique("raw"))
    filters = [(f"{topic}/#", 1)] * 500 + [(f"{topic}/{i}", 0) for i in range(3)] + [(f"{topic}/#/bad", 0)] * 500
    raw.send(p.Subscribe(7, filters))
    assert raw.next() == p.SubAck(7, [1] * 500 + [0, 0, 0x80] + [0x80] * 500)
    retained = raw.next()
    assert (retained.topic, retained.payload, retained.retain) == (f"{topic}/kept", b"retained", True)
    raw.send(p.PubAck(retained.packet_id))
    raw.send(p.PingReq())
    assert raw.next() == p.PingResp()  # no second copy came before it


# -- wills ---------------------------------------------------------------------


@pytest.mark.parametrize("ending", ["dropped", "disconnect"])
def test_the_will_is_published_on_a_dropped_connection_only(broker, mqtt_clients, ending):
    topic = unique("will")
    watcher = mqtt_clients(broker)
    watcher.subscribe((topic, 1))
    device = mqtt_clients(broker, unique("device"), will=(topic, b"offline", 1, True))
    if ending == "dropped":
        device.drop()
        message = watcher.wait(1)[0]
        assert (message.payload, message.qos) == (b"offline", 1)
        late = mqtt_clients(broker)
        late.subscribe((topic, 1))
        assert late.wait(1)[0].retain  # will retain honoured
    else:
        device.close()
        time.sleep(0.5)
        assert watcher.messages == []


# -- persistent sessions -------------------------------------------------------


def test_a_persistent_session_keeps_subscriptions_and_messages_across_a_restart(broker_factory, mqtt_clients):
    broker = broker_factory()
    topic = unique("away")
    client_id = unique("sensor")
    first = mqtt_clients(broker, client_id, clean=False)
    assert first.connacks == [(False, 0)]
    first.subscribe((f"{topic}/#", 1))
    first.close()
    publisher = mqtt_clients(broker)
    for i in range(3):
        publisher.publish(f"{topic}/x", f"m{i}".encode(), qos=1)
    publisher.close()
    broker.stop()
    broker = broker_factory()
    back = mqtt_clients(broker, client_id, clean=False)
    assert back.connacks == [(True, 0)]
    back.wait(3)
    assert back.payloads == [b"m0", b"m1", b"m2"]
    back.close()
    clean = mqtt_clients(broker, client_id, clean=True)
    assert clean.connacks == [(False, 0)]
    clean.close()
    again = mqtt_clients(broker, client_id, clean=False)
    assert again.connacks == [(False, 0)]  # clean session 1 discarded it all


def test_unacked_messages_come_again_with_dup_and_their_packet_id(broker, raw_mqtt, mqtt_clients):
    topic = unique("dup")
    raw = raw_mqtt(broker)
    raw.send(p.Connect("forgetful", clean_session=False))
    assert raw.next() == p.ConnAck(False, 0)
    raw.send(p.Subscribe(1, [(topic, 1)]))
    assert raw.next() == p.SubAck(1, [1])
    mqtt_clients(broker).publish(topic, b"unacked", qos=1)
    first = raw.next()
    assert isinstance(first, p.Publish) and not first.dup
    raw.close()
    wait_for(lambda: broker.call(lambda: "forgetful" not in _active(broker)), what="the session to end")
    again = raw_mqtt(broker)
    again.send(p.Connect("forgetful", clean_session=False))
    assert again.next() == p.ConnAck(True, 0)
    resent = again.next()
    assert isinstance(resent, p.Publish)
    assert (resent.payload, resent.dup, resent.packet_id) == (b"unacked", True, first.packet_id)


def _active(broker):
    for connection in broker.running.server.connections.values():
        session = connection.session
        if hasattr(session, "registry"):
            return session.registry.active
    return {}


def test_a_second_connection_with_the_same_client_id_takes_over(broker, raw_mqtt):
    first = raw_mqtt(broker)
    first.send(p.Connect("twin"))
    assert first.next() == p.ConnAck(False, 0)
    second = raw_mqtt(broker)
    second.send(p.Connect("twin"))
    assert second.next() == p.ConnAck(False, 0)
    first.wait_closed()
    second.send(p.PingReq())
    assert second.next() == p.PingResp()


def test_a_persistent_session_keeps_only_the_newest_up_to_its_limit(broker_factory, mqtt_clients):
    broker = broker_factory(mqtt={"max_queued_messages": 5})
    topic = unique("limit")
    client_id = unique("bounded")
    device = mqtt_clients(broker, client_id, clean=False)
    device.subscribe((topic, 1))
    device.close()
    publisher = mqtt_clients(broker)
    for i in range(12):
        publisher.publish(topic, str(i).encode(), qos=1)
    back = mqtt_clients(broker, client_id, clean=False)
    back.wait(5)
    time.sleep(0.3)
    assert back.payloads == [str(i).encode() for i in range(7, 12)]


# -- one topic space with STOMP ------------------------------------------------


def test_mqtt_and_stomp_share_topics_byte_for_byte(broker, mqtt_clients, stomp_client):
    root = unique("plant")
    stomp = stomp_client(broker)
    stomp.subscribe(f"/topic/{root}.3.temp")
    stomp.subscribe(f"/topic/{root}.*.temp")
    device = mqtt_clients(broker)
    device.subscribe((f"{root}/3/temp", 1), (f"{root}/+/temp", 1), (f"{root}/#", 1))
    binary = bytes(range(256))
    device.publish(f"{root}/3/temp", binary, qos=1)
    stomp.wait_messages(2)
    assert [m.body for m in stomp.messages] == [binary, binary]
    assert stomp.messages[0].headers["persistent"] == "true"  # QoS >= 1 is persistent
    stomp.send(f"/topic/{root}.3.temp", binary[::-1], persistent="true")
    messages = device.wait(6)
    from_stomp = [m for m in messages if m.payload == binary[::-1]]
    assert len(from_stomp) == 3 and all(m.qos == 1 for m in from_stomp)  # granted QoS
    assert {m.topic for m in messages} == {f"{root}/3/temp"}


def test_a_dot_inside_a_level_survives(broker, mqtt_clients):
    topic = f"spBv1.0/{unique('group')}/NDATA/edge.node"
    subscriber = mqtt_clients(broker)
    subscriber.subscribe(("spBv1.0/+/NDATA/#", 0))
    mqtt_clients(broker).publish(topic, b"sparkplug")
    assert subscriber.wait(1)[0].topic == topic


def test_a_stomp_name_mqtt_cannot_carry_is_skipped_not_fatal(broker, mqtt_clients, stomp_client):
    root = unique("odd")
    device = mqtt_clients(broker)
    device.subscribe((f"{root}/#", 1))
    stomp = stomp_client(broker)
    stomp.send(f"/topic/{root}.a+b", b"unrepresentable", persistent="true")
    stomp.send(f"/topic/{root}.ok", b"fine", persistent="true")
    assert device.wait(1)[0].payload == b"fine"
    device.publish(f"{root}/still", b"alive", qos=1)
    assert device.wait(2)[1].payload == b"alive"
