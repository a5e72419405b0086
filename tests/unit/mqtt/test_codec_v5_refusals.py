"""What an MQTT 5 connection refuses, and with which reason code: malformed
properties (0x81), properties the spec calls a Protocol Error (0x82), invalid
reason codes, subscription options, the packet size (0x95), a CONNECT broken
after its level (answered with a v5 CONNACK) or of a level we do not speak
(answered as 3.1.1); and what it refuses to send (LocalProtocolError)."""

from __future__ import annotations

import pytest

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec import LocalProtocolError, MqttConnection, RemoteProtocolError, Role, State
from tests.support.mqtt5_codec_helpers import block, connected5, decode5, encode5, frame, refused5
from tests.support.mqtt_codec_helpers import refused

MALFORMED, PROTOCOL_ERROR = 0x81, 0x82


def publish(props: bytes, topic: bytes = b"\x00\x01t", qos: int = 0) -> bytes:
    return frame(0x30 | qos << 1, topic + (b"\x00\x01" if qos else b"") + props + b"payload")


@pytest.mark.parametrize(
    ("props", "reason"),
    [
        (block(b"\x05\x00"), MALFORMED),  # unknown identifier (v5 §2.2.2.2)
        (block(b"\x80\x01\x00"), MALFORMED),  # an identifier of two bytes: none is defined
        (block(b"\x11\x00\x00\x00\x01"), MALFORMED),  # session expiry: not a PUBLISH's
        (block(b"\x18\x00\x00\x00\x01"), MALFORMED),  # will delay: only in will properties
        (block(b"\x02\x00\x00\x00\x01\x02\x00\x00\x00\x02"), PROTOCOL_ERROR),  # message expiry twice
        (block(b"\x23\x00\x01\x23\x00\x02"), PROTOCOL_ERROR),  # topic alias twice
        (block(b"\x01\x02"), PROTOCOL_ERROR),  # payload format indicator 2
        (block(b"\x23\x00\x00"), PROTOCOL_ERROR),  # topic alias 0 [MQTT-3.3.2-8]
        (block(b"\x02\x00\x00"), MALFORMED),  # a four-byte integer cut short by the block's end
        (block(b"\x03\x00\x05ab"), MALFORMED),  # a string past the block
        (block(b"\x03\x00\x02\xc3\x28"), MALFORMED),  # not UTF-8 [MQTT-1.5.4-1]
        (block(b"\x08\x00\x01\x00"), MALFORMED),  # U+0000 [MQTT-1.5.4-2]
        (block(b"\x26\x00\x01a"), MALFORMED),  # a user property without its value
        (block(b"\x08\x00\x03a/#"), PROTOCOL_ERROR),  # a response topic with a wildcard [MQTT-3.3.2-14]
        (b"\x7f", MALFORMED),  # a property length past the packet
        (b"\xff\xff\xff\xff\x01", MALFORMED),  # a property length of five bytes (v5 §1.5.5)
    ],
)
def test_bad_properties_in_a_publish_are_refused_with_their_reason(props: bytes, reason: int) -> None:
    error = refused5(Role.SERVER, publish(props))
    assert error.reason_code == reason
    assert refused5(Role.SERVER, publish(props, qos=1)).reason_code == reason  # on the general path too


def test_repeatable_properties_repeat_and_keep_their_order() -> None:
    props = block(b"\x26\x00\x01k\x00\x011", b"\x26\x00\x01k\x00\x012", b"\x0b\x01", b"\x0b\x80\x01")
    (packet,) = decode5(Role.CLIENT, [publish(props)])  # subscription identifiers come to a subscriber
    assert packet.properties == p.Properties(user_properties=(("k", "1"), ("k", "2")), subscription_identifiers=(1, 128))


def test_a_client_may_not_send_a_subscription_identifier_in_a_publish() -> None:
    assert refused5(Role.SERVER, publish(block(b"\x0b\x01"))).reason_code == PROTOCOL_ERROR  # [MQTT-3.3.4-6]
    with pytest.raises(LocalProtocolError):
        encode5(Role.CLIENT, [p.Publish("t", b"", properties=p.Properties(subscription_identifiers=(1,)))])


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        (frame(0x82, b"\x00\x01" + block(b"\x0b\x00") + b"\x00\x01a\x00"), PROTOCOL_ERROR),  # subscription id 0
        (frame(0x82, b"\x00\x01" + block(b"\x0b\x01\x0b\x02") + b"\x00\x01a\x00"), PROTOCOL_ERROR),  # two ids
        (frame(0x82, b"\x00\x01" + block(b"\x0b\xff\xff\xff\xff\x01") + b"\x00\x01a\x00"), MALFORMED),  # 5-byte VBI
        (frame(0x82, b"\x00\x01\x00\x00\x01a\x40"), MALFORMED),  # reserved option bits [MQTT-3.8.3-5]
        (frame(0x82, b"\x00\x01\x00\x00\x01a\x03"), MALFORMED),  # QoS 3
        (frame(0x82, b"\x00\x01\x00\x00\x01a\x30"), PROTOCOL_ERROR),  # retain handling 3 (§3.8.3.1)
        (frame(0x82, b"\x00\x01\x00"), PROTOCOL_ERROR),  # no topic filter [MQTT-3.8.3-2]
        (frame(0xA2, b"\x00\x01\x00"), PROTOCOL_ERROR),  # no topic filter [MQTT-3.10.3-2]
        (frame(0xA2, b"\x00\x01" + block(b"\x1f\x00\x00") + b"\x00\x01a"), MALFORMED),  # reason string: not here
        (frame(0xE0, b"\x8e"), PROTOCOL_ERROR),  # session taken over: the server's reason (§3.14.2.1)
        (frame(0xE0, b"\x19"), MALFORMED),  # not a DISCONNECT reason [MQTT-3.14.2-1]
        (frame(0xE0, b"\x00" + block(b"\x11\x00\x00\x00\x01", b"\x11\x00\x00\x00\x02")), PROTOCOL_ERROR),
        (frame(0xF0, b"\x18\x00"), PROTOCOL_ERROR),  # AUTH without a method (§3.15.2.2.2)
        (frame(0xF0, b"\x18"), MALFORMED),  # a reason without a property length
        (frame(0xF0, b"\x80" + block(b"\x15\x00\x01m")), MALFORMED),  # not an AUTH reason [MQTT-3.15.2-1]
        (frame(0xF0, b"\x18" + block(b"\x21\x00\x01")), MALFORMED),  # receive maximum: not an AUTH's
        (frame(0x40, b"\x00\x01\x01"), MALFORMED),  # PUBACK "granted QoS 1" [MQTT-3.4.2-1]
        (frame(0x50, b"\x00\x01\x92"), MALFORMED),  # PUBREC "packet identifier not found"
        (frame(0x62, b"\x00\x01\x10"), MALFORMED),  # PUBREL "no matching subscribers"
        (frame(0x70, b"\x00\x01\x80"), MALFORMED),  # PUBCOMP "unspecified error"
        (frame(0x40, b"\x00\x01\x00\x05"), MALFORMED),  # a property length past the packet
        (frame(0x40, b"\x00\x01\x00\x00\x00"), MALFORMED),  # a byte after the properties
        (frame(0x40, b"\x00\x01\x00" + block(b"\x1f\x00\x01r", b"\x1f\x00\x01s")), PROTOCOL_ERROR),  # reason twice
        (frame(0x40, b"\x00\x00"), MALFORMED),  # packet identifier 0
        (frame(0xC0, b"\x00"), MALFORMED),  # PINGREQ has no body
    ],
)
def test_client_packets_are_refused_with_their_reason(wire: bytes, reason: int) -> None:
    assert refused5(Role.SERVER, wire).reason_code == reason


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        (frame(0x90, b"\x00\x01" + b"\x00" + b"\x04"), MALFORMED),  # SUBACK reason 0x04
        (frame(0x90, b"\x00\x01\x00"), PROTOCOL_ERROR),  # SUBACK without reason codes
        (frame(0xB0, b"\x00\x01\x00\x92"), MALFORMED),  # UNSUBACK "packet identifier not found"
        (frame(0xB0, b"\x00\x01\x00"), PROTOCOL_ERROR),  # UNSUBACK without reason codes
        (frame(0xE0, b"\x04"), PROTOCOL_ERROR),  # "with will": the client's reason
        (frame(0xE0, b"\x00" + block(b"\x11\x00\x00\x00\x01")), PROTOCOL_ERROR),  # session expiry [MQTT-3.14.2-2]
        (frame(0xE0, b"\x00" + block(b"\x21\x00\x01")), MALFORMED),  # receive maximum: not a DISCONNECT's
        (frame(0x20, b"\x00\x00\x00"), PROTOCOL_ERROR),  # a second CONNACK [MQTT-3.2.0-1]
    ],
)
def test_server_packets_are_refused_with_their_reason(wire: bytes, reason: int) -> None:
    assert refused5(Role.CLIENT, wire).reason_code == reason


@pytest.mark.parametrize(
    ("props", "reason"),
    [
        (block(b"\x21\x00\x00"), PROTOCOL_ERROR),  # receive maximum 0 (§3.1.2.11.3)
        (block(b"\x27\x00\x00\x00\x00"), PROTOCOL_ERROR),  # maximum packet size 0 (§3.1.2.11.4)
        (block(b"\x17\x02"), PROTOCOL_ERROR),  # request problem information 2
        (block(b"\x19\x02"), PROTOCOL_ERROR),  # request response information 2
        (block(b"\x11\x00\x00\x00\x01\x11\x00\x00\x00\x01"), PROTOCOL_ERROR),  # session expiry twice
        (block(b"\x16\x00\x01d"), PROTOCOL_ERROR),  # authentication data without a method
        (block(b"\x23\x00\x01"), MALFORMED),  # topic alias: a PUBLISH's, not a CONNECT's
        (block(b"\x24\x01"), MALFORMED),  # maximum QoS: the server's
        (b"\x05\x26\x00\x01a", MALFORMED),  # a user property cut short
    ],
)
def test_a_v5_connect_broken_after_its_level_is_answered_in_v5(props: bytes, reason: int) -> None:
    wire = frame(0x10, b"\x00\x04MQTT\x05\x02\x00\x3c" + props + b"\x00\x01c")
    conn = MqttConnection(Role.SERVER)
    conn.receive_data(wire)
    with pytest.raises(RemoteProtocolError) as caught:
        list(conn.events())
    assert caught.value.reason_code == reason and caught.value.return_code is None
    assert conn.protocol_level == 5 and conn.state is State.ERROR
    assert conn.send(p.ConnAck(False, reason)) == bytes((0x20, 3, 0, reason, 0))  # the v5 CONNACK


@pytest.mark.parametrize(
    ("rest", "reason"),
    [
        (b"\x03\x00\x3c\x00\x00\x01c", MALFORMED),  # reserved flag [MQTT-3.1.2-3]
        (b"\x1e\x00\x3c\x00\x00\x01c\x00\x00\x01t\x00\x00", MALFORMED),  # will QoS 3 [MQTT-3.1.2-12]
        (b"\x0a\x00\x3c\x00\x00\x01c", MALFORMED),  # will QoS without a will [MQTT-3.1.2-11]
        (b"\x06\x00\x3c\x00\x00\x01c\x00\x00\x01#\x00\x00", 0x90),  # will topic with a wildcard
        (b"\x06\x00\x3c\x00\x00\x01c" + block(b"\x23\x00\x01") + b"\x00\x01t\x00\x00", MALFORMED),  # alias in a will
        (b"\x06\x00\x3c\x00\x00\x01c" + block(b"\x18\x00\x00\x00\x01") * 1, None),  # will without its topic
        (b"\x82\x00\x3c\x00\x00\x01c", MALFORMED),  # user name flag without a user name
    ],
)
def test_v5_connect_flags_and_will(rest: bytes, reason: int | None) -> None:
    conn = MqttConnection(Role.SERVER)
    conn.receive_data(frame(0x10, b"\x00\x04MQTT\x05" + rest))
    with pytest.raises(RemoteProtocolError) as caught:
        list(conn.events())
    assert caught.value.reason_code == (MALFORMED if reason is None else reason)


def test_v5_allows_a_password_without_a_user_name() -> None:
    conn = MqttConnection(Role.SERVER)
    conn.receive_data(frame(0x10, b"\x00\x04MQTT\x05\x42\x00\x3c\x00\x00\x01c\x00\x02pw"))
    assert list(conn.events()) == [p.Connect("c", True, 60, None, b"pw", None, "MQTT", 5)]


def test_a_level_we_do_not_speak_is_answered_as_3_1_1() -> None:
    error = refused(Role.SERVER, frame(0x10, b"\x00\x04MQTT\x06\x02\x00\x3c\x00\x01c"), opened=False)
    assert error.return_code == p.UNACCEPTABLE_PROTOCOL_VERSION and error.reason_code == 0x84
    conn = MqttConnection(Role.SERVER)
    assert conn.protocol_level == 4
    assert conn.send(p.ConnAck(False, p.UNACCEPTABLE_PROTOCOL_VERSION)) == b"\x20\x02\x00\x01"


def test_an_oversize_packet_on_v5_is_0x95_and_errors_stay_with_their_reason() -> None:
    conn = connected5(Role.SERVER)
    conn.max_packet_bytes = 10
    conn.receive_data(b"\x30\x0b")
    for _ in range(2):  # sticky, reason and all
        with pytest.raises(RemoteProtocolError) as caught:
            list(conn.events())
        assert caught.value.reason_code == 0x95


def test_a_v5_connect_too_large_to_read_is_still_answered_in_v5() -> None:
    conn = MqttConnection(Role.SERVER, max_packet_bytes=100)
    conn.receive_data(b"\x10\xc8\x01\x00\x04MQTT\x05\x02")  # 200 bytes announced, 10 of them here
    with pytest.raises(RemoteProtocolError) as caught:
        list(conn.events())
    assert caught.value.reason_code == 0x95 and conn.protocol_level == 5
    assert conn.send(p.ConnAck(False, 0x95)) == b"\x20\x03\x00\x95\x00"
    v311 = MqttConnection(Role.SERVER, max_packet_bytes=100)
    v311.receive_data(b"\x10\xc8\x01\x00\x04MQTT\x04\x02")
    with pytest.raises(RemoteProtocolError):
        list(v311.events())
    assert v311.protocol_level == 4


def test_a_second_connect_is_a_protocol_error() -> None:
    assert refused5(Role.SERVER, frame(0x10, b"\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x01c")).reason_code == PROTOCOL_ERROR


def test_auth_and_a_server_disconnect_exist_only_in_v5() -> None:
    assert refused(Role.SERVER, b"\xf0\x00").message == "reserved packet type 15"  # 3.1.1 [MQTT-2.2.1]
    assert refused(Role.CLIENT, b"\xe0\x00").message == "unexpected DISCONNECT from this peer"
    assert decode5(Role.SERVER, [b"\xf0\x00"]) == [p.Auth()]
    assert decode5(Role.CLIENT, [b"\xe0\x00"]) == [p.Disconnect()]
    with pytest.raises(LocalProtocolError):
        MqttConnection(Role.SERVER).send(p.Auth())
    client = MqttConnection(Role.CLIENT)
    client.send(p.Connect("c", protocol_level=5))
    client.receive_data(b"\xf0\x00\x20\x03\x00\x00\x00")  # AUTH may come before CONNACK (v5 §4.12)
    assert list(client.events()) == [p.Auth(), p.ConnAck(False, 0)]


@pytest.mark.parametrize(
    ("role", "packet"),
    [
        (Role.SERVER, p.ConnAck(False, 0x01)),  # a 3.1.1 return code, not a v5 reason
        (Role.SERVER, p.ConnAck(True, 0x87)),  # session present on a refusal [MQTT-3.2.2-6]
        (Role.SERVER, p.PubAck(1, 0x01)),
        (Role.SERVER, p.PubRel(1, 0x10)),
        (Role.SERVER, p.SubAck(1, [0x04])),
        (Role.SERVER, p.SubAck(1, [])),
        (Role.SERVER, p.UnsubAck(1)),  # v5 needs a reason per filter [MQTT-3.11.3-1]
        (Role.SERVER, p.Disconnect(0x04)),  # the client's reason
        (Role.SERVER, p.Disconnect(0, p.Properties(session_expiry_interval=1))),  # [MQTT-3.14.2-2]
        (Role.CLIENT, p.Disconnect(0x8E)),  # the server's reason
        (Role.CLIENT, p.Auth(0x18)),  # AUTH needs a method
        (Role.CLIENT, p.Auth(0x80, p.Properties(authentication_method="m"))),
        (Role.CLIENT, p.Subscribe(1, [("a", 0x30)])),  # retain handling 3
        (Role.CLIENT, p.Subscribe(1, [("a", 0x40)])),  # a reserved bit
        (Role.CLIENT, p.Subscribe(1, [("a", 0)], p.Properties(subscription_identifiers=(1, 2)))),
        (Role.CLIENT, p.Subscribe(1, [("a", 0)], p.Properties(subscription_identifiers=(0,)))),
        (Role.CLIENT, p.Publish("t", b"", properties=p.Properties(session_expiry_interval=1))),  # not a PUBLISH's
        (Role.CLIENT, p.Publish("t", b"", properties=p.Properties(topic_alias=0))),
        (Role.CLIENT, p.Publish("t", b"", properties=p.Properties(message_expiry_interval=1 << 32))),
        (Role.CLIENT, p.Publish("t", b"", properties=p.Properties(payload_format_indicator=2))),
        (Role.CLIENT, p.Publish("", b"")),  # an empty topic needs an alias
        (Role.CLIENT, p.Publish("t", b"", properties=p.Properties(response_topic="r/+"))),  # [MQTT-3.3.2-14]
        (Role.CLIENT, p.Connect("c", protocol_level=5, properties=p.Properties(receive_maximum=0))),
        (Role.CLIENT, p.Connect("c", protocol_level=5, will=p.Will("w", b"", properties=p.Properties(topic_alias=1)))),
    ],
)
def test_what_v5_may_not_send_is_refused_before_any_byte(role: Role, packet: p.Packet) -> None:
    conn = MqttConnection(role)
    if type(packet) is not p.Connect:
        conn.protocol_level = 5
    with pytest.raises(LocalProtocolError):
        conn.send(packet)
