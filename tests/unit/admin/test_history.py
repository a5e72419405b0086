"""The console's history (gateway/admin/history.py) on a real core broker:
rates from counters between samples, never negative when a queue goes,
queued and unacked totals, bounded rings, and destinations that are gone
dropped."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from core.broker import Broker, BrokerSettings
from core.subscriptions import AckMode
from gateway.admin import history as history_module
from gateway.admin.history import History
from tests.support.core_fakes import FakeClock, RecordingSink, RecordingStore, address

Q = address("/queue/orders")


class Store(RecordingStore):
    def stats(self) -> dict[str, Any]:
        return {"bytes": 123}


def make(tmp_path: Any) -> tuple[Broker, History, Any]:
    broker = Broker(FakeClock(), BrokerSettings(), node="t", store=Store())
    server = SimpleNamespace(connections={})
    return broker, History(broker, server, broker.store, str(tmp_path), interval_s=1.0), server


def send(broker: Broker, n: int, where: Any = Q) -> None:
    producer = broker.open_client(RecordingSink())
    for i in range(n):
        producer.send(broker.message(where, {}, str(i).encode()))


def test_rates_are_counts_over_the_interval_and_totals_are_now(tmp_path: Any) -> None:
    broker, history, _ = make(tmp_path)
    history.sample(1_000)
    send(broker, 20)
    consumer = broker.open_client(RecordingSink())
    consumer.subscribe("c", Q, AckMode.CLIENT_INDIVIDUAL, prefetch=5)
    history.sample(3_000)  # two seconds later
    last = history.samples[-1]
    assert (last["in"], last["out"]) == (10.0, 2.5)  # 20 in, 5 delivered, over 2 s
    assert (last["queued"], last["unacked"], last["store_bytes"]) == (15, 5, 123)
    assert history.destinations["/queue/orders"][-1] == [3_000, 15, 10.0, 0.0]  # none acked: out (dequeued) 0
    assert history.samples[0]["in"] == 0.0  # the first sample has no interval


def test_a_queue_that_goes_makes_no_rate_negative_and_leaves_the_rings(tmp_path: Any) -> None:
    broker, history, _ = make(tmp_path)
    send(broker, 5)
    history.sample(1_000)
    broker.remove_queue(Q, force=True)
    history.sample(2_000)
    assert history.samples[-1]["out"] >= 0 and history.samples[-1]["queued"] == 0
    assert "/queue/orders" not in history.destinations


def test_the_rings_are_bounded(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(history_module, "MAX_DESTINATIONS", 3)
    broker, history, _ = make(tmp_path)
    for i in range(5):
        send(broker, 1, address(f"/queue/q{i}"))
    for t in range(history_module.KEEP_SAMPLES + 10):
        history.sample(1_000 * (t + 1))
    view = history.view()
    assert len(view["samples"]) == history_module.KEEP_SAMPLES
    assert sorted(view["destinations"]) == ["/queue/q0", "/queue/q1", "/queue/q2"]
    assert all(len(ring) == history_module.KEEP_DESTINATION_SAMPLES for ring in view["destinations"].values())
