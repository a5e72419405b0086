"""MQTT 5 publish and delivery through real clients: properties end to end,
reason codes in the acks, topic aliases both ways, and the subscriber's
Maximum Packet Size and Receive Maximum."""

from __future__ import annotations

import time

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec.reasons import ReasonCode as R
from tests.support.auth_helpers import ACL, USERS
from tests.support.helpers import unique
from tests.support.mqtt5_helpers import Paho5, connect5, disconnect_code, props

UNTIL_QUIET = 0.3  # how long a raw socket listens for what must not come


def test_properties_carried_end_to_end(broker):
    topic = unique("props")
    sub = Paho5(broker.mqtt_port, unique("s"))
    pub = Paho5(broker.mqtt_port, unique("p"))
    try:
        sub.subscribe(topic, 1)
        pairs = [("b", "1"), ("a", "2"), ("b", "3"), ("destination", "x")]
        sent = props(UserProperty=pairs, ContentType="application/json", ResponseTopic="replies/1",
                     CorrelationData=b"\x00\xffid", PayloadFormatIndicator=1, MessageExpiryInterval=3600)
        assert pub.publish(topic, b'{"v": 1}', 1, properties=sent) == 0
        got = sub.wait(1)[0].properties
        assert got.UserProperty == pairs  # in order, repeats and all
        assert got.ContentType == "application/json"
        assert got.ResponseTopic == "replies/1"
        assert got.CorrelationData == b"\x00\xffid"
        assert got.PayloadFormatIndicator == 1
        assert 3590 <= got.MessageExpiryInterval <= 3600
    finally:
        sub.close()
        pub.close()


def test_message_expiry_counts_down_on_a_stored_message(broker, raw_mqtt):
    topic = unique("exp")
    client_id = unique("s")
    kept = p.Properties(session_expiry_interval=300)
    sub = raw_mqtt(broker)
    assert connect5(sub, client_id, properties=kept).return_code == 0
    sub.send(p.Subscribe(1, [(topic, 1)]))
    assert isinstance(sub.next(), p.SubAck)
    sub.send(p.Disconnect())
    sub.wait_closed()
    pub = Paho5(broker.mqtt_port, unique("p"))
    try:
        pub.publish(topic, b"m", 1, properties=props(MessageExpiryInterval=60))
    finally:
        pub.close()
    time.sleep(2.1)  # the stored message ages while its subscriber is away
    back = raw_mqtt(broker)
    assert connect5(back, client_id, clean_session=False, properties=kept).session_present
    delivered = back.next()
    assert isinstance(delivered, p.Publish) and delivered.properties is not None
    assert 1 <= delivered.properties.message_expiry_interval <= 58


def test_denied_publish_is_0x87_in_the_ack_and_a_denied_filter_in_the_suback(broker_factory, raw_mqtt):
    broker = broker_factory(auth={"users": USERS, "acl": ACL})
    client = Paho5(broker.mqtt_port, unique("r"), username="reader", password="reader-pw")
    try:
        assert client.publish("plant/line1", b"forged", 1) == R.NOT_AUTHORIZED  # sensors only
        assert client.subscribe("plant/line1", 1) == [1]
        assert client.subscribe("orders/x", 1) == [R.NOT_AUTHORIZED]
    finally:
        client.close()
    raw = raw_mqtt(broker)
    assert connect5(raw, unique("r"), username="reader", password=b"reader-pw").return_code == 0
    raw.send(p.Publish("plant/line1", b"forged", 1, packet_id=1))
    ack = raw.next()
    assert isinstance(ack, p.PubAck) and ack.reason_code == R.NOT_AUTHORIZED
    assert ack.properties is not None and ack.properties.reason_string  # problem information asked by default
    raw.send(p.Publish("plant/line1", b"forged", 2, packet_id=3))
    rec = raw.next()
    assert isinstance(rec, p.PubRec) and rec.reason_code == R.NOT_AUTHORIZED
    raw.send(p.Publish("plant/line1", b"forged", 2, packet_id=3))  # not held as a QoS 2 id: refused again
    rec = raw.next()
    assert isinstance(rec, p.PubRec) and rec.reason_code == R.NOT_AUTHORIZED
    raw.send(p.Subscribe(2, [("plant/a", 1), ("orders/b", 0), ("barrier/c", 0)]))
    suback = raw.next()
    assert isinstance(suback, p.SubAck) and suback.return_codes == [1, R.NOT_AUTHORIZED, R.NOT_AUTHORIZED]


def test_no_reason_string_on_acks_when_the_client_does_not_want_them(broker_factory, raw_mqtt):
    broker = broker_factory(auth={"users": USERS, "acl": ACL})
    raw = raw_mqtt(broker)
    ack = connect5(raw, unique("r"), username="reader", password=b"reader-pw",
                   properties=p.Properties(request_problem_information=0))
    assert ack.return_code == 0
    raw.send(p.Publish("plant/line1", b"forged", 1, packet_id=1))
    puback = raw.next()
    assert isinstance(puback, p.PubAck) and puback.reason_code == R.NOT_AUTHORIZED
    assert puback.properties is None or puback.properties.reason_string is None  # [MQTT-3.1.2-29]


def test_unsuback_codes(broker):
    client = Paho5(broker.mqtt_port, unique("u"))
    try:
        client.subscribe("t/u", 0)
        assert client.unsubscribe("t/u", "t/never") == [R.SUCCESS, R.NO_SUBSCRIPTION_EXISTED]
    finally:
        client.close()


def test_payload_format_invalid(broker, raw_mqtt):
    client = raw_mqtt(broker)
    assert connect5(client, unique("f")).return_code == 0
    utf8 = p.Properties(payload_format_indicator=1)
    client.send(p.Publish("t/f", b"\xff\xfe", 1, packet_id=1, properties=utf8))
    ack = client.next()
    assert isinstance(ack, p.PubAck) and ack.reason_code == R.PAYLOAD_FORMAT_INVALID
    client.send(p.Publish("t/f", b"\xff\xfe", 0, properties=utf8))
    assert disconnect_code(client) == R.PAYLOAD_FORMAT_INVALID


def test_topic_alias_from_the_client(broker, raw_mqtt):
    topic = unique("alias")
    sub = Paho5(broker.mqtt_port, unique("s"))
    try:
        sub.subscribe(topic, 0)
        pub = raw_mqtt(broker)
        assert connect5(pub, unique("p")).return_code == 0
        pub.send(p.Publish(topic, b"1", properties=p.Properties(topic_alias=1)))
        pub.send(p.Publish("", b"2", properties=p.Properties(topic_alias=1)))
        pub.send(p.Publish("", b"3", 1, packet_id=1, properties=p.Properties(topic_alias=1)))
        assert isinstance(pub.next(), p.PubAck)
        assert [(m.topic, m.payload) for m in sub.wait(3)] == [(topic, b"1"), (topic, b"2"), (topic, b"3")]
    finally:
        sub.close()


def test_topic_alias_to_the_client(broker, raw_mqtt):
    topic = unique("alias")
    sub = raw_mqtt(broker)
    assert connect5(sub, unique("s"), properties=p.Properties(topic_alias_maximum=2)).return_code == 0
    sub.send(p.Subscribe(1, [(topic, 0)]))
    assert isinstance(sub.next(), p.SubAck)
    pub = Paho5(broker.mqtt_port, unique("p"))
    try:
        pub.publish(topic, b"1")
        pub.publish(topic, b"2")
    finally:
        pub.close()
    first, second = sub.next(), sub.next()
    assert isinstance(first, p.Publish) and isinstance(second, p.Publish)
    assert first.topic == topic and first.properties is not None and first.properties.topic_alias == 1
    assert second.topic == "" and second.properties is not None and second.properties.topic_alias == 1
    assert second.payload == b"2"


def test_no_alias_to_a_client_that_takes_none(broker, raw_mqtt):
    topic = unique("alias")
    sub = raw_mqtt(broker)
    assert connect5(sub, unique("s")).return_code == 0
    sub.send(p.Subscribe(1, [(topic, 0)]))
    assert isinstance(sub.next(), p.SubAck)
    pub = Paho5(broker.mqtt_port, unique("p"))
    try:
        pub.publish(topic, b"1")
        pub.publish(topic, b"2")
    finally:
        pub.close()
    for _ in range(2):
        got = sub.next()
        assert isinstance(got, p.Publish) and got.topic == topic and got.properties is None


def test_maximum_packet_size_outbound_and_the_drops_counted_in_metrics(broker_factory, raw_mqtt):
    from tests.e2e.test_admin import USERS, call

    broker = broker_factory(admin={"users": USERS})
    topic = unique("max")
    sub = raw_mqtt(broker)
    assert connect5(sub, unique("s"), properties=p.Properties(maximum_packet_size=200)).return_code == 0
    sub.send(p.Subscribe(1, [(topic, 1)]))
    assert isinstance(sub.next(), p.SubAck)
    pub = Paho5(broker.mqtt_port, unique("p"))
    try:
        pub.publish(topic, b"x" * 500, 1)  # too big for the subscriber: not sent
        pub.publish(topic, b"small", 1)
    finally:
        pub.close()
    got = sub.next()
    assert isinstance(got, p.Publish) and got.payload == b"small"
    metrics = call(broker, "GET", "/metrics")[1].decode()
    assert "gateway_mqtt_oversize_dropped_total 1\n" in metrics


def test_receive_maximum_outbound(broker, raw_mqtt):
    topic = unique("rm")
    sub = raw_mqtt(broker)
    assert connect5(sub, unique("s"), properties=p.Properties(receive_maximum=2)).return_code == 0
    sub.send(p.Subscribe(1, [(topic, 1)]))
    assert isinstance(sub.next(), p.SubAck)
    pub = Paho5(broker.mqtt_port, unique("p"))
    try:
        for i in range(5):
            pub.publish(topic, b"%d" % i, 1)
    finally:
        pub.close()
    first = [sub.next(), sub.next()]
    sub.pump(UNTIL_QUIET)
    assert sub.packets == []  # two unacknowledged: no third
    received = [first]
    for _ in range(2):
        for packet in received[-1]:
            sub.send(p.PubAck(packet.packet_id))  # type: ignore[union-attr]
        received.append([sub.next(), sub.next()] if len(sum(received, [])) < 4 else [sub.next()])
    payloads = [packet.payload for packet in sum(received, [])]  # type: ignore[union-attr]
    assert payloads == [b"0", b"1", b"2", b"3", b"4"]
