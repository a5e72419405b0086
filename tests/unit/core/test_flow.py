"""Producer flow control and slow-consumer handling in the core (no sockets)."""

from __future__ import annotations

import pytest

from core.broker import Broker, BrokerSettings
from core.errors import LimitExceeded
from core.subscriptions import AckMode
from tests.support.core_fakes import FakeClock, RecordingSink, address

TOPIC = address("/topic/flow")


def setup(**settings: object) -> tuple[Broker, FakeClock]:
    clock = FakeClock()
    merged = {"topic_high_water": 10, "topic_buffer_limit": 40, "slow_consumer_s": 2.0, **settings}
    return Broker(clock, BrokerSettings(**merged), node="t"), clock  # type: ignore[arg-type]


def publish(broker: Broker, producer: object, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        producer.send(broker.message(TOPIC, {}, str(i).encode()))  # type: ignore[attr-defined]


def test_a_subscriber_behind_holds_the_producer_back_until_it_catches_up() -> None:
    broker, _ = setup()
    sink = RecordingSink(accepting=False)  # its connection's outbox is full
    subscriber = broker.open_client(sink)
    subscriber.subscribe("s", TOPIC, AckMode.AUTO)
    producer_sink = RecordingSink()
    producer = broker.open_client(producer_sink)
    publish(broker, producer, 9)
    assert not producer.blocked_on
    publish(broker, producer, 1, start=9)  # the tenth reaches the high-water mark
    assert producer.blocked_on
    sink.accepting = True
    subscriber.resume()  # the outbox drained
    assert not producer.blocked_on
    assert producer_sink.unblocks == 1
    assert sink.bodies == [str(i).encode() for i in range(10)]


def test_the_producer_stays_held_until_the_backlog_is_down_to_half() -> None:
    broker, _ = setup()
    sink = RecordingSink(accepting=False)
    subscriber = broker.open_client(sink)
    subscription = subscriber.subscribe("s", TOPIC, AckMode.CLIENT_INDIVIDUAL, prefetch=3)
    producer = broker.open_client(RecordingSink())
    publish(broker, producer, 10)
    sink.accepting = True
    subscriber.resume()  # prefetch 3: seven still pending, above half of 10
    assert producer.blocked_on
    for message in list(subscription.unacked.values()):
        subscriber.ack("s", message.id)  # three more go out: four pending
    assert not producer.blocked_on


def test_nothing_is_discarded_while_producers_respect_flow_control() -> None:
    broker, _ = setup()
    sink = RecordingSink(accepting=False)
    subscriber = broker.open_client(sink)
    subscriber.subscribe("s", TOPIC, AckMode.AUTO)
    producer = broker.open_client(RecordingSink())
    sent = 0
    for _ in range(20):  # a producer that sends only while not held back
        while not producer.blocked_on:
            publish(broker, producer, 1, start=sent)
            sent += 1
        sink.accepting = True
        subscriber.resume()
        sink.accepting = False
    assert sink.bodies == [str(i).encode() for i in range(len(sink.bodies))]
    assert subscriber.subscriptions["s"].queue.stats.discarded == 0


def test_a_subscriber_that_takes_nothing_is_declared_slow_and_stops_holding_producers() -> None:
    broker, clock = setup()
    stuck = broker.open_client(RecordingSink(accepting=False))
    stuck.subscribe("s", TOPIC, AckMode.AUTO)
    healthy_sink = RecordingSink()
    healthy = broker.open_client(healthy_sink)
    healthy.subscribe("s", TOPIC, AckMode.AUTO)
    producer_sink = RecordingSink()
    producer = broker.open_client(producer_sink)
    publish(broker, producer, 10)
    assert producer.blocked_on
    clock.advance(1.0)
    assert producer.check_held(clock.monotonic()) == []  # not yet due
    clock.advance(1.5)
    slow = producer.check_held(clock.monotonic())
    assert [q.address for q in slow] == [TOPIC]
    assert not producer.blocked_on and producer_sink.unblocks == 1
    # From now on the stuck one alone pays: its buffer overflows, others flow.
    publish(broker, producer, 100, start=10)
    assert not producer.blocked_on
    assert len(healthy_sink.bodies) == 110
    stuck_queue = stuck.subscriptions["s"].queue
    assert stuck_queue.depth == 40 and stuck_queue.stats.discarded == 70


def test_a_subscriber_that_makes_progress_is_not_declared_slow() -> None:
    broker, clock = setup()
    sink = RecordingSink(accepting=False)
    subscriber = broker.open_client(sink)
    subscriber.subscribe("s", TOPIC, AckMode.CLIENT_INDIVIDUAL, prefetch=1)
    producer = broker.open_client(RecordingSink())
    publish(broker, producer, 10)
    sink.accepting = True
    subscriber.resume()  # one delivered: progress, but still congested
    clock.advance(2.5)
    assert producer.check_held(clock.monotonic()) == []
    assert producer.blocked_on


def test_a_subscriber_leaving_frees_the_producers_it_held() -> None:
    broker, _ = setup()
    subscriber = broker.open_client(RecordingSink(accepting=False))
    subscriber.subscribe("s", TOPIC, AckMode.AUTO)
    producer_sink = RecordingSink()
    producer = broker.open_client(producer_sink)
    publish(broker, producer, 10)
    assert producer.blocked_on
    subscriber.close()
    assert not producer.blocked_on and producer_sink.unblocks == 1


def test_a_closed_producer_is_forgotten_by_the_queues_it_waited_on() -> None:
    broker, _ = setup()
    subscriber = broker.open_client(RecordingSink(accepting=False))
    subscription = subscriber.subscribe("s", TOPIC, AckMode.AUTO)
    producer_sink = RecordingSink()
    producer = broker.open_client(producer_sink)
    publish(broker, producer, 10)
    producer.close()
    assert subscription.queue.waiters == []
    subscriber.sink.accepting = True  # type: ignore[misc]
    subscriber.resume()
    assert producer_sink.unblocks == 0


def test_a_full_topic_buffer_drops_a_newcomer_of_lower_priority_first() -> None:
    broker, _ = setup(topic_high_water=0, topic_buffer_limit=3)
    sink = RecordingSink(accepting=False)
    subscriber = broker.open_client(sink)
    subscriber.subscribe("s", TOPIC, AckMode.AUTO)
    producer = broker.open_client(RecordingSink())
    for body, priority in [(b"a", 5), (b"b", 5), (b"c", 5), (b"low", 1), (b"d", 5)]:
        producer.send(broker.message(TOPIC, {}, body, priority=priority))
    sink.accepting = True
    subscriber.resume()
    assert sink.bodies == [b"b", b"c", b"d"]  # "low" dropped on arrival, then the oldest "a"


# -- COMMIT follows the same flow-control rule as SEND --------------------------

QUEUE = address("/queue/flow")


def commit(broker: Broker, producer: object, n: int, start: int = 0) -> int:
    producer.begin("t")  # type: ignore[attr-defined]
    for i in range(start, start + n):
        producer.send(broker.message(QUEUE, {}, str(i).encode()), "t")  # type: ignore[attr-defined]
    return producer.commit("t")  # type: ignore[attr-defined, no-any-return]


def test_a_commit_that_would_overfill_a_queue_is_refused_whole_with_send_fail_if_no_space() -> None:
    broker, _ = setup(queue_high_water=10, send_fail_if_no_space=True)
    producer = broker.open_client(RecordingSink())
    commit(broker, producer, 8)
    with pytest.raises(LimitExceeded, match="is full"):
        commit(broker, producer, 3, start=8)  # 8 + 3 would pass the high-water mark of 10
    queue = broker.queue(QUEUE)
    assert queue is not None and queue.depth == 8  # nothing of the refused COMMIT was routed
    assert producer.transactions == {}  # and the refusal aborted it
    assert not producer.blocked_on
    commit(broker, producer, 2, start=8)  # what fits still goes in
    assert queue.depth == 10
    with pytest.raises(LimitExceeded, match="is full"):
        commit(broker, producer, 1)  # and a full queue refuses even one


def test_a_commit_into_a_full_queue_holds_its_producer_like_a_send() -> None:
    broker, _ = setup(queue_high_water=10)
    producer = broker.open_client(RecordingSink())
    commit(broker, producer, 12)
    queue = broker.queue(QUEUE)
    assert queue is not None and queue.depth == 12
    assert producer.blocked_on == {queue: 0}
    assert broker.stats.producer_holds == 1
    consumer = broker.open_client(RecordingSink())
    consumer.subscribe("s", QUEUE, AckMode.AUTO)  # drains it: the producer may go on
    assert not producer.blocked_on


def test_transaction_bytes_are_limited_per_client_and_broker_wide_and_freed_on_commit_abort_close() -> None:
    broker, _ = setup(max_transaction_bytes_per_client=100, max_transaction_bytes_total=150)
    first, second = broker.open_client(RecordingSink()), broker.open_client(RecordingSink())

    def send(client: object, tx: str, size: int) -> None:
        client.send(broker.message(QUEUE, {}, b"x" * size), tx)  # type: ignore[attr-defined]

    first.begin("a")
    first.begin("b")
    send(first, "a", 60)
    with pytest.raises(LimitExceeded, match=r"on this connection hold too many bytes \(limit 100\)"):
        send(first, "b", 41)  # the limit covers all of a connection's transactions
    send(first, "b", 40)
    second.begin("c")
    send(second, "c", 50)
    with pytest.raises(LimitExceeded, match=r"on the broker hold too many bytes \(limit 150\)"):
        send(second, "c", 1)
    first.commit("a")
    send(second, "c", 50)  # the commit freed its 60 bytes
    first.abort("b")
    second.close()
    assert (first.transaction_bytes, broker.transaction_bytes) == (0, 0)
