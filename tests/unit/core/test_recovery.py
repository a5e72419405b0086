"""What the store recovered, as plain records, becomes the broker's queues,
durable subscriptions, retained messages and commit keys in one place."""

from __future__ import annotations

from core import recovery
from core.broker import Broker, BrokerSettings
from core.durables import durable_key
from core.storage import Recovered, Retained, StoredMessage, StoredSubscription
from tests.support.core_fakes import FakeClock, RecordingStore, address


def recovered(*, clean: bool, queues: dict[str, list[StoredMessage]], subscriptions: list[StoredSubscription] = (),  # type: ignore[assignment]
              retained: list[Retained] = (), commit_keys: list[str] = ()) -> Recovered:  # type: ignore[assignment]
    return Recovered(clean, list(subscriptions), queues, list(retained), list(commit_keys), {}, 0, 0, 0, 0.0)


def stub(mid: str, destination: str, count: int = 0, location: int = 7) -> StoredMessage:
    return StoredMessage(mid, destination, None, None, 5, 0, 1_000, count, location)


def test_records_become_queues_durables_retained_messages_and_commit_keys() -> None:
    broker = Broker(FakeClock(), BrokerSettings(), node="t", store=RecordingStore())  # type: ignore[arg-type]
    key = durable_key("app", "prices")
    skipped = recovery.restore(broker, recovered(
        clean=True,
        queues={"/queue/a": [stub("m1", "/queue/a", 2), stub("m2", "/queue/a")], key: [stub("t1", "/topic/p")]},
        subscriptions=[StoredSubscription(key, "/topic/p", "x = 1", "bob")],
        retained=[Retained(StoredMessage("r", "/topic/s", {"h": "v"}, b"on", 4, 0, 1, 0), 1)],
        commit_keys=["k1", "k2"],
    ))
    assert skipped == 0
    queue = broker.queues[address("/queue/a")]
    assert [(m.id, m.redeliveries, m.location, m.persistent, m.body) for m in queue.pending] == [
        ("m1", 2, 7, True, None), ("m2", 0, 7, True, None)]
    durable = broker.durables[key]
    assert (durable.owner, durable.queue.selector.text, [m.id for m in durable.queue.pending]) == ("bob", "x = 1", ["t1"])
    assert list(broker.commit_keys) == ["k1", "k2"]
    [kept] = broker.retained.matching(address("/topic/s"))
    assert (kept.id, kept.body, kept.qos, kept.stored) == ("r", b"on", 1, False)


def test_after_a_crash_every_message_comes_back_redelivered_and_unusable_records_are_skipped() -> None:
    broker = Broker(FakeClock(), BrokerSettings(), node="t", store=RecordingStore())  # type: ignore[arg-type]
    skipped = recovery.restore(broker, recovered(
        clean=False,
        queues={"/queue/a": [stub("m1", "/queue/a"), stub("bad", "not a destination")]},
        subscriptions=[StoredSubscription("not a durable key", "/topic/p", None, None)],
    ))
    assert skipped == 2 and broker.durables == {}
    assert [(m.id, m.redeliveries) for m in broker.queues[address("/queue/a")].pending] == [("m1", 1)]
