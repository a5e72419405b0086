"""The MQTT 3.1.1 rules for topic names and filters (§4.7), and the packet
codes as enums equal to their numbers."""

from __future__ import annotations

import pytest

from gateway.mqtt.codec import packets as p
from gateway.mqtt.codec import validate_topic_filter, validate_topic_name


# -- topic names and filters -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "ok"),
    [("a/b", True), ("/", True), ("a//b", True), ("$SYS/x", True), (" ", True), ("\u00e9", True),
     ("", False),  # [MQTT-4.7.3-1]
     ("a/+", False), ("#", False), ("a/#", False), ("a+b", False),  # [MQTT-3.3.2-2]
     ("a\x00", False),  # [MQTT-4.7.3-2]
     ("a" * 65536, False)],  # [MQTT-4.7.3-3]
)
def test_topic_names(name: str, ok: bool) -> None:
    assert (validate_topic_name(name) is None) is ok


@pytest.mark.parametrize(
    ("topic_filter", "ok"),
    [("#", True), ("a/#", True), ("+", True), ("+/+/#", True), ("/", True), ("a/+/b", True), ("/#", True),
     ("$SYS/#", True), ("+/", True),
     ("a/#/b", False), ("#/a", False), ("a#", False), ("a/b#", False), ("##", False),  # [MQTT-4.7.1-2]
     ("a+", False), ("a/b+/c", False), ("++", False), ("+a", False),  # [MQTT-4.7.1-3]
     ("", False),  # [MQTT-4.7.3-1]
     ("a\x00", False)],  # [MQTT-4.7.3-2]
)
def test_topic_filters(topic_filter: str, ok: bool) -> None:
    assert (validate_topic_filter(topic_filter) is None) is ok


def test_packet_codes_are_enums_equal_to_their_numbers() -> None:
    assert p.ACCEPTED == 0 and p.NOT_AUTHORIZED == 5 and p.SUBACK_FAILURE == 0x80
    assert p.ConnAck(False, 0) == p.ConnAck(False, p.ACCEPTED)
