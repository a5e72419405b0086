"""One door into the core (Broker.publish): a SEND, a COMMIT, an
administrator's send, a dead letter, an expired message moved to the
dead-letter queue and a retained value all enter a destination by the same
rules for targets, flow control, storage and counters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from core.broker import Broker, BrokerSettings
from core.clients import Client
from core.errors import LimitExceeded
from core.messages import Message
from core.names import Address
from core.subscriptions import AckMode
from core.selectors import compile_selector
from tests.support.core_fakes import FakeClock, RecordingSink, RecordingStore, address

Q = address("/queue/orders")
DLQ = address("/queue/DLQ")
T = address("/topic/prices")


def make(clock: FakeClock | None = None, **settings: Any) -> tuple[Broker, RecordingStore]:
    store = RecordingStore()
    return Broker(clock or FakeClock(), BrokerSettings(**settings), node="t", store=store), store


# -- the entries, each putting one message to ``where`` ---------------------
# Each returns the message that entered and the LSN the door gave.


def by_send(broker: Broker, producer: Client, where: Address, persistent: bool = True) -> tuple[Message, int]:
    message = broker.message(where, {}, b"m", persistent=persistent)
    return message, producer.send(message)


def by_commit(broker: Broker, producer: Client, where: Address, persistent: bool = True) -> tuple[Message, int]:
    producer.begin("tx")
    message = broker.message(where, {}, b"m", persistent=persistent)
    producer.send(message, "tx")
    return message, producer.commit("tx")


def by_admin(broker: Broker, producer: Client, where: Address, persistent: bool = True) -> tuple[Message, int]:
    message = broker.message(where, {}, b"m", persistent=persistent)
    return message, broker.publish(message)  # what the admin API's send calls: no producer


Entry = Callable[[Broker, Client, Address, bool], tuple[Message, int]]
PUBLISHING: list[Entry] = [by_send, by_commit, by_admin]
IDS = ["send", "commit", "admin"]


def dead_letter_by_nack(broker: Broker, consumer: Client) -> None:
    """Deliver what waits in /queue/orders and NACK it (max_redeliveries=0: it goes)."""
    subscription = consumer.subscribe("c", Q, AckMode.CLIENT_INDIVIDUAL)
    for message in list(subscription.unacked.values()):
        consumer.nack("c", message.id)


# -- targets -----------------------------------------------------------------


@pytest.mark.parametrize("entry", PUBLISHING, ids=IDS)
def test_every_entry_goes_to_the_topic_subscribers_whose_selector_takes_it(entry: Entry) -> None:
    broker, _ = make()
    takes, refuses = RecordingSink(), RecordingSink()
    broker.open_client(takes).subscribe("a", T, AckMode.AUTO)
    broker.open_client(refuses).subscribe("b", T, AckMode.AUTO, selector=compile_selector("region = 'us'"))
    message, _ = entry(broker, broker.open_client(RecordingSink()), T, False)
    assert takes.ids == [message.id] and refuses.ids == []


@pytest.mark.parametrize("entry", PUBLISHING, ids=IDS)
def test_every_entry_creates_its_queue_within_max_destinations(entry: Entry) -> None:
    broker, _ = make(max_destinations=1)
    producer = broker.open_client(RecordingSink())
    entry(broker, producer, Q, False)
    assert broker.queue(Q) is not None and broker.queue(Q).depth == 1  # type: ignore[union-attr]
    with pytest.raises(LimitExceeded):
        entry(broker, producer, address("/queue/second"), False)
    assert broker.queue(address("/queue/second")) is None


def test_a_dead_letter_goes_to_its_dead_letter_queue_created_on_first_use() -> None:
    broker, _ = make(max_redeliveries=0)
    by_send(broker, broker.open_client(RecordingSink()), Q, False)
    dead_letter_by_nack(broker, broker.open_client(RecordingSink()))
    assert [m.headers["originalDestination"] for m in broker.queues[DLQ].pending] == ["/queue/orders"]  # type: ignore[index]


# -- flow control --------------------------------------------------------------


@pytest.mark.parametrize("entry", PUBLISHING, ids=IDS)
def test_every_entry_is_refused_by_a_full_queue_under_send_fail_if_no_space(entry: Entry) -> None:
    broker, _ = make(queue_high_water=2, send_fail_if_no_space=True)
    producer = broker.open_client(RecordingSink())
    for _ in range(2):
        by_send(broker, producer, Q, False)
    with pytest.raises(LimitExceeded, match="send_fail_if_no_space"):
        entry(broker, producer, Q, False)
    assert broker.queues[Q].depth == 2 and broker.stats.messages_in == 2


@pytest.mark.parametrize("entry", [by_send, by_commit], ids=["send", "commit"])
def test_a_client_entry_into_a_congested_queue_holds_its_producer(entry: Entry) -> None:
    broker, _ = make(queue_high_water=2)
    producer = broker.open_client(RecordingSink())
    by_send(broker, producer, Q, False)
    entry(broker, producer, Q, False)  # the second reaches the high-water mark
    assert producer.blocked_on == {broker.queues[Q]: 0} and broker.stats.producer_holds == 1


def test_an_administrators_send_into_a_congested_queue_enters_and_holds_nobody() -> None:
    broker, _ = make(queue_high_water=1)
    producer = broker.open_client(RecordingSink())
    by_send(broker, producer, Q, False)
    by_admin(broker, producer, Q, False)
    assert broker.queues[Q].depth == 2 and broker.queues[Q].waiters == [producer]


def test_a_dead_letter_is_never_refused_nor_holds_the_consumer_whose_nack_moved_it() -> None:
    # The dead-letter queue is full and refuses SENDs; moving into it must not block.
    broker, _ = make(
        max_redeliveries=0,
        policies=[{"destination": "/queue/DLQ", "queue_high_water": 1, "send_fail_if_no_space": True}],
    )
    producer = broker.open_client(RecordingSink())
    by_send(broker, producer, DLQ, False)
    with pytest.raises(LimitExceeded):
        by_send(broker, producer, DLQ, False)
    for _ in range(2):
        by_send(broker, producer, Q, False)
    consumer = broker.open_client(RecordingSink())
    dead_letter_by_nack(broker, consumer)
    assert broker.queues[DLQ].depth == 3 and not consumer.blocked_on


def test_an_expired_message_moves_into_a_full_dead_letter_queue_too() -> None:
    clock = FakeClock()
    broker, _ = make(clock, policies=[{"destination": "/queue/DLQ", "queue_high_water": 1, "send_fail_if_no_space": True}])
    producer = broker.open_client(RecordingSink())
    by_send(broker, producer, DLQ, False)
    producer.send(broker.message(Q, {}, b"late", persistent=True, expires=clock.wall_ms() + 100))
    clock.advance(0.2)
    assert broker.sweep_expired() == 1
    assert [m.body for m in broker.queues[DLQ].pending] == [b"m", b"late"]


# -- storage -------------------------------------------------------------------


def test_a_send_and_an_administrators_send_are_stored_the_same_way() -> None:
    broker, store = make()
    producer = broker.open_client(RecordingSink())
    sent, lsn = by_send(broker, producer, Q)
    posted, admin_lsn = by_admin(broker, producer, Q)
    assert store.calls == [("add", sent.id, ("/queue/orders",)), ("add", posted.id, ("/queue/orders",))]
    assert (lsn, admin_lsn) == (1, 2)


def test_a_commit_is_stored_as_one_record_with_its_acks() -> None:
    broker, store = make()
    producer = broker.open_client(RecordingSink())
    first, _ = by_send(broker, producer, Q)
    consumer = broker.open_client(RecordingSink())
    consumer.subscribe("c", Q, AckMode.CLIENT_INDIVIDUAL)
    consumer.begin("tx")
    consumer.ack("c", first.id, "tx")
    second = broker.message(Q, {}, b"m", persistent=True)
    consumer.send(second, "tx")
    assert consumer.commit("tx") == store.lsn
    assert store.calls[-1] == ("tx", ((second.id, ("/queue/orders",)),), (("/queue/orders", first.id),))


@pytest.mark.parametrize("entry", PUBLISHING, ids=IDS)
def test_every_entry_to_an_archived_topic_is_archived_and_its_receipt_waits_for_it(entry: Entry) -> None:
    broker, store = make(policies=[{"destination": "/topic/prices", "archive": True}])
    _, lsn = entry(broker, broker.open_client(RecordingSink()), T, True)
    assert lsn == store.lsn > 0
    call = store.calls[-1]
    assert call == ("archive", "prices", b"m") or call[3] == (("prices", b"m"),)  # alone, or in the COMMIT's record


def test_a_dead_letter_of_a_stored_message_is_one_record_with_the_originals_ack() -> None:
    broker, store = make(max_redeliveries=0)
    original, _ = by_send(broker, broker.open_client(RecordingSink()), Q)
    dead_letter_by_nack(broker, broker.open_client(RecordingSink()))
    copy = broker.queues[DLQ].pending.pop()
    assert store.calls[-1] == ("tx", ((copy.id, ("/queue/DLQ",)),), (("/queue/orders", original.id),))


def test_an_expired_stored_message_moves_to_the_dead_letter_queue_in_one_record() -> None:
    clock = FakeClock()
    broker, store = make(clock)
    original = broker.message(Q, {}, b"late", persistent=True, expires=clock.wall_ms() + 100)
    broker.open_client(RecordingSink()).send(original)
    clock.advance(0.2)
    broker.sweep_expired()
    copy = broker.queues[DLQ].pending.pop()
    assert store.calls[-1] == ("tx", ((copy.id, ("/queue/DLQ",)),), (("/queue/orders", original.id),))


def test_a_retained_value_is_stored_and_its_lsn_returned_with_the_publish() -> None:
    broker, store = make()
    producer = broker.open_client(RecordingSink())
    message = broker.message(T, {}, b"21.5", persistent=True)
    assert producer.send(message, retain=True) == store.lsn
    assert store.calls == [("retain", "/topic/prices", b"21.5")]  # no subscriber keeps the message itself


def test_retained_copies_enter_only_the_new_subscription_and_are_not_stored_again() -> None:
    broker, store = make()
    broker.open_client(RecordingSink()).send(broker.message(T, {}, b"21.5"), retain=True)
    store.calls.clear()
    other, late = RecordingSink(), RecordingSink()
    broker.open_client(other).subscribe("o", T, AckMode.AUTO)
    client = broker.open_client(late)
    subscription = client.subscribe("s", T, AckMode.AUTO, start=False)
    client.start(subscription, retained=True)
    assert [(m.body, m.retain) for m in late.messages] == [(b"21.5", True)]
    assert other.messages == [] and store.calls == [] and broker.stats.messages_in == 1


# -- counters --------------------------------------------------------------------


def test_messages_in_counts_every_published_message_and_dead_letters_apart() -> None:
    broker, _ = make(max_redeliveries=0)
    producer = broker.open_client(RecordingSink())
    for entry in PUBLISHING:
        entry(broker, producer, Q, False)
    assert broker.stats.messages_in == 3
    dead_letter_by_nack(broker, broker.open_client(RecordingSink()))
    assert (broker.stats.messages_in, broker.stats.dead_lettered) == (3, 3)
    assert broker.queues[Q].stats.discarded == 3


def test_a_retained_value_past_the_bound_is_routed_counted_and_its_producer_told() -> None:
    broker, _ = make(max_retained_messages=1)
    subscriber = RecordingSink()
    broker.open_client(subscriber).subscribe("s", address("/topic/>"), AckMode.AUTO)
    producer = broker.open_client(RecordingSink())
    producer.send(broker.message(T, {}, b"kept"), retain=True)
    assert producer.retain_refusal is None
    producer.send(broker.message(address("/topic/other"), {}, b"not kept"), retain=True)
    assert producer.retain_refusal is not None and "too many retained messages" in producer.retain_refusal
    assert subscriber.bodies == [b"kept", b"not kept"]
    assert (broker.stats.retained_refused, broker.stats.messages_in, len(broker.retained)) == (1, 2, 1)
