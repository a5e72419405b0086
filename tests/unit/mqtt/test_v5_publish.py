"""A v5 PUBLISH in (gateway.mqtt.incoming) and a v5 delivery out
(gateway.mqtt.outgoing), sans-IO."""

from __future__ import annotations

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec import MqttConnection, Role
from gateway.mqtt.incoming import Refused, accept
from gateway.mqtt.outgoing import fitted, message_items, publish_v5
from gateway.mqtt.codec.properties import subscription_identifier_item
from gateway.mqtt.peer import Peer, negotiate
from gateway.mqtt.codec.reasons import ReasonCode as R
from gateway.mqtt.settings import MqttSettings
from tests.support.mqtt5_codec_helpers import CONNACK5_WIRE

NOW = 1_700_000_000_000
SETTINGS = MqttSettings(topic_alias_maximum=2)


def peer(**props: int) -> Peer:
    return negotiate(p.Properties(**props) if props else None, 30, SETTINGS)


def publish(topic: str = "a/b", payload: bytes = b"x", qos: int = 1, **props: object) -> p.Publish:
    return p.Publish(topic, payload, qos, packet_id=1 if qos else None,
                     properties=p.Properties(**props) if props else None)  # type: ignore[arg-type]


# -- in -------------------------------------------------------------------------


def test_plain_publish_is_accepted() -> None:
    assert accept(peer(), publish(), 0, 10) == ("a/b", {}, 0)


def test_receive_maximum_exceeded_disconnects() -> None:
    outcome = accept(peer(), publish(), 10, 10)
    assert isinstance(outcome, Refused)
    assert (outcome.code, outcome.disconnect) == (R.RECEIVE_MAXIMUM_EXCEEDED, True)
    assert not isinstance(accept(peer(), publish(qos=0), 10, 10), Refused)  # QoS 0 does not count


def test_empty_topic_without_alias_is_a_protocol_error() -> None:
    for packet in (publish(""), publish("", content_type="x")):
        outcome = accept(peer(), packet, 0, 10)
        assert isinstance(outcome, Refused) and (outcome.code, outcome.disconnect) == (R.PROTOCOL_ERROR, True)


def test_alias_set_then_resolved() -> None:
    session = peer()
    assert accept(session, publish("a/b", topic_alias=1), 0, 10) == ("a/b", {}, 0)
    assert accept(session, publish("", topic_alias=1), 0, 10) == ("a/b", {}, 0)
    assert accept(session, publish("c", topic_alias=1), 0, 10) == ("c", {}, 0)
    assert accept(session, publish("", topic_alias=1), 0, 10) == ("c", {}, 0)


def test_alias_over_the_maximum_is_invalid() -> None:
    outcome = accept(peer(), publish("a", topic_alias=3), 0, 10)
    assert isinstance(outcome, Refused) and (outcome.code, outcome.disconnect) == (R.TOPIC_ALIAS_INVALID, True)


def test_alias_never_set_is_a_protocol_error() -> None:
    outcome = accept(peer(), publish("", topic_alias=2), 0, 10)
    assert isinstance(outcome, Refused) and (outcome.code, outcome.disconnect) == (R.PROTOCOL_ERROR, True)


def test_payload_not_utf8_refused_in_the_ack_or_by_closing_at_qos0() -> None:
    for qos, disconnect in ((1, False), (2, False), (0, True)):
        outcome = accept(peer(), publish(payload=b"\xff", qos=qos, payload_format_indicator=1), 0, 10)
        assert isinstance(outcome, Refused)
        assert (outcome.code, outcome.disconnect) == (R.PAYLOAD_FORMAT_INVALID, disconnect)
    outcome = accept(peer(), publish(payload="é".encode(), payload_format_indicator=1), 0, 10)
    assert outcome == ("a/b", {"mqtt-payload-format": "utf-8"}, 0)


def test_response_topic_with_wildcard_is_a_protocol_error() -> None:
    outcome = accept(peer(), publish(response_topic="r/+"), 0, 10)
    assert isinstance(outcome, Refused) and (outcome.code, outcome.disconnect) == (R.PROTOCOL_ERROR, True)


def test_expiry_and_headers() -> None:
    outcome = accept(peer(), publish(message_expiry_interval=5, content_type="t"), 0, 10)
    assert outcome == ("a/b", {"content-type": "t"}, 5)


# -- out ------------------------------------------------------------------------


def decode(data: bytes) -> p.Publish:
    conn = MqttConnection(Role.CLIENT)
    conn.send(p.Connect("c", protocol_level=5))
    conn.receive_data(CONNACK5_WIRE + data)
    events = list(conn.events())
    assert len(events) == 2 and isinstance(events[1], p.Publish)
    return events[1]


FIELD = b"\x00\x03a/b"


def out(session: Peer, topic: str = "a/b", headers: dict[str, str] | None = None, expires_ms: int = 0,
        body: bytes = b"hello", subscription_id: int = 0, field: bytes = FIELD) -> bytes | None:
    items = message_items(headers, expires_ms, NOW) + (subscription_identifier_item(subscription_id) if subscription_id else b"")
    return publish_v5(session, field, topic, items, body, 1, False, False, 7)


def test_delivery_without_metadata_has_no_properties() -> None:
    data = out(peer())
    assert data is not None
    packet = decode(data)
    assert (packet.topic, packet.payload, packet.qos, packet.packet_id, packet.properties) == ("a/b", b"hello", 1, 7,
                                                                                                None)


def test_delivery_carries_properties_and_subscription_identifier() -> None:
    data = out(peer(), headers={"content-type": "t", "k": "v"}, expires_ms=NOW + 3000, subscription_id=9)
    assert data is not None
    props = decode(data).properties
    assert props == p.Properties(content_type="t", user_properties=(("k", "v"),), message_expiry_interval=3,
                                 subscription_identifiers=(9,))


def test_alias_first_use_then_alias_only() -> None:
    session = peer(topic_alias_maximum=1)
    first = decode(out(session) or b"")
    second = decode(out(session) or b"")
    other = decode(out(session, "c", field=b"\x00\x01c") or b"")
    assert (first.topic, first.properties and first.properties.topic_alias) == ("a/b", 1)
    assert (second.topic, second.properties and second.properties.topic_alias) == ("", 1)
    assert (other.topic, other.properties) == ("c", None)  # no alias left


def test_oversize_is_dropped_counted_and_its_alias_taken_back() -> None:
    session = peer(topic_alias_maximum=1, maximum_packet_size=64)
    assert out(session, body=b"x" * 100) is None
    assert session.oversize_dropped == 1
    assert session.aliases_out.aliases == {}
    small = decode(out(session) or b"")
    assert (small.topic, small.properties and small.properties.topic_alias) == ("a/b", 1)  # the alias set now
    assert out(session, body=b"x" * 100) is None
    assert session.aliases_out.aliases == {"a/b": 1}  # known to the client: kept
    assert session.oversize_dropped == 2


def test_packet_exactly_at_the_maximum_is_sent() -> None:
    size = len(out(peer()) or b"")
    assert out(peer(maximum_packet_size=size)) is not None
    assert out(peer(maximum_packet_size=size - 1)) is None


# -- the client's Maximum Packet Size on packets other than PUBLISH ---------------


def _encoded(packet: object) -> bytes:
    conn = MqttConnection(Role.SERVER)
    conn.protocol_level = 5
    return conn.send(packet)


def _connack(**props: object) -> p.ConnAck:
    return p.ConnAck(False, 0, p.Properties(**props))  # type: ignore[arg-type]


def test_a_packet_that_fits_goes_whole() -> None:
    ack = _connack(receive_maximum=10, reason_string="why", retain_available=1)
    assert fitted(peer(), _encoded, ack) == _encoded(ack)


def test_reason_string_and_user_properties_go_first() -> None:
    # [MQTT-3.1.2-25]: what would make the packet too large is shed, the
    # reason code stays.
    ack = p.PubAck(7, R.NOT_AUTHORIZED, p.Properties(reason_string="x" * 40, user_properties=(("k", "v" * 40),)))
    data = fitted(peer(maximum_packet_size=10), _encoded, ack)
    assert data == _encoded(p.PubAck(7, R.NOT_AUTHORIZED, p.Properties()))
    assert ack.properties is not None and ack.properties.reason_string == "x" * 40  # the caller's is untouched


def test_connack_sheds_in_order_and_keeps_what_the_client_must_know() -> None:
    full = _connack(receive_maximum=1024, maximum_packet_size=4194309, topic_alias_maximum=64, retain_available=1,
                    wildcard_subscription_available=1, subscription_identifier_available=1,
                    shared_subscription_available=1, assigned_client_identifier="gw-1", server_keep_alive=30)
    must = _encoded(_connack(assigned_client_identifier="gw-1", server_keep_alive=30))
    # Room for the flags' absence only: the limits stay.
    limits = _encoded(_connack(receive_maximum=1024, maximum_packet_size=4194309, topic_alias_maximum=64,
                               assigned_client_identifier="gw-1", server_keep_alive=30))
    assert fitted(peer(maximum_packet_size=len(limits)), _encoded, full) == limits
    assert fitted(peer(maximum_packet_size=len(must)), _encoded, full) == must
    assert fitted(peer(maximum_packet_size=len(must) - 1), _encoded, full) is None  # nothing may go
