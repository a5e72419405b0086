"""MQTT 3.1.1 end to end, the cases tests/e2e/test_mqtt_paho.py and
test_mqtt_interop.py leave out: CONNECT edges, hand-made malformed packets
(each closing only its own connection), the default in-flight window,
outbound QoS 2 with PUBREL resent, wills on keep-alive timeout and protocol
error, persistent sessions across restart and take-over, the overflow log,
`.` and QoS across the STOMP bridge."""

from __future__ import annotations

import time

import pytest

from gateway.mqtt.codec import packets as p
from tests.support.helpers import unique, wait_for
from tests.support.mqtt_helpers import RawMqtt


@pytest.fixture
def raw(raw_mqtt):
    return raw_mqtt


def quiet(client: RawMqtt, seconds: float = 0.3) -> None:
    """Nothing arrives, and the connection stays open, for ``seconds``."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0 and not client.eof:
        client.pump(left)
    assert client.packets == [], client.packets
    assert not client.eof, "the broker closed the connection"


def ping(client: RawMqtt) -> None:
    client.send(p.PingReq())
    assert client.next() == p.PingResp()


def active(broker) -> dict:
    for connection in broker.running.server.connections.values():
        registry = getattr(connection.session, "registry", None)
        if registry is not None:
            return registry.active
    return {}


def gone(broker, client_id: str) -> None:
    wait_for(lambda: broker.call(lambda: client_id not in active(broker)), what=f"{client_id}'s connection to end")


# -- CONNECT -------------------------------------------------------------------


def test_two_empty_client_ids_get_different_generated_ids(broker, raw):
    first = raw(broker, "")
    second = raw(broker, "")
    assert first.connack == second.connack == p.ConnAck(False, 0)
    ping(first)  # neither took the other over
    ping(second)


def test_a_silent_socket_is_closed_after_the_connect_timeout(broker_factory, raw):
    broker = broker_factory(mqtt={"connect_timeout_s": 0.5})
    silent = raw(broker)
    assert 0.3 <= silent.wait_closed(timeout=5) <= 3.0
    assert silent.packets == []


def test_keep_alive_traffic_keeps_the_connection(broker, raw):
    client = raw(broker, "chatty", keep_alive=1)
    deadline = time.monotonic() + 2.5  # well past 1.5 s
    while time.monotonic() < deadline:
        ping(client)
        time.sleep(0.4)
    ping(client)


def test_a_connect_over_the_preconnect_limit_is_closed_without_connack(broker, raw):
    client = raw(broker)
    try:
        client.send(p.Connect("huge", username="u" * 30_000, will=p.Will("w", b"x" * 60_000)))  # 90 KB > 64 KiB
    except (BrokenPipeError, ConnectionResetError):
        pass  # closed while we were still sending: the same answer
    client.wait_closed()
    assert client.packets == []


@pytest.mark.parametrize(
    "connect",
    [
        b"\x10\x0c\x00\x04MQTT\x04\x03\x00\x3c\x00\x00",  # reserved flag bit set [MQTT-3.1.2-3]
        b"\x10\x0c\x00\x04MQTT\x04\x0a\x00\x3c\x00\x00",  # will QoS without will flag [MQTT-3.1.2-13]
        b"\x10\x10\x00\x04MQTT\x04\x42\x00\x3c\x00\x00\x00\x02pw",  # password without user name [MQTT-3.1.2-22]
        b"\x10\x0c\x00\x04MQTX\x04\x02\x00\x3c\x00\x00",  # not "MQTT" [MQTT-3.1.2-1]
    ],
    ids=["reserved-flag", "will-qos-without-will", "password-without-user", "protocol-name"],
)
def test_a_malformed_connect_is_refused(broker, raw, connect):
    client = raw(broker)
    client.send_raw(connect)
    client.wait_closed()
    assert all(not (isinstance(x, p.ConnAck) and x.return_code == 0) for x in client.packets), client.packets


# -- malformed packets after CONNECT: that connection closes, nobody else's -------


@pytest.mark.parametrize(
    "packet",
    [
        b"\x30\xff\xff\xff\xff\x01",  # a five-byte remaining length
        b"\x36\x05\x00\x01t\x00\x01",  # QoS 3
        b"\x30\x05\x00\x03a/+",  # a wildcard in a topic name [MQTT-3.3.2-2]
        b"\x30\x05\x00\x03\xed\xa0\x80",  # an encoded surrogate is not UTF-8 [MQTT-1.5.3-1]
        b"\x32\x05\x00\x01t\x00\x00",  # packet id 0 [MQTT-2.3.1-1]
        b"\x80\x06\x00\x01\x00\x01t\x00",  # SUBSCRIBE without its 0010 flags [MQTT-3.8.1-1]
        b"\x82\x06\x00\x01\x00\x01t\x03",  # requested QoS 3 [MQTT-3-8.3-4]
        b"\x82\x02\x00\x01",  # SUBSCRIBE with no filter [MQTT-3.8.3-3]
        b"\x60\x02\x00\x01",  # PUBREL without its 0010 flags [MQTT-3.6.1-1]
        b"\xf0\x00",  # packet type 15 is reserved
        b"\x00\x00",  # packet type 0 is reserved
        b"\x20\x02\x00\x00",  # a CONNACK from a client
    ],
    ids=["remaining-length", "qos3", "wildcard-topic", "surrogate", "packet-id-0", "subscribe-flags",
         "subscribe-qos3", "subscribe-empty", "pubrel-flags", "type-15", "type-0", "connack"],
)
def test_a_malformed_packet_closes_only_its_connection(broker, raw, paho, packet):
    bystander = paho(broker)
    topic = unique("bystander")
    bystander.subscribe((topic, 1))
    bad = raw(broker, unique("bad"))
    bad.send_raw(packet)
    bad.wait_closed()
    bystander.publish(topic, b"still here", qos=1)
    assert bystander.wait(1)[0].payload == b"still here"


def test_the_size_limit_closes_only_the_big_sender(broker_factory, raw, paho):
    broker = broker_factory(mqtt={"max_packet_bytes": 1024})
    bystander = paho(broker)
    topic = unique("small")
    bystander.subscribe((topic, 0))
    big = raw(broker, "big")
    big.send(p.Publish(topic, b"y" * 900))  # under the limit: fine
    ping(big)
    big.send(p.Publish(topic, b"x" * 1100))
    big.wait_closed()
    bystander.publish(topic, b"ok")
    assert bystander.wait(2)[-1].payload == b"ok"
    assert [m.payload for m in bystander.messages] == [b"y" * 900, b"ok"]


# -- publish and subscribe -------------------------------------------------------


def test_the_default_in_flight_window_is_32(broker, raw, paho):
    topic = unique("window")
    slow = raw(broker, "slow32")
    slow.send(p.Subscribe(1, [(topic, 1)]))
    assert slow.next() == p.SubAck(1, [1])
    publisher = paho(broker)
    for i in range(50):
        publisher.publish(topic, str(i).encode(), qos=1)
    first = [slow.next() for _ in range(32)]
    quiet(slow)
    for packet in first:
        slow.send(p.PubAck(packet.packet_id))
    rest = [slow.next() for _ in range(18)]
    for packet in rest:
        slow.send(p.PubAck(packet.packet_id))
    assert [x.payload for x in first + rest] == [str(i).encode() for i in range(50)]
    assert all(x.qos == 1 and not x.dup for x in first + rest)
    assert len({x.packet_id for x in first}) == 32


def test_a_resubscribe_gets_its_suback_and_keeps_what_is_in_flight(broker, raw, paho):
    topic = unique("again")
    sub = raw(broker, "resub", clean_session=False)
    sub.send(p.Subscribe(1, [(topic, 1)]))
    assert sub.next() == p.SubAck(1, [1])
    publisher = paho(broker)
    publisher.publish(topic, b"one", qos=1)
    publisher.publish(topic, b"two", qos=1)
    held = [sub.next() for _ in range(2)]
    assert [packet.payload for packet in held] == [b"one", b"two"]  # not acked
    # [MQTT-3.8.4-3]: the same filter again replaces the subscription without
    # interrupting the flow: what is in flight stays in flight under its
    # packet ids (sending it again would break QoS 2's exactly once).
    sub.send(p.Subscribe(2, [(topic, 1)]))
    assert sub.next() == p.SubAck(2, [1])
    for packet in held:
        sub.send(p.PubAck(packet.packet_id))
    publisher.publish(topic, b"three", qos=1)
    after = sub.next()
    assert (after.payload, after.dup) == (b"three", False)  # the next message, nothing resent before it
    sub.send(p.PubAck(after.packet_id))
    sub.close()
    gone(broker, "resub")
    back = raw(broker, "resub", clean_session=False)
    assert back.connack == p.ConnAck(True, 0)
    back.send(p.PingReq())  # a redelivery would be written at CONNACK, before the answer to this
    assert back.next() == p.PingResp()  # all three were acknowledged: nothing comes again


def test_outbound_qos2_handshake_and_pubrel_resent_on_resume(broker, raw, paho):
    topic = unique("two")
    sub = raw(broker, "q2sub", clean_session=False)
    sub.send(p.Subscribe(1, [(topic, 2)]))
    assert sub.next() == p.SubAck(1, [2])
    publisher = paho(broker)
    publisher.publish(topic, b"first", qos=2)
    first = sub.next()
    assert (first.payload, first.qos, first.dup) == (b"first", 2, False)
    sub.send(p.PubRec(first.packet_id))
    assert sub.next() == p.PubRel(first.packet_id)
    sub.close()  # before PUBCOMP
    gone(broker, "q2sub")
    back = raw(broker, "q2sub", clean_session=False)
    assert back.connack == p.ConnAck(True, 0)
    assert back.next() == p.PubRel(first.packet_id)  # the PUBREL again, not the PUBLISH
    back.send(p.PubComp(first.packet_id))
    quiet(back)
    publisher.publish(topic, b"second", qos=2)
    second = back.next()
    assert (second.payload, second.qos) == (b"second", 2)
    back.send(p.PubRec(second.packet_id))
    assert back.next() == p.PubRel(second.packet_id)
    back.send(p.PubComp(second.packet_id))
    quiet(back)


def test_an_inbound_qos2_resent_after_a_reconnect_is_routed_once(broker, raw, paho):
    topic = unique("once")
    subscriber = paho(broker)
    subscriber.subscribe((topic, 2))
    first = raw(broker, "q2pub", clean_session=False)
    first.send(p.Publish(topic, b"one", qos=2, packet_id=9))
    assert first.next() == p.PubRec(9)
    first.close()  # the PUBREC was lost, as far as the client knows
    gone(broker, "q2pub")
    again = raw(broker, "q2pub", clean_session=False)
    again.send(p.Publish(topic, b"one", qos=2, dup=True, packet_id=9))
    assert again.next() == p.PubRec(9)
    again.send(p.PubRel(9))
    assert again.next() == p.PubComp(9)
    subscriber.wait(1)
    time.sleep(0.3)
    assert subscriber.payloads == [b"one"]


def test_dollar_topics_need_an_explicit_first_level(broker, paho):
    root = unique("sys")
    subscriber = paho(broker)
    assert subscriber.subscribe(("+/" + root, 0), ("+/+", 0), (f"$SYS/{root}", 0), ("$SYS/#", 0)) == [0, 0, 0, 0]
    paho(broker).publish(f"$SYS/{root}", b"sys")
    wait_for(lambda: len(subscriber.messages) >= 2, what="the two $SYS subscriptions")
    time.sleep(0.3)
    assert subscriber.payloads == [b"sys", b"sys"]  # not through '+/...'


@pytest.mark.parametrize(
    ("topic_filter", "matches", "misses"),
    [
        ("a/#", ["a", "a/b", "a/b/c"], ["b", "ab"]),  # '#' includes the parent [MQTT-4.7.1-2]
        ("a/+/c", ["a/b/c", "a//c"], ["a/c", "a/b/c/d"]),  # '+' matches an empty level
        ("+", ["x"], ["/x", "x/y"]),
        ("/+", ["/x"], ["x"]),
        ("a/b", ["a/b"], ["a/b/", "A/b"]),
    ],
)
def test_filter_matching(broker, paho, topic_filter, matches, misses):
    # Each test has a broker of its own: no topic here is seen by another test.
    subscriber = paho(broker)
    subscriber.subscribe((topic_filter, 0))
    publisher = paho(broker)
    for topic in misses + matches:
        publisher.publish(topic, topic.encode(), qos=1)
    wait_for(lambda: len(subscriber.messages) >= len(matches), what=f"{matches}")
    time.sleep(0.2)
    assert sorted(subscriber.payloads) == sorted(t.encode() for t in matches)


def test_unsubscribe_and_resubscribe_at_another_qos(broker, paho):
    topic = unique("re")
    subscriber = paho(broker)
    subscriber.subscribe((topic, 0))
    subscriber.subscribe((topic, 2))  # replaces it [MQTT-3.8.4-3]
    publisher = paho(broker)
    publisher.publish(topic, b"once", qos=1)
    subscriber.wait(1)
    time.sleep(0.2)
    assert [(m.payload, m.qos) for m in subscriber.messages] == [(b"once", 1)]
    unsubacks: list[int] = []
    subscriber.client.on_unsubscribe = lambda c, u, mid, codes, props=None: unsubacks.append(mid)
    _, mid = subscriber.client.unsubscribe(topic)
    wait_for(lambda: mid in unsubacks, what="UNSUBACK")
    publisher.publish(topic, b"after", qos=1)
    time.sleep(0.3)
    assert subscriber.payloads == [b"once"]


def test_a_retained_message_goes_at_the_lower_qos_to_every_new_subscriber(broker, paho):
    topic = unique("ret")
    publisher = paho(broker)
    publisher.publish(f"{topic}/zero", b"r0", qos=0, retain=True)
    publisher.publish(f"{topic}/two", b"r2", qos=2, retain=True)
    for _ in range(2):  # a retained message is not consumed
        late = paho(broker)
        late.subscribe((f"{topic}/zero", 1), (f"{topic}/two", 1))
        late.wait(2)
        assert sorted((m.payload, m.qos, m.retain) for m in late.messages) == [(b"r0", 0, True), (b"r2", 1, True)]


# -- wills -----------------------------------------------------------------------


def test_the_will_on_keep_alive_timeout(broker, raw, paho):
    topic = unique("will")
    watcher = paho(broker)
    watcher.subscribe((topic, 2))
    raw(broker, "sleeper", keep_alive=1, will=p.Will(topic, b"timed out", qos=2))
    started = time.monotonic()
    message = watcher.wait(1, timeout=6)[0]
    assert time.monotonic() - started >= 1.0
    assert (message.payload, message.qos, message.retain) == (b"timed out", 2, False)


def test_the_will_on_a_protocol_error_at_qos_0_not_retained(broker, raw, paho):
    topic = unique("will")
    watcher = paho(broker)
    watcher.subscribe((topic, 2))
    bad = raw(broker, "erring", will=p.Will(topic, b"broken", qos=0, retain=False))
    bad.send_raw(b"\x41\x02\x00\x01")  # reserved flags on PUBACK
    bad.wait_closed()
    message = watcher.wait(1)[0]
    assert (message.payload, message.qos) == (b"broken", 0)
    late = paho(broker)
    late.subscribe((topic, 1))
    time.sleep(0.3)
    assert late.messages == []  # not retained


# -- persistent sessions ---------------------------------------------------------


def test_qos2_messages_kept_while_away_arrive_at_qos2_after_a_restart(broker_factory, raw, paho):
    broker = broker_factory()
    topic = unique("away2")
    device = raw(broker, "away2", clean_session=False)
    assert device.connack.session_present is False
    device.send(p.Subscribe(1, [(topic, 2)]))
    assert device.next() == p.SubAck(1, [2])
    device.send(p.Disconnect())
    device.wait_closed()
    publisher = paho(broker)
    for i in range(3):
        publisher.publish(topic, f"m{i}".encode(), qos=2)
    publisher.close()
    broker.stop()
    broker = broker_factory()
    back = raw(broker, "away2", clean_session=False)
    assert back.connack == p.ConnAck(True, 0)
    got, released = [], 0
    while released < 3:  # PUBLISHes and PUBRELs interleave: the window has room for all three
        packet = back.next()
        if isinstance(packet, p.Publish):
            assert packet.qos == 2
            got.append(packet.payload)
            back.send(p.PubRec(packet.packet_id))
        else:
            assert isinstance(packet, p.PubRel), packet
            back.send(p.PubComp(packet.packet_id))
            released += 1
    assert got == [b"m0", b"m1", b"m2"]
    quiet(back)


def test_an_unacked_message_comes_again_with_dup_after_a_restart(broker_factory, raw, paho):
    broker = broker_factory()
    topic = unique("dup")
    device = raw(broker, "dupper", clean_session=False)
    device.send(p.Subscribe(1, [(topic, 1)]))
    assert device.next() == p.SubAck(1, [1])
    paho(broker).publish(topic, b"unacked", qos=1)
    first = device.next()
    assert (first.payload, first.dup) == (b"unacked", False)
    device.close()
    broker.stop()
    broker = broker_factory()
    back = raw(broker, "dupper", clean_session=False)
    assert back.connack == p.ConnAck(True, 0)
    again = back.next()
    assert (again.payload, again.qos, again.dup) == (b"unacked", 1, True)
    back.send(p.PubAck(again.packet_id))
    quiet(back)


def test_a_take_over_keeps_the_persistent_session(broker, raw, paho):
    topic = unique("twin")
    first = raw(broker, "twin-p", clean_session=False)
    first.send(p.Subscribe(1, [(topic, 1)]))
    assert first.next() == p.SubAck(1, [1])
    second = raw(broker, "twin-p", clean_session=False)
    assert second.connack == p.ConnAck(True, 0)
    first.wait_closed()
    paho(broker).publish(topic, b"to the new one", qos=1)
    packet = second.next()
    assert packet.payload == b"to the new one"
    second.send(p.PubAck(packet.packet_id))
    quiet(second)


def test_the_session_overflow_is_logged_with_its_count(broker_factory, paho, capsys):
    broker = broker_factory(mqtt={"max_queued_messages": 5})
    topic = unique("over")
    client_id = unique("overflowing")
    device = paho(broker, client_id, clean=False)
    device.subscribe((topic, 1))
    device.close()
    publisher = paho(broker)
    for i in range(12):
        publisher.publish(topic, str(i).encode(), qos=1)
    back = paho(broker, client_id, clean=False)
    back.wait(5)
    time.sleep(0.3)
    assert back.payloads == [str(i).encode() for i in range(7, 12)]
    err = capsys.readouterr().err
    line = next((x for x in err.splitlines() if "mqtt_session_overflow" in x), None)
    assert line is not None, err
    assert "dropped=7" in line and client_id in line


# -- one topic space with STOMP ----------------------------------------------------


def test_a_dot_in_a_level_is_escaped_for_stomp_both_ways(broker, paho, stomp_client):
    group = unique("group")
    stomp = stomp_client(broker)
    stomp.subscribe(f"/topic/spBv1%2E0.{group}.>")
    device = paho(broker)
    device.subscribe((f"spBv1.0/{group}/#", 0))
    device.publish(f"spBv1.0/{group}/NDATA/edge.1", b"\xff\x00mqtt")
    message = stomp.wait_messages(1)[0]
    assert message.headers["destination"] == f"/topic/spBv1%2E0.{group}.NDATA.edge%2E1"
    assert message.body == b"\xff\x00mqtt"
    stomp.send(f"/topic/spBv1%2E0.{group}.NCMD.edge%2E1", b"\xfe\x01stomp")
    messages = device.wait(2)
    assert [(m.topic, m.payload) for m in messages] == [
        (f"spBv1.0/{group}/NDATA/edge.1", b"\xff\x00mqtt"),
        (f"spBv1.0/{group}/NCMD/edge.1", b"\xfe\x01stomp"),
    ]


def test_stomp_persistence_maps_to_qos_and_back(broker, paho, stomp_client):
    root = unique("plant")
    device = paho(broker)
    device.subscribe((f"{root}/+/temp", 2))
    stomp = stomp_client(broker)
    stomp.subscribe(f"/topic/{root}.*.temp")
    stomp.send(f"/topic/{root}.1.temp", b"fleeting")
    stomp.send(f"/topic/{root}.2.temp", b"kept", persistent="true")
    messages = device.wait(2)
    assert [(m.topic, m.payload, m.qos) for m in messages] == [
        (f"{root}/1/temp", b"fleeting", 0),
        (f"{root}/2/temp", b"kept", 2),  # a persistent SEND counts as QoS 2, capped by the grant
    ]
    device.publish(f"{root}/3/temp", b"qos0", qos=0)
    device.publish(f"{root}/4/temp", b"qos1", qos=1)
    got = {m.body: m.headers for m in stomp.wait_messages(4)[2:]}
    assert got[b"qos0"].get("persistent", "false") == "false"
    assert got[b"qos1"]["persistent"] == "true"


def test_only_qos_1_and_up_survives_a_restart_for_an_absent_device(broker_factory, paho):
    broker = broker_factory()
    topic = unique("keep")
    client_id = unique("absent")
    device = paho(broker, client_id, clean=False)
    device.subscribe((topic, 1))
    device.close()
    publisher = paho(broker)
    publisher.publish(topic, b"qos0", qos=0)
    publisher.publish(topic, b"qos1", qos=1)
    publisher.close()
    broker.stop()
    broker = broker_factory()
    back = paho(broker, client_id, clean=False)
    back.wait(1)
    time.sleep(0.3)
    assert back.payloads == [b"qos1"]
