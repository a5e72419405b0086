"""What the core asks of the store for topic archives and idempotent COMMITs."""

from __future__ import annotations

from typing import Any

import pytest

from core.broker import Broker, BrokerSettings
from core.errors import UnknownTransaction
from core.subscriptions import AckMode
from tests.support.core_fakes import FakeClock, RecordingSink, RecordingStore, address

POLICIES = [{"destination": "/topic/plant.>", "archive": True, "archive_retention_s": 60}]


def make(**settings: Any) -> tuple[Broker, RecordingStore]:
    store = RecordingStore()
    settings.setdefault("policies", POLICIES)
    return Broker(FakeClock(), BrokerSettings(**settings), node="t", store=store), store  # type: ignore[arg-type]


def publish(broker: Broker, client: Any, where: str, body: bytes, persistent: bool = False, tx: str | None = None) -> int:
    return client.send(broker.message(address(where), {}, body, persistent=persistent), tx)  # type: ignore[no-any-return]


def test_only_topics_an_archive_policy_names_are_archived_under_their_core_name() -> None:
    broker, store = make()
    producer = broker.open_client(RecordingSink())
    assert publish(broker, producer, "/topic/plant.1.temp", b"a") == 0  # non-persistent: nothing to wait for
    publish(broker, producer, "/topic/other.x", b"b")
    publish(broker, producer, "/queue/plant.1.temp", b"c", persistent=True)
    assert [c for c in store.calls if c[0] == "archive"] == [("archive", "plant.1.temp", b"a")]
    assert broker.policies.for_address(address("/topic/plant.2")).archive_retention_s == 60


def test_a_persistent_publish_waits_for_its_archived_copy() -> None:
    broker, store = make()
    producer = broker.open_client(RecordingSink())
    lsn = publish(broker, producer, "/topic/plant.1.temp", b"a", persistent=True)
    assert store.calls == [("archive", "plant.1.temp", b"a")] and lsn == store.lsn


def test_a_commit_archives_its_topic_sends_in_its_one_record() -> None:
    broker, store = make()
    producer = broker.open_client(RecordingSink())
    producer.begin("t")
    publish(broker, producer, "/topic/plant.1", b"a", tx="t")
    publish(broker, producer, "/topic/other", b"b", tx="t")
    assert store.calls == []
    lsn = producer.commit("t")
    assert store.calls == [("tx", (), (), (("plant.1", b"a"),), None)] and lsn == store.lsn


def test_a_commit_key_seen_before_discards_the_replayed_sends() -> None:
    broker, store = make()
    consumer = broker.open_client(sink := RecordingSink())
    consumer.subscribe("s", address("/queue/out"), AckMode.AUTO)
    producer = broker.open_client(RecordingSink())
    lsns = []
    for attempt in range(2):
        producer.begin("t")
        publish(broker, producer, "/queue/out", b"x", persistent=True, tx="t")
        lsn, duplicate = producer.commit_once("t", "batch-1")
        assert duplicate is (attempt == 1)
        lsns.append(lsn)
    assert lsns[1] >= lsns[0] > 0  # the replay's receipt waits for the first commit's record
    assert sink.bodies == [b"x"]
    assert [c[-1] for c in store.calls if c[0] == "tx"] == ["batch-1"]  # remembered with the first commit only
    with pytest.raises(UnknownTransaction):
        producer.commit_once("nope", "batch-1")


def test_the_remembered_keys_are_bounded_oldest_forgotten_first() -> None:
    broker, store = make(commit_keys=3)
    broker.restore_commit_keys(["k0", "k1"])
    producer = broker.open_client(RecordingSink())
    for key in ("k2", "k3", "k4"):
        producer.begin(key)
        producer.commit_once(key, key)
    assert list(broker.commit_keys) == ["k2", "k3", "k4"]
    assert [c for c in store.calls if c[0] == "forget"] == [("forget", "k0"), ("forget", "k1")]
    producer.begin("again")
    assert producer.commit_once("again", "k0")[1] is False  # forgotten: committed again
    assert list(broker.commit_keys) == ["k3", "k4", "k0"]


def test_an_mqtt_messages_archived_copy_carries_its_qos_and_retain_flag_and_nothing_else_does() -> None:
    broker, store = make()
    sink = RecordingSink()
    subscriber = broker.open_client(sink)
    subscriber.subscribe("s", address("/topic/plant.>"), AckMode.AUTO)
    producer = broker.open_client(RecordingSink())
    mqtt = broker.message(address("/topic/plant.1"), {"site": "north"}, b"m")
    mqtt.qos, mqtt.retain_published = 1, True  # as gateway/mqtt/session.py sets them
    producer.send(mqtt, None)
    producer.send(broker.message(address("/topic/plant.2"), {"site": "south"}, b"s"), None)
    assert store.archived_headers == [{"site": "north", "mqtt-qos": "1", "mqtt-retain": "true"}, {"site": "south"}]
    assert [m.headers for m in sink.messages] == [{"site": "north"}, {"site": "south"}]  # as published
