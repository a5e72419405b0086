"""Expiry in the core: an expired message is never delivered, is swept, is
counted, and a persistent one goes to the dead-letter queue."""

from __future__ import annotations

from core.broker import Broker, BrokerSettings
from core.subscriptions import AckMode
from tests.support.core_fakes import FakeClock, RecordingSink, RecordingStore, address

Q = address("/queue/ttl")
DLQ = address("/queue/DLQ")


def make(**settings: object) -> tuple[Broker, FakeClock, RecordingStore]:
    clock = FakeClock()
    store = RecordingStore()
    return Broker(clock, BrokerSettings(**settings), node="t", store=store), clock, store  # type: ignore[arg-type]


def send(broker: Broker, clock: FakeClock, body: bytes, ttl_ms: int | None, persistent: bool = False) -> None:
    expires = clock.wall_ms() + ttl_ms if ttl_ms is not None else 0
    broker.open_client(RecordingSink()).send(broker.message(Q, {}, body, persistent=persistent, expires=expires))


def test_an_expired_message_is_never_delivered_and_is_counted() -> None:
    broker, clock, _ = make()
    send(broker, clock, b"short", 100)
    send(broker, clock, b"forever", None)
    clock.advance(0.2)
    sink = RecordingSink()
    broker.open_client(sink).subscribe("s", Q, AckMode.AUTO)
    assert sink.bodies == [b"forever"]
    assert broker.queues[Q].stats.expired == 1


def test_a_message_already_expired_on_arrival_is_dropped() -> None:
    broker, clock, _ = make()
    send(broker, clock, b"late", -1)
    assert broker.queues[Q].depth == 0 and broker.queues[Q].stats.expired == 1


def test_the_sweep_removes_expired_messages_without_a_consumer() -> None:
    broker, clock, _ = make()
    for i in range(5):
        send(broker, clock, str(i).encode(), 100 if i % 2 else None)
    clock.advance(0.2)
    assert broker.sweep_expired() == 2
    queue = broker.queues[Q]
    assert [m.body for m in queue.pending] == [b"0", b"2", b"4"]
    assert queue.expiring == 0
    assert broker.sweep_expired() == 0


def test_an_expired_persistent_message_goes_to_the_dead_letter_queue() -> None:
    broker, clock, store = make()
    send(broker, clock, b"kept", 100, persistent=True)
    clock.advance(0.2)
    broker.sweep_expired()
    dead = broker.queues[DLQ]
    assert [m.body for m in dead.pending] == [b"kept"]
    assert dead.pending.pop().headers["dlqDeliveryFailureCause"] == "expired"
    assert store.kinds()[-1] == "tx"  # moved in one store record


def test_with_expired_to_dlq_off_expired_persistent_messages_are_dropped() -> None:
    broker, clock, store = make(expired_to_dlq=False)
    send(broker, clock, b"gone", 100, persistent=True)
    clock.advance(0.2)
    assert broker.sweep_expired() == 1
    assert DLQ not in broker.queues
    assert store.kinds()[-1] == "ack"
