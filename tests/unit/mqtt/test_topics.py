"""The one topic space: MQTT names and filters onto core addresses, reversibly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core import names
from core.broker import Broker
from core.messages import Message
from core.subscriptions import AckMode
from gateway.mqtt import topics
from tests.support.core_fakes import FakeClock, RecordingSink, RecordingStore


@pytest.mark.parametrize(
    ("mqtt", "core"),
    [
        ("plant/3/temp", "/topic/plant.3.temp"),
        ("spBv1.0/group/NDATA/node", "/topic/spBv1%2E0.group.NDATA.node"),
        ("/leading/slash", "/topic/%.leading.slash"),
        ("a//b", "/topic/a.%.b"),
        ("100%/*/>", "/topic/100%25.%2A.%3E"),
        ("$SYS/broker/load", "/topic/$SYS.broker.load"),
    ],
)
def test_topic_names_map_onto_core_topics_and_back(mqtt: str, core: str) -> None:
    address = topics.to_address(mqtt)
    assert isinstance(address, names.Address) and address.text == core
    assert topics.from_address(address) == mqtt


@given(st.lists(st.text(alphabet=st.characters(min_codepoint=0x20, blacklist_characters="/+#"), max_size=8), min_size=1, max_size=6))
def test_every_topic_name_round_trips(levels: list[str]) -> None:
    topic = "/".join(levels)
    address = topics.to_address(topic)
    if isinstance(address, str):
        return  # too long, or a control character: refused, not mangled
    assert topics.from_address(address) == topic


def test_a_topic_too_long_to_cache_maps_and_round_trips_as_a_cached_one_does() -> None:
    # Mapping is cached for topics up to CACHED_CHARS (the same Address each
    # time); a longer one (a topic may be 64 KiB) is mapped each time, the same way.
    long = "spBv1.0/" + "x" * topics.CACHED_CHARS + "/a.b"
    address = topics.to_address(long)
    assert isinstance(address, names.Address) and topics.from_address(address) == long
    assert topics.to_address(long) == address and topics.to_address("spBv1.0/a.b") is topics.to_address("spBv1.0/a.b")


@pytest.mark.parametrize(
    ("mqtt", "core"),
    [("plant/+/temp", "/topic/plant.*.temp"), ("plant/#", "/topic/plant.>"), ("#", "/topic/>"), ("+/x", "/topic/*.x")],
)
def test_filters_map_plus_and_hash_onto_star_and_greater_than(mqtt: str, core: str) -> None:
    pattern = topics.to_pattern(mqtt)
    assert isinstance(pattern, names.Address) and pattern.text == core


def make_broker() -> tuple[Broker, RecordingStore]:
    store = RecordingStore()
    return Broker(FakeClock(), store=store), store


def topic_message(broker: Broker, mqtt: str, body: bytes, qos: int = 0) -> Message:
    address = topics.to_address(mqtt)
    assert isinstance(address, names.Address)
    message = broker.message(address, {}, body, persistent=qos > 0)
    message.qos = qos
    return message


def test_root_wildcards_do_not_match_system_topics() -> None:
    broker, _ = make_broker()
    sinks = {}
    for pattern in ("#", "+/broker/load", "$SYS/#"):
        sinks[pattern] = RecordingSink()
        address = topics.to_pattern(pattern)
        assert isinstance(address, names.Address)
        broker.open_client(sinks[pattern]).subscribe(pattern, address, AckMode.AUTO)
    producer = broker.open_client(RecordingSink())
    producer.send(topic_message(broker, "$SYS/broker/load", b"1"))
    assert [len(sinks[p].deliveries) for p in ("#", "+/broker/load", "$SYS/#")] == [0, 0, 1]


def test_the_retained_store_keeps_the_last_non_empty_message_per_topic() -> None:
    broker, store = make_broker()
    first = topic_message(broker, "a/b", b"one")
    second = topic_message(broker, "a/b", b"two", qos=1)
    broker.publish(first, retain=True)
    broker.publish(second, retain=True)
    pattern = topics.to_pattern("a/+")
    assert isinstance(pattern, names.Address)
    copies = broker.retained_for(pattern)
    assert [(m.body, m.retain, m.qos) for m in copies] == [(b"two", True, 1)]
    assert not second.retain  # live deliveries never carry the flag
    broker.publish(topic_message(broker, "a/b", b""), retain=True)
    assert broker.retained_for(pattern) == []
    assert store.calls == [("retain", "/topic/a.b", b"one"), ("retain", "/topic/a.b", b"two"), ("retain", "/topic/a.b", None)]


def test_a_delivery_settled_by_the_sink_needs_no_ack() -> None:
    broker, _ = make_broker()

    class SettlingSink(RecordingSink):
        def deliver(self, subscription, message):  # type: ignore[no-untyped-def]
            super().deliver(subscription, message)
            return True

    sink = SettlingSink()
    client = broker.open_client(sink)
    address = topics.to_pattern("x")
    assert isinstance(address, names.Address)
    subscription = client.subscribe("s", address, AckMode.CLIENT_INDIVIDUAL, prefetch=1)
    producer = broker.open_client(RecordingSink())
    for i in range(3):
        producer.send(topic_message(broker, "x", str(i).encode()))
    assert sink.bodies == [b"0", b"1", b"2"]  # prefetch 1 did not hold them: none is unacked
    assert subscription.unacked == {}
