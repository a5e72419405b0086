"""What one MQTT 5 packet's properties may cost, sans-IO: a block of many
repeated properties parses in linear work and exactly, and a connection's
limits on property items and User Property bytes refuse a packet past them
with 0x95 Packet too large, as soon as the limit is crossed, counting a
CONNECT's properties and its will's together; and the limit on topic filters
in one SUBSCRIBE or UNSUBSCRIBE (3.1.1 too)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway import config
from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec import MqttConnection, RemoteProtocolError, Role, State
from gateway.mqtt.codec.properties import Budget, read_properties
from gateway.mqtt.settings import MqttSettings
from gateway.mqtt.codec.wire import PT, remaining_length
from tests.support.mqtt5_codec_helpers import connected5

PACKET_TOO_LARGE = 0x95


def user(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return b"\x26" + len(raw_name).to_bytes(2, "big") + raw_name + len(raw_value).to_bytes(2, "big") + raw_value


def block(items: list[bytes]) -> bytes:
    body = b"".join(items)
    return remaining_length(len(body)) + body


def packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + remaining_length(len(body)) + body


def publish(items: list[bytes]) -> bytes:
    return packet(0x30, b"\x00\x01t" + block(items) + b"payload")


def connect(items: list[bytes], will_items: list[bytes] | None = None) -> bytes:
    flags = 0x02 | (0x04 if will_items is not None else 0)
    body = b"\x00\x04MQTT\x05" + bytes((flags,)) + b"\x00\x3c" + block(items) + b"\x00\x01c"
    if will_items is not None:
        body += block(will_items) + b"\x00\x01w" + b"\x00\x00"
    return packet(0x10, body)


def pairs(n: int) -> list[tuple[str, str]]:
    return [(f"k{i % 7}", f"v{i}") for i in range(n)]  # names repeat, as the spec allows


def decoded(conn: MqttConnection, wire: bytes) -> list[Any]:
    conn.receive_data(wire)
    return list(conn.events())


def refusal(conn: MqttConnection, wire: bytes) -> RemoteProtocolError:
    conn.receive_data(wire)
    with pytest.raises(RemoteProtocolError) as caught:
        list(conn.events())
    assert conn.state is State.ERROR
    return caught.value


# -- linear, and exact -------------------------------------------------------------


def test_a_large_block_of_repeated_user_properties_parses_whole_and_in_order() -> None:
    expected = pairs(60_000)
    wire = block([user(name, value) for name, value in expected])
    props, stop = read_properties(wire, 0, len(wire), PT.PUBLISH)
    assert stop == len(wire)
    assert props is not None and props.user_properties == tuple(expected)


class Recorder:
    """Stands in for Properties (a plain class: the compiled build's cannot
    be subclassed) and counts the values stored into its repeated fields:
    building a tuple of n repeats must store n values, not 1 + 2 + ... + n."""

    stored = 0
    user_properties: tuple[tuple[str, str], ...] = ()  # what a Properties starts with
    subscription_identifiers: tuple[int, ...] = ()

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, tuple):
            Recorder.stored += len(value)
        object.__setattr__(self, name, value)


def test_parsing_repeated_properties_stores_each_value_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(p, "Properties", Recorder)
    n = 3000
    wire = block([user(name, value) for name, value in pairs(n)] + [b"\x0b" + remaining_length(i + 1) for i in range(n)])
    Recorder.stored = 0
    props: Any = read_properties(wire, 0, len(wire), PT.PUBLISH)[0]
    assert isinstance(props, Recorder)
    assert props.user_properties == tuple(pairs(n))
    assert props.subscription_identifiers == tuple(range(1, n + 1))
    # Each of the 2n values stored once (the quadratic parse stored n(n+1) of them).
    assert Recorder.stored == 2 * n


# -- the limits ----------------------------------------------------------------------


def test_a_publish_at_the_property_limit_passes_and_one_more_is_refused_with_0x95() -> None:
    items = [user(name, value) for name, value in pairs(100)]
    (accepted,) = decoded(connected5(Role.SERVER, max_properties=101), publish([*items, b"\x01\x01"]))
    assert accepted.properties.user_properties == tuple(pairs(100))
    assert accepted.properties.payload_format_indicator == 1
    error = refusal(connected5(Role.SERVER, max_properties=100), publish([*items, b"\x01\x01"]))
    assert error.reason_code == PACKET_TOO_LARGE
    assert "PUBLISH" in error.message and "100 properties" in error.message


def test_user_property_bytes_count_names_and_values_up_to_the_limit() -> None:
    items = [user("ab", "cdef")] * 10  # 6 bytes each
    (accepted,) = decoded(connected5(Role.SERVER, max_user_property_bytes=60), publish(items))
    assert accepted.properties.user_properties == (("ab", "cdef"),) * 10
    error = refusal(connected5(Role.SERVER, max_user_property_bytes=59), publish(items))
    assert error.reason_code == PACKET_TOO_LARGE
    assert "59 bytes of user properties" in error.message


def test_the_refusal_comes_as_the_limit_is_crossed_not_after_the_block() -> None:
    # The block goes on past the limit into an unknown identifier (0x81 if it
    # were read): refused with 0x95, so nothing after the limit was parsed.
    items = [user("k", "v")] * 5 + [b"\x05\x00"]
    assert refusal(connected5(Role.SERVER, max_properties=4), publish(items)).reason_code == PACKET_TOO_LARGE
    items = [user("k", "v" * 20)] * 3 + [b"\x05\x00"]
    assert refusal(connected5(Role.SERVER, max_user_property_bytes=30), publish(items)).reason_code == PACKET_TOO_LARGE


def test_repeated_subscription_identifiers_count_against_the_limit_too() -> None:
    # Refused by their number before a client's subscription identifier is
    # refused (0x82): a block of them costs no more than the limit.
    items = [b"\x0b\x01"] * 50
    assert refusal(connected5(Role.SERVER, max_properties=49), publish(items)).reason_code == PACKET_TOO_LARGE


FOUR = block([user("k", "v")] * 4)
WITH_PROPERTIES = {  # four properties in each of the others a client sends
    "SUBSCRIBE": packet(0x82, b"\x00\x01" + FOUR + b"\x00\x01a\x00"),
    "UNSUBSCRIBE": packet(0xA2, b"\x00\x01" + FOUR + b"\x00\x01a"),
    "PUBACK": packet(0x40, b"\x00\x01\x00" + FOUR),
    "PUBREL": packet(0x62, b"\x00\x01\x00" + FOUR),
    "DISCONNECT": packet(0xE0, b"\x00" + FOUR),
    "AUTH": packet(0xF0, b"\x18" + block([b"\x15\x00\x01m", *[user("k", "v")] * 3])),
}


@pytest.mark.parametrize("kind", WITH_PROPERTIES)
def test_every_packet_with_properties_has_the_same_limit(kind: str) -> None:
    error = refusal(connected5(Role.SERVER, max_properties=3), WITH_PROPERTIES[kind])
    assert error.reason_code == PACKET_TOO_LARGE and kind in error.message


def test_a_connect_counts_its_own_and_its_wills_properties_together() -> None:
    own, will = [user("a", "1")] * 3, [user("b", "2")] * 3
    (accepted,) = decoded(MqttConnection(Role.SERVER, max_properties=6), connect(own, will))
    assert accepted.properties.user_properties == (("a", "1"),) * 3
    assert accepted.will.properties.user_properties == (("b", "2"),) * 3
    conn = MqttConnection(Role.SERVER, max_properties=5)
    error = refusal(conn, connect(own, will))
    # Answered in v5's terms: a CONNACK with 0x95 (the session sends it).
    assert (error.reason_code, conn.protocol_level) == (PACKET_TOO_LARGE, 5)
    assert "CONNECT" in error.message
    conn = MqttConnection(Role.SERVER, max_user_property_bytes=11)
    assert refusal(conn, connect(own, will)).reason_code == PACKET_TOO_LARGE


def test_limits_raised_after_connect_apply_to_later_packets() -> None:
    conn = connected5(Role.SERVER, max_properties=2)
    conn.max_properties = 200
    (accepted,) = decoded(conn, publish([user(name, value) for name, value in pairs(150)]))
    assert len(accepted.properties.user_properties) == 150


def filters(n: int, options: bool) -> bytes:
    return b"".join(b"\x00\x03f/" + bytes((0x30 + i % 10,)) + (b"\x01" if options else b"") for i in range(n))


@pytest.mark.parametrize("level", [4, 5])
def test_a_subscribe_or_unsubscribe_past_the_filter_limit_is_refused_before_the_rest(level: int) -> None:
    props = b"\x00" if level == 5 else b""
    for first, kind, options in ((0x82, "SUBSCRIBE", True), (0xA2, "UNSUBSCRIBE", False)):
        (accepted,) = decoded(connected(level, max_topic_filters=8), packet(first, b"\x00\x01" + props + filters(8, options)))
        assert len(accepted.topics) == 8
        # Eight filters, then a byte that is no filter (malformed if read): a
        # ninth is refused before it is read.
        wire = packet(first, b"\x00\x01" + props + filters(8, options) + b"\xff")
        error = refusal(connected(level, max_topic_filters=8), wire)
        assert f"{kind} with more than 8 topic filters" in error.message
        # v5: DISCONNECT 0x95; 3.1.1 has no error packet (no CONNACK code
        # either, after CONNECT): the session closes.
        assert error.reason_code == PACKET_TOO_LARGE and error.return_code is None


def connected(level: int, **limits: int) -> MqttConnection:
    if level == 5:
        return connected5(Role.SERVER, **limits)
    conn = MqttConnection(Role.SERVER, **limits)
    assert len(decoded(conn, b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c")) == 1
    return conn


def test_a_budget_spans_the_blocks_it_is_given() -> None:
    wire = block([user("k", "v")] * 3)
    budget = Budget("CONNECT", 5, 100)
    read_properties(wire, 0, len(wire), PT.CONNECT, budget)
    assert (budget.properties, budget.user_bytes) == (3, 6)
    with pytest.raises(RemoteProtocolError):
        read_properties(wire, 0, len(wire), PT.CONNECT, budget)


# -- settings --------------------------------------------------------------------------


def test_the_defaults_leave_room_for_real_use_and_bound_the_rest() -> None:
    settings = MqttSettings()
    assert settings.max_properties == 1024 and settings.max_user_property_bytes == 64 * 1024
    assert settings.preconnect_max_properties == 64 and settings.preconnect_max_user_property_bytes == 8 * 1024
    assert settings.max_topic_filters == 1024


@pytest.mark.parametrize("key", ["max_properties", "max_user_property_bytes", "preconnect_max_properties",
                                 "preconnect_max_user_property_bytes", "max_topic_filters"])
def test_a_limit_below_one_is_refused_at_start_naming_it(tmp_path: Any, key: str) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(f"[mqtt]\n{key} = 0\n")
    with pytest.raises(config.ConfigError, match=f"mqtt.{key} must be at least 1"):
        config.load(str(path))
