"""SUBSCRIBE's pure parts (gateway.mqtt.subscribing): the durable
subscription's name keeps the v5 options and identifier, and ``$share/``
filters split into group and filter or are refused."""

from __future__ import annotations

import pytest

from gateway.mqtt.codec import packets
from gateway.mqtt.subscribing import durable_name, parse_durable_name, shared_parts


@pytest.mark.parametrize("qos,options,identifier,topic_filter", [
    (0, 0, 0, "a/b"),
    (1, 1, 0, "a/+/c"),
    (2, 2, 0, "#"),
    (1, 1 | packets.NO_LOCAL, 0, "a/b"),
    (1, 1 | packets.RETAIN_AS_PUBLISHED | (2 << 4), 7, "a:b/#"),
    (0, 0, 268_435_455, "$share/g/x/y"),
])
def test_durable_name_round_trips(qos: int, options: int, identifier: int, topic_filter: str) -> None:
    name = durable_name(qos, options, identifier, topic_filter)
    assert parse_durable_name(name) == (topic_filter, options & ~0x30, identifier)  # Retain Handling acts once


def test_retain_handling_does_not_change_a_durable_name() -> None:
    # A client resubscribing with Retain Handling 1 (only if new) keeps its durable queue and its backlog.
    assert durable_name(1, packets.options(1, retain_handling=1), 0, "a/b") == durable_name(1, 1, 0, "a/b") == "1:a/b"


def test_plain_options_keep_the_3_1_1_name() -> None:
    assert durable_name(1, 1, 0, "a/b") == "1:a/b"  # what 3.1.1 sessions stored before v5


def test_unknown_head_reads_as_qos_1() -> None:
    assert parse_durable_name("x:a/b") == ("a/b", 1, 0)
    assert parse_durable_name("1,2:a/b") == ("a/b", 1, 0)


def test_shared_parts() -> None:
    assert shared_parts("a/b") == (None, "a/b")
    assert shared_parts("$share/g/a/b") == ("g", "a/b")
    assert shared_parts("$share/g/#") == ("g", "#")
    assert shared_parts("$sharex/g/a") == (None, "$sharex/g/a")


@pytest.mark.parametrize("topic_filter", ["$share/g", "$share//a", "$share/g+/a", "$share/#/a", "$share/"])
def test_shared_refusals(topic_filter: str) -> None:
    assert isinstance(shared_parts(topic_filter), str)
