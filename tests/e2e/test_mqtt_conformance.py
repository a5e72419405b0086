"""Protocol rules Eclipse Mosquitto's broker tests found broken (issue 29),
each through a raw socket as the misbehaving or unusual client sends it:
filters too long for the broker, an empty UNSUBSCRIBE filter, a refusing v5
PUBREC, the client's Maximum Packet Size on CONNACK and DISCONNECT, and
MQTT 3.1's client id and DUP on PUBREL."""

from __future__ import annotations

import socket
import time

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec.reasons import ReasonCode as R
from tests.support.helpers import TIMEOUT, unique
from tests.support.mqtt5_helpers import connect5, disconnect_code, until_closed

# Over the 1,024 characters a core name may have, as one level and as 600 levels.
LONG_FILTERS = ("a" * 1100, "a/" * 600 + "x")


def _connect(client, version: int, client_id: str = "", **connect):
    if version == 5:
        return connect5(client, client_id, **connect)
    client.send(p.Connect(client_id or unique("c"), protocol_level=4, **connect))
    ack = client.next()
    assert isinstance(ack, p.ConnAck) and ack.return_code == 0, ack
    return ack


def _ping(client) -> None:
    """The connection still answers (and anything sent before came first)."""
    client.send(p.PingReq())
    assert isinstance(client.next(), p.PingResp)


def test_a_filter_too_long_for_the_broker_is_refused_alone(broker, raw_mqtt):
    # [MQTT-3.8.4-1]: a SUBACK, whose code refuses the long filters only; the
    # others in the packet are granted and deliver (it was an internal error
    # that closed the connection with no SUBACK).
    for version, refused in ((4, p.SUBACK_FAILURE), (5, R.TOPIC_FILTER_INVALID)):
        topic = unique("ok")
        client = raw_mqtt(broker)
        _connect(client, version)
        client.send(p.Subscribe(1, [(LONG_FILTERS[0], 1), (topic, 1), (LONG_FILTERS[1], 0),
                                    ("$share/g/" + LONG_FILTERS[1], 1)]))
        ack = client.next()
        assert isinstance(ack, p.SubAck), ack
        assert ack.return_codes == [refused, 1, refused, refused]
        client.send(p.Publish(topic, b"still served", qos=1, packet_id=7))
        got = [client.next(), client.next()]
        assert any(isinstance(x, p.Publish) and x.payload == b"still served" for x in got), got
        _ping(client)


def test_an_empty_unsubscribe_filter_is_a_protocol_error(broker, raw_mqtt):
    # [MQTT-4.7.3-1]: a filter is at least one character; an empty one is no
    # filter that matched nothing (it was answered "no subscription existed").
    v5 = raw_mqtt(broker)
    connect5(v5, unique("c"))
    v5.send(p.Unsubscribe(1, ["x", ""]))
    assert disconnect_code(v5) == R.PROTOCOL_ERROR
    v3 = raw_mqtt(broker)
    _connect(v3, 4)
    v3.send(p.Unsubscribe(1, [""]))
    assert not any(isinstance(x, p.UnsubAck) for x in until_closed(v3))


def test_a_v5_unsubscribe_of_an_invalid_filter_says_so(broker, raw_mqtt):
    client = raw_mqtt(broker)
    connect5(client, unique("c"))
    client.send(p.Unsubscribe(1, ["a/#/b", "never/subscribed"]))
    ack = client.next()
    assert isinstance(ack, p.UnsubAck) and ack.reason_codes == [R.TOPIC_FILTER_INVALID, R.NO_SUBSCRIPTION_EXISTED]


def test_a_refusing_pubrec_ends_the_qos2_exchange(broker, raw_mqtt):
    # [MQTT-4.3.3-4]: after a PUBREC >= 0x80 the server sends no PUBREL, and
    # the packet id is free: with Receive Maximum 1 the next message comes.
    topic = unique("rec")
    sub = raw_mqtt(broker)
    connect5(sub, unique("s"), properties=p.Properties(receive_maximum=1))
    sub.send(p.Subscribe(1, [(topic, 2)]))
    assert isinstance(sub.next(), p.SubAck)
    pub = raw_mqtt(broker)
    connect5(pub, unique("p"))
    pub.send(p.Publish(topic, b"first", qos=2, packet_id=1))
    assert isinstance(pub.next(), p.PubRec)
    pub.send(p.PubRel(1))
    assert isinstance(pub.next(), p.PubComp)
    first = sub.next()
    assert isinstance(first, p.Publish) and first.payload == b"first" and first.qos == 2
    sub.send(p.PubRec(first.packet_id, R.IMPLEMENTATION_SPECIFIC_ERROR))
    _ping(sub)  # a PUBREL would have come before the PINGRESP
    pub.send(p.Publish(topic, b"second", qos=2, packet_id=2))
    assert isinstance(pub.next(), p.PubRec)
    second = sub.next()
    assert isinstance(second, p.Publish) and second.payload == b"second", second


def _read_packet(sock: socket.socket) -> bytes:
    """One whole packet's bytes, as they came on the wire."""
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, f"closed after {data!r}"
            data += chunk
        return data

    head = exactly(1)
    length, shift = 0, 0
    while True:
        byte = exactly(1)
        head += byte
        length |= (byte[0] & 0x7F) << shift
        shift += 7
        if byte[0] < 0x80:
            return head + exactly(length)


def test_connack_and_disconnect_keep_the_clients_maximum_packet_size(broker, raw_mqtt):
    # [MQTT-3.1.2-24]: nothing larger than the client takes, CONNACK included
    # (it was sent whole, 24 bytes and more, whatever the client said);
    # a DISCONNECT loses its Reason String first [MQTT-3.1.2-25].
    for limit in (20, 10):
        client = raw_mqtt(broker)
        client.send(p.Connect(unique("m"), protocol_level=5, properties=p.Properties(maximum_packet_size=limit)))
        connack = _read_packet(client.sock)
        assert len(connack) <= limit, connack
        client.codec.receive_data(connack)
        ack = list(client.codec.events())[0]
        assert isinstance(ack, p.ConnAck) and ack.return_code == 0
        assert ack.properties is not None and ack.properties.receive_maximum == broker.config.mqtt.receive_maximum
        client.send(p.Publish(LONG_FILTERS[0], b"x"))  # a topic too long: DISCONNECT 0x90 and a reason
        disconnect = _read_packet(client.sock)
        assert len(disconnect) <= limit, disconnect
        assert disconnect[0] == 0xE0 and disconnect[2] == R.TOPIC_NAME_INVALID


def test_a_connack_that_cannot_fit_is_not_sent(broker, raw_mqtt):
    # An assigned client id alone is longer than 8 bytes: no CONNACK may go,
    # so the connection ends without one.
    client = raw_mqtt(broker)
    client.send(p.Connect("", protocol_level=5, properties=p.Properties(maximum_packet_size=8)))
    assert until_closed(client) == []


def test_mqtt31_refuses_an_empty_client_id(broker, raw_mqtt):
    # 3.1 has no assigned ids: CONNACK 0x02 Identifier rejected (it was accepted).
    client = raw_mqtt(broker)
    client.send(p.Connect("", protocol_name="MQIsdp", protocol_level=3))
    assert until_closed(client) == [p.ConnAck(False, p.IDENTIFIER_REJECTED)]


def test_mqtt31_takes_a_resent_pubrel_with_dup(broker, raw_mqtt):
    # 3.1 sets DUP on a resent PUBREL (first byte 0x6A); 3.1.1 fixed the flags.
    # It was closed as malformed.
    client = raw_mqtt(broker)
    client.send(p.Connect(unique("c31"), protocol_name="MQIsdp", protocol_level=3))
    assert client.next() == p.ConnAck(False, 0)
    client.send(p.Publish(unique("t"), b"x", qos=2, packet_id=5))
    assert client.next() == p.PubRec(5)
    client.send_raw(bytes((0x6A, 2, 0, 5)))
    assert client.next(TIMEOUT) == p.PubComp(5)
    client.send_raw(bytes((0x6A, 2, 0, 5)))  # and again: answered again
    assert client.next() == p.PubComp(5)
    _ping(client)
    deadline = time.monotonic() + 0.2
    while time.monotonic() < deadline and not client.eof:
        client.pump(0.05)
    assert not client.eof
