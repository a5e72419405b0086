"""What one MQTT 5 packet may make the broker do, through the door an
attacker uses (a raw socket): a PUBLISH past the property limits, even one
of 4 MiB of User Properties, is answered with DISCONNECT 0x95 and closed; a
CONNECT past the preconnect limits, without credentials, with CONNACK 0x95;
a SUBSCRIBE past the topic filter limit closes the connection (v5: after
DISCONNECT 0x95); one packet at the limits passes whole; and another client
is served meanwhile.  (Parsing was quadratic: the 4 MiB flood held the loop for
minutes.  How long a round trip takes under a flood is measured in
benchmarks/mqtt_properties.py, not asserted here.)"""

from __future__ import annotations

from paho.mqtt.packettypes import PacketTypes

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec.wire import remaining_length
from tests.support.helpers import unique
from tests.support.mqtt5_helpers import Paho5, connect5, disconnect_code, props

PACKET_TOO_LARGE = 0x95
# Generous on a loaded machine, and far shorter than the unfixed broker took
# for FLOOD (minutes; a 234 KiB one froze it for 13-42 s).
DEADLINE = 10.0
TINY = b"\x26\x00\x01k\x00\x01v"  # a User Property ("k", "v"): 7 bytes
FLOOD = TINY * 580_000  # 4,060,000 bytes of properties: a PUBLISH within max_packet_bytes (4 MiB)


def user(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return b"\x26" + len(raw_name).to_bytes(2, "big") + raw_name + len(raw_value).to_bytes(2, "big") + raw_value


def publish_wire(topic: str, items: bytes, payload: bytes = b"x") -> bytes:
    """A QoS 0 PUBLISH with the property items ``items``, made by hand."""
    name = topic.encode()
    body = len(name).to_bytes(2, "big") + name + remaining_length(len(items)) + items + payload
    return b"\x30" + remaining_length(len(body)) + body


def connect_wire(items: bytes, will_items: bytes | None = None) -> bytes:
    """A v5 CONNECT without user name or password, made by hand."""
    flags = 0x02 | (0x04 if will_items is not None else 0)
    body = b"\x00\x04MQTT\x05" + bytes((flags,)) + b"\x00\x3c" + remaining_length(len(items)) + items
    body += b"\x00\x00"  # an empty client id: the broker assigns one
    if will_items is not None:
        body += remaining_length(len(will_items)) + will_items + b"\x00\x04will" + b"\x00\x00"
    return b"\x10" + remaining_length(len(body)) + body


def round_trip(client: Paho5, topic: str, n: int) -> None:
    """``client`` publishes to ``topic`` (which it subscribes to) and gets it
    back, within DEADLINE: the broker serves it."""
    client.publish(topic, f"calm {n}".encode(), 1)
    assert client.wait(n, DEADLINE)[-1].payload == f"calm {n}".encode()


def rejections(err: str) -> list[str]:
    return [line for line in err.splitlines() if "packet_rejected" in line]


def test_a_publish_past_the_property_limits_is_disconnected_with_0x95_while_others_are_served(
        broker_factory, raw_mqtt, capfd):
    broker = broker_factory()  # started here, so its log goes to this test's capture
    calm = unique("calm")
    flooded = unique("flooded")
    bystander = Paho5(broker.mqtt_port, unique("bystander"))
    try:
        assert bystander.subscribe(calm, 1) == [1]
        watcher = Paho5(broker.mqtt_port, unique("watcher"))
        assert watcher.subscribe(flooded, 0) == [0]
        attacker = raw_mqtt(broker)
        assert connect5(attacker, unique("attacker")).return_code == 0

        # At both limits (1,024 properties, 65,536 bytes of User Property names
        # and values): delivered whole, in order.
        pairs = [(f"{i % 10}", "v" * 63) for i in range(1022)] + [("z", "w" * 127)]
        assert sum(len(k) + len(v) for k, v in pairs) == 65536
        at_limits = b"".join(user(k, v) for k, v in pairs) + b"\x03\x00\x04text"  # and a Content Type
        attacker.send_raw(publish_wire(flooded, at_limits))
        got = watcher.wait(1, DEADLINE)[0].properties
        assert got.UserProperty == pairs and got.ContentType == "text"
        round_trip(bystander, calm, 1)
        capfd.readouterr()

        # 4 MiB of User Properties: refused once 1,024 are read.
        attacker.send_raw(publish_wire(flooded, FLOOD))
        round_trip(bystander, calm, 2)
        assert disconnect_code(attacker) == PACKET_TOO_LARGE

        # One more byte of User Property than allowed, in two properties.
        second = raw_mqtt(broker)
        assert connect5(second, unique("attacker")).return_code == 0
        second.send_raw(publish_wire(flooded, user("a", "v" * 40_000) + user("b", "v" * 25_535)))
        assert disconnect_code(second) == PACKET_TOO_LARGE
        round_trip(bystander, calm, 3)
        assert len(watcher.messages) == 1  # neither refused PUBLISH was routed
        watcher.close()
    finally:
        bystander.close()
    lines = rejections(capfd.readouterr().err)
    assert len(lines) == 2, lines  # once each, naming the connection, the packet and the limit
    assert all("conn_id=" in line for line in lines)
    assert "PUBLISH with more than 1024 properties" in lines[0]
    assert "PUBLISH with more than 65536 bytes of user properties" in lines[1]


def test_a_connect_past_the_preconnect_limits_gets_connack_0x95_while_others_are_served(
        broker_factory, raw_mqtt, capfd):
    broker = broker_factory()
    calm = unique("calm")
    # A client's CONNECT and will with User Properties of their own, within the limits.
    bystander = Paho5(broker.mqtt_port, unique("bystander"), connect_properties=props(
        PacketTypes.CONNECT, UserProperty=[("site", "north"), ("rack", "7")] * 10))
    try:
        assert bystander.connack[1] == 0
        assert bystander.subscribe(calm, 1) == [1]
        capfd.readouterr()
        # Without credentials: a 59 KiB CONNECT of User Properties (8,600 of
        # them), another with them in its will, and one just past the count.
        attackers = []
        for wire in (connect_wire(TINY * 8600), connect_wire(b"", TINY * 8600),
                     connect_wire(TINY * 40, TINY * 25)):
            attacker = raw_mqtt(broker)
            attacker.send_raw(wire)
            attacker.codec.protocol_level = 5  # what it sent by hand: a v5 CONNACK comes back
            attackers.append(attacker)
        round_trip(bystander, calm, 1)
        for attacker in attackers:
            ack = attacker.next(DEADLINE)
            assert isinstance(ack, p.ConnAck) and ack.return_code == PACKET_TOO_LARGE, ack
            attacker.wait_closed()
        # At the limits (64 properties, 8,192 bytes of User Properties): accepted.
        accepted = raw_mqtt(broker)
        accepted.send_raw(connect_wire(user("k", "v" * 7900) + TINY * 40, TINY * 22 + user("z", "v" * 166)))
        accepted.codec.protocol_level = 5
        ack = accepted.next(DEADLINE)
        assert isinstance(ack, p.ConnAck) and ack.return_code == 0, ack
        round_trip(bystander, calm, 2)
    finally:
        bystander.close()
    lines = rejections(capfd.readouterr().err)
    assert len(lines) == 3, lines  # one each
    assert all("CONNECT with more than 64 properties" in line and "conn_id=" in line for line in lines)


def subscribe_wire(n: int, level: int) -> bytes:
    """A SUBSCRIBE of ``n`` distinct filters, made by hand."""
    filters = b"".join(len(f).to_bytes(2, "big") + f + b"\x01" for f in (f"many/{i}".encode() for i in range(n)))
    body = b"\x00\x01" + (b"\x00" if level == 5 else b"") + filters
    return b"\x82" + remaining_length(len(body)) + body


def test_a_subscribe_past_the_filter_limit_closes_the_connection_while_others_are_served(
        broker_factory, raw_mqtt, capfd):
    broker = broker_factory()
    calm = unique("calm")
    bystander = Paho5(broker.mqtt_port, unique("bystander"))
    try:
        assert bystander.subscribe(calm, 1) == [1]
        capfd.readouterr()
        # At the limit (1,024; 1,000 subscriptions per client): answered, a code per filter.
        at_limit = raw_mqtt(broker)
        assert connect5(at_limit, unique("many")).return_code == 0
        at_limit.send_raw(subscribe_wire(1024, 5))
        suback = at_limit.next(DEADLINE)
        assert isinstance(suback, p.SubAck) and suback.return_codes == [1] * 1000 + [0x97] * 24
        # A million filters in 8 MiB would have been read whole (about 3 s of
        # the loop per 1 MB); one past the limit ends the connection.
        v5 = raw_mqtt(broker)
        assert connect5(v5, unique("many")).return_code == 0
        v5.send_raw(subscribe_wire(100_000, 5))
        v311 = raw_mqtt(broker, unique("many"))  # 3.1.1: no DISCONNECT to send, the close is the answer
        v311.send_raw(subscribe_wire(100_000, 4))
        round_trip(bystander, calm, 1)
        assert disconnect_code(v5) == PACKET_TOO_LARGE
        v311.wait_closed(DEADLINE)
        assert not v311.packets  # no SUBACK
    finally:
        bystander.close()
    lines = rejections(capfd.readouterr().err)
    assert len(lines) == 2 and all("SUBSCRIBE with more than 1024 topic filters" in line for line in lines), lines
