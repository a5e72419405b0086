"""The broker tells a v5 client why it closes the connection: a DISCONNECT
with the reason code before the close [MQTT-4.13.2-1], for each cause a
client can meet."""

from __future__ import annotations

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec.reasons import ReasonCode as R
from tests.support.helpers import unique
from tests.support.mqtt5_helpers import Paho5, connect5, disconnect_code


def test_session_taken_over(broker, raw_mqtt):
    client_id = unique("t")
    first = raw_mqtt(broker)
    assert connect5(first, client_id).return_code == 0
    second = raw_mqtt(broker)
    assert connect5(second, client_id).return_code == 0
    assert disconnect_code(first) == R.SESSION_TAKEN_OVER


def test_session_taken_over_seen_by_paho(broker, raw_mqtt):
    client_id = unique("t")
    first = Paho5(broker.mqtt_port, client_id)
    try:
        first.client.reconnect_delay_set(60, 60)  # do not take it back
        assert connect5(raw_mqtt(broker), client_id).return_code == 0
        assert first.wait_disconnect()[0] == R.SESSION_TAKEN_OVER
    finally:
        first.client.loop_stop()


def test_keep_alive_timeout(broker_factory, raw_mqtt):
    broker = broker_factory(mqtt={"keepalive_grace": 1.0})
    client = raw_mqtt(broker)
    assert connect5(client, unique("k"), keep_alive=1).return_code == 0
    assert disconnect_code(client) == R.KEEP_ALIVE_TIMEOUT


def test_packet_too_large(broker_factory, raw_mqtt):
    broker = broker_factory(mqtt={"max_packet_bytes": 1000})
    client = raw_mqtt(broker)
    assert connect5(client, unique("l")).return_code == 0
    client.send(p.Publish("t/large", b"x" * 2000))
    assert disconnect_code(client) == R.PACKET_TOO_LARGE


def test_receive_maximum_exceeded(broker_factory, raw_mqtt):
    broker = broker_factory(mqtt={"receive_maximum": 2})
    topic = unique("rm")
    # A kept session's QoS 1 subscription: the publishes are stored, so their
    # PUBACKs wait for the disk and count against Receive Maximum.
    keeper = raw_mqtt(broker)
    assert connect5(keeper, unique("keeper"), properties=p.Properties(session_expiry_interval=300)).return_code == 0
    keeper.send(p.Subscribe(1, [(topic, 1)]))
    assert isinstance(keeper.next(), p.SubAck)
    keeper.send(p.Disconnect())
    keeper.wait_closed()

    client = raw_mqtt(broker)
    ack = connect5(client, unique("p"))
    assert ack.properties is not None and ack.properties.receive_maximum == 2
    wire = b"".join(client.codec.send(p.Publish(topic, b"m", 1, packet_id=i)) for i in (1, 2, 3))
    client.send_raw(wire)  # in one write: all three read before the disk answers
    assert disconnect_code(client) == R.RECEIVE_MAXIMUM_EXCEEDED


def test_topic_alias_invalid(broker_factory, raw_mqtt):
    broker = broker_factory(mqtt={"topic_alias_maximum": 4})
    client = raw_mqtt(broker)
    assert connect5(client, unique("a")).return_code == 0
    client.send(p.Publish("t/a", b"m", properties=p.Properties(topic_alias=5)))
    assert disconnect_code(client) == R.TOPIC_ALIAS_INVALID


def test_topic_alias_never_set_is_a_protocol_error(broker, raw_mqtt):
    client = raw_mqtt(broker)
    assert connect5(client, unique("a")).return_code == 0
    client.send(p.Publish("", b"m", properties=p.Properties(topic_alias=1)))
    assert disconnect_code(client) == R.PROTOCOL_ERROR


def test_broker_shutting_down(broker_factory, raw_mqtt):
    broker = broker_factory()
    client = raw_mqtt(broker)
    assert connect5(client, unique("s")).return_code == 0
    broker.stop()
    assert disconnect_code(client) == R.SERVER_SHUTTING_DOWN


def test_malformed_packet(broker, raw_mqtt):
    client = raw_mqtt(broker)
    assert connect5(client, unique("m")).return_code == 0
    # PUBLISH "t" with a property block naming identifier 0x7F (none such).
    client.send_raw(b"\x30\x06\x00\x01t\x01\x7f\x00")
    assert disconnect_code(client) == R.MALFORMED_PACKET


def test_protocol_error(broker, raw_mqtt):
    client = raw_mqtt(broker)
    assert connect5(client, unique("e")).return_code == 0
    # a second CONNECT [MQTT-3.1.0-2]
    client.send_raw(b"\x10\x0e\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x01c")
    assert disconnect_code(client) == R.PROTOCOL_ERROR


def test_a_qos2_resend_awaiting_pubrel_is_not_counted_again(broker_factory, raw_mqtt):
    broker = broker_factory(mqtt={"receive_maximum": 2})
    client = raw_mqtt(broker)
    assert connect5(client, unique("q2")).return_code == 0
    for packet_id in (1, 2):
        client.send(p.Publish("t/q2", b"m", 2, packet_id=packet_id))
        assert client.next() == p.PubRec(packet_id)
    client.send(p.Publish("t/q2", b"m", 2, dup=True, packet_id=1))  # its PUBREC lost, say
    assert client.next() == p.PubRec(1)  # answered again, not 0x93: it is one of the two
    client.send(p.PubRel(1))
    assert client.next() == p.PubComp(1)
    client.send(p.Publish("t/q2", b"m", 2, packet_id=3))
    assert client.next() == p.PubRec(3)


def test_disconnect_cannot_make_a_session_persist(broker, raw_mqtt):
    client = raw_mqtt(broker)
    assert connect5(client, unique("d")).return_code == 0
    client.send(p.Disconnect(properties=p.Properties(session_expiry_interval=60)))
    assert disconnect_code(client) == R.PROTOCOL_ERROR  # [MQTT-3.14.2-2]


def test_a_disconnect_with_an_error_code_keeps_the_will_and_only_0_discards_it(broker, raw_mqtt):
    # [MQTT-3.1.2-8]: only a normal disconnection (0x00) discards the will.
    topic = unique("will")
    watcher = raw_mqtt(broker)
    assert connect5(watcher, unique("w")).return_code == 0
    watcher.send(p.Subscribe(1, [(f"{topic}/#", 0)]))
    assert isinstance(watcher.next(), p.SubAck)
    for code, name in ((R.UNSPECIFIED_ERROR, "error"), (R.SUCCESS, "normal")):
        device = raw_mqtt(broker)
        device.send(p.Connect(unique("d"), protocol_level=5, will=p.Will(f"{topic}/{name}", name.encode())))
        assert device.next().return_code == 0
        device.send(p.Disconnect(code))
        device.wait_closed()
    watcher.send(p.PingReq())  # after the wills the broker publishes at each close
    got = [watcher.next(), watcher.next()]
    assert [type(packet) for packet in got] == [p.Publish, p.PingResp]
    assert got[0].topic == f"{topic}/error"

