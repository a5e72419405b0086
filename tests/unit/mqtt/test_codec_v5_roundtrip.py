"""MQTT 5 packets and properties survive the wire: what one role encodes the
other decodes to an equal packet, every property included, and paho-mqtt's own
v5 property encoder agrees with ours byte for byte."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec import EMPTY_PROPERTIES, MqttConnection, Role, encode_properties
from gateway.mqtt.codec.properties import SPECS, WILL, read_properties
from gateway.mqtt.codec.wire import PT
from tests.support.helpers import splits
from tests.support.mqtt5_codec_helpers import (
    CONNACK5_WIRE,
    SENDS5,
    connected5,
    connects5,
    decode5,
    encode5,
    properties_for,
)
from tests.support.mqtt_codec_helpers import FAST, OTHER

FULL_PUBLISH = p.Properties(
    payload_format_indicator=1, message_expiry_interval=3600, content_type="text/plain", response_topic="re/ply",
    correlation_data=b"\x00id", subscription_identifiers=(1, 268_435_455), topic_alias=3,
    user_properties=(("k", "v"), ("k", "w"), ("\u00e9", "")),
)
FROM_CLIENT5: list[p.Packet] = [
    p.Publish("a/b", b"payload"),
    p.Publish("a/b", b"x" * 300, qos=1, retain=True, packet_id=7,
              properties=p.Properties(message_expiry_interval=5, user_properties=(("a", "b"),))),
    p.Publish("", b"by alias", qos=2, dup=True, packet_id=9, properties=p.Properties(topic_alias=1)),
    p.PubAck(1), p.PubAck(2, 0x10), p.PubAck(3, 0x87, p.Properties(reason_string="no")),
    p.PubRec(4), p.PubRec(5, 0x99), p.PubRel(6), p.PubRel(7, 0x92), p.PubComp(8),
    p.PubComp(9, 0, p.Properties(user_properties=(("a", "b"),))),
    p.Subscribe(10, [("a/+", p.options(1)), ("b/#", p.options(2, no_local=True, retain_as_published=True,
                                                                 retain_handling=2))],
                p.Properties(subscription_identifiers=(42,), user_properties=(("x", "y"),))),
    p.Unsubscribe(11, ["a/+", "b/#"], p.Properties(user_properties=(("x", "y"),))),
    p.PingReq(),
    p.Disconnect(), p.Disconnect(0x04), p.Disconnect(0x80, p.Properties(session_expiry_interval=0, reason_string="bye")),
    p.Auth(), p.Auth(0x19, p.Properties(authentication_method="SCRAM", authentication_data=b"\x01")),
]
FROM_SERVER5: list[p.Packet] = [
    p.Publish("x", b"y", qos=1, packet_id=9, properties=FULL_PUBLISH),
    p.Publish("x/y", b""),
    p.PubAck(1), p.PubRec(2, 0x80), p.PubRel(3), p.PubComp(4, 0x92, p.Properties(reason_string="gone")),
    p.SubAck(5, [0, 1, 2, 0x87, 0x9E], p.Properties(reason_string="partly")),
    p.UnsubAck(6, [0, 0x11]), p.UnsubAck(7, [0x87], p.Properties(user_properties=(("a", "b"),))),
    p.PingResp(),
    p.Disconnect(0x8E), p.Disconnect(0x9C, p.Properties(server_reference="other:1883", reason_string="moved")),
    p.Auth(0x18, p.Properties(authentication_method="SCRAM", authentication_data=b"\x02")),
]


@pytest.mark.parametrize(("role", "packets"), [(Role.CLIENT, FROM_CLIENT5), (Role.SERVER, FROM_SERVER5)])
def test_every_v5_packet_round_trips_and_arrives_in_any_pieces(role: Role, packets: list[p.Packet]) -> None:
    wire = encode5(role, packets)
    assert decode5(OTHER[role], [wire]) == packets
    for chunks in splits(wire):
        assert decode5(OTHER[role], chunks) == packets


@FAST
@given(role=st.sampled_from(list(Role)), data=st.data())
def test_any_v5_packet_round_trips(role: Role, data: st.DataObject) -> None:
    packet = data.draw(SENDS5[role])
    assert decode5(OTHER[role], [encode5(role, [packet])]) == [packet]


@FAST
@given(connect=connects5())
def test_any_v5_connect_round_trips_and_makes_the_server_v5(connect: p.Connect) -> None:
    wire = MqttConnection(Role.CLIENT).send(connect)
    server = MqttConnection(Role.SERVER)
    server.receive_data(wire)
    assert list(server.events()) == [connect]
    assert server.protocol_level == 5


def test_a_v5_connect_with_will_properties() -> None:
    will = p.Will("wills/d", b"gone", 1, True, p.Properties(will_delay_interval=30, payload_format_indicator=1,
                                                            content_type="text/plain", response_topic="r",
                                                            correlation_data=b"c", message_expiry_interval=9,
                                                            user_properties=(("w", "1"),)))
    connect = p.Connect("d", False, 60, None, b"pw-without-user", will, "MQTT", 5,
                        p.Properties(session_expiry_interval=0xFFFF_FFFF, receive_maximum=20, maximum_packet_size=1024,
                                     topic_alias_maximum=5, request_response_information=1,
                                     request_problem_information=0, authentication_method="PLAIN",
                                     authentication_data=b"x", user_properties=(("c", "2"),)))
    server = MqttConnection(Role.SERVER)
    server.receive_data(MqttConnection(Role.CLIENT).send(connect))
    assert list(server.events()) == [connect]


def test_a_v5_connack_with_properties_round_trips() -> None:
    connack = p.ConnAck(True, 0, p.Properties(
        session_expiry_interval=60, receive_maximum=100, maximum_qos=1, retain_available=0, maximum_packet_size=65536,
        assigned_client_identifier="gw-1", topic_alias_maximum=10, reason_string="hi", wildcard_subscription_available=1,
        subscription_identifier_available=1, shared_subscription_available=0, server_keep_alive=30,
        response_information="resp/", server_reference="s", authentication_method="m", authentication_data=b"d",
        user_properties=(("a", "b"),)))
    server = connected5(Role.SERVER)
    client = MqttConnection(Role.CLIENT)
    client.send(p.Connect("c", protocol_level=5))
    client.receive_data(server.send(connack))
    assert list(client.events()) == [connack]
    assert server.send(p.ConnAck(False, 0x84)) == b"\x20\x03\x00\x84\x00"


@pytest.mark.parametrize(
    ("packet", "wire"),
    [
        (p.PubAck(0x102), b"\x40\x02\x01\x02"),  # reason 0, no properties: the 3.1.1 bytes
        (p.PubRec(1, 0x10), b"\x50\x03\x00\x01\x10"),  # a reason, no property length
        (p.PubRel(1, 0, p.Properties(reason_string="r")), b"\x62\x08\x00\x01\x00\x04\x1f\x00\x01r"),
        (p.Disconnect(), b"\xe0\x00"),
        (p.Disconnect(0x8B), b"\xe0\x01\x8b"),
        (p.Auth(), b"\xf0\x00"),
    ],
)
def test_acks_take_their_shortest_form(packet: p.Packet, wire: bytes) -> None:
    assert encode5(Role.SERVER, [packet]) == wire


@pytest.mark.parametrize("kind", [0x40, 0x50, 0x62, 0x70])
def test_an_ack_decodes_in_all_three_forms(kind: int) -> None:
    cls = {0x40: p.PubAck, 0x50: p.PubRec, 0x62: p.PubRel, 0x70: p.PubComp}[kind]
    forms = [bytes((kind, 2, 0, 5)), bytes((kind, 3, 0, 5, 0)), bytes((kind, 4, 0, 5, 0, 0)),
             bytes((kind, 9, 0, 5, 0, 5, 0x26, 0, 0, 0, 0))]
    assert decode5(Role.SERVER, [b"".join(forms)]) == [cls(5), cls(5), cls(5),
                                                        cls(5, 0, p.Properties(user_properties=(("", ""),)))]
    # A DISCONNECT of 1 byte has no property length either (§3.14.2.2.1).
    assert decode5(Role.SERVER, [b"\xe0\x01\x04"]) == [p.Disconnect(0x04)]


def test_a_server_disconnect_with_reason_and_properties_reaches_a_v5_client() -> None:
    packet = p.Disconnect(0x95, p.Properties(reason_string="too big", user_properties=(("limit", "1024"),)))
    client = connected5(Role.CLIENT)
    client.receive_data(connected5(Role.SERVER).send(packet))
    assert list(client.events()) == [packet]


def test_the_v5_tables_follow_the_level_and_3_1_1_stays_as_it_was() -> None:
    client = MqttConnection(Role.CLIENT)
    assert client.send(p.Connect("c")) == b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x00\x00\x01c"
    assert client.protocol_level == 4
    assert client.send(p.PubAck(1)) == b"\x40\x02\x00\x01"
    v5 = MqttConnection(Role.CLIENT)
    v5.send(p.Connect("c", protocol_level=5))
    v5.receive_data(CONNACK5_WIRE)
    assert list(v5.events()) == [p.ConnAck(False, 0)]
    assert v5.send(p.Subscribe(1, [("a", 1)])) == b"\x82\x07\x00\x01\x00\x00\x01a\x01"  # a property length 0


# -- every property, against paho-mqtt's v5 encoder ------------------------------------

_PAHO_NAMES = {"subscription_identifiers": "Subscription Identifier", "user_properties": "User Property",
               "maximum_qos": "Maximum QoS"}
_PAHO_TYPES = {PT.CONNECT: PacketTypes.CONNECT, PT.CONNACK: PacketTypes.CONNACK, PT.PUBLISH: PacketTypes.PUBLISH,
               PT.PUBACK: PacketTypes.PUBACK, PT.SUBSCRIBE: PacketTypes.SUBSCRIBE, PT.DISCONNECT: PacketTypes.DISCONNECT,
               PT.AUTH: PacketTypes.AUTH, WILL: PacketTypes.WILLMESSAGE, PT.SUBACK: PacketTypes.SUBACK,
               PT.UNSUBSCRIBE: PacketTypes.UNSUBSCRIBE, PT.UNSUBACK: PacketTypes.UNSUBACK,
               PT.PUBREC: PacketTypes.PUBREC, PT.PUBREL: PacketTypes.PUBREL, PT.PUBCOMP: PacketTypes.PUBCOMP}


def paho_name(attr: str) -> str:
    """paho's name of a property, as in the spec's table."""
    return _PAHO_NAMES.get(attr) or " ".join(word.capitalize() for word in attr.split("_"))


@pytest.mark.parametrize("ident", sorted(SPECS))
def test_every_property_has_paho_s_identifier_and_packets(ident: int) -> None:
    spec = SPECS[ident]
    paho = PahoProperties(PacketTypes.PUBLISH)
    assert paho.names[paho_name(spec.attr)] == ident
    assert {_PAHO_TYPES[where] for where in spec.where} == set(paho.properties[ident][1])


@FAST
@given(where=st.sampled_from(sorted(_PAHO_TYPES, key=str)), data=st.data())
def test_any_properties_encode_as_paho_does_and_read_back(where: PT | str, data: st.DataObject) -> None:
    props = data.draw(properties_for(where, role=Role.SERVER))
    if props is not None and props.maximum_packet_size is not None:
        props.maximum_packet_size = min(props.maximum_packet_size, 268_435_455)  # paho's own limit
    ours = encode_properties(props, where)
    paho = PahoProperties(_PAHO_TYPES[where])
    for spec in SPECS.values():
        value = getattr(props, spec.attr) if props is not None else None
        for item in (value if spec.repeats else (value,)) if value is not None else ():
            setattr(paho, paho_name(spec.attr).replace(" ", ""), item)  # paho appends repeats
    assert ours == paho.pack()
    assert read_properties(ours, 0, len(ours), where) == (props, len(ours))


def test_no_properties_is_one_zero_byte() -> None:
    assert encode_properties(None) == EMPTY_PROPERTIES == b"\x00"
    assert encode_properties(p.Properties(), PT.CONNECT) == b"\x00"
    assert read_properties(b"\x00", 0, 1, PT.PUBLISH) == (None, 1)
