"""Retrying dead letters (core.deadletters): an operator moves messages from
a dead-letter queue back to where they came from, atomically in the store,
without the dead-letter headers and with a fresh redelivery count."""

from __future__ import annotations

from typing import Any

from core import deadletters
from core.broker import Broker, BrokerSettings
from core.subscriptions import AckMode
from tests.support.core_fakes import FakeClock, RecordingSink, RecordingStore, address

Q = address("/queue/orders")
OTHER = address("/queue/other")
DLQ = address("/queue/DLQ")


def make(**settings: Any) -> tuple[Broker, RecordingStore]:
    store = RecordingStore()
    return Broker(FakeClock(), BrokerSettings(max_redeliveries=0, **settings), node="t", store=store), store


def dead_letter(broker: Broker, where: Any, body: bytes, persistent: bool = True) -> None:
    """Send ``body`` to ``where`` and NACK it into the DLQ (max_redeliveries=0)."""
    broker.open_client(RecordingSink()).send(broker.message(where, {"k": "v"}, body, persistent=persistent))
    consumer = broker.open_client(RecordingSink())
    subscription = consumer.subscribe("c", where, AckMode.CLIENT_INDIVIDUAL)
    for message in list(subscription.unacked.values()):
        consumer.nack("c", message.id)
    consumer.close()


def test_a_retried_dead_letter_goes_back_to_its_queue_as_it_was_sent() -> None:
    broker, store = make()
    dead_letter(broker, Q, b"one")
    dead_letter(broker, OTHER, b"two")
    dlq = broker.queues[DLQ]
    assert dlq.depth == 2
    dead = {m.body: m for m in dlq.pending}

    result = deadletters.retry(broker, dlq)

    assert (result.moved, result.skipped, dlq.depth) == (2, 0, 0)
    back = list(broker.queues[Q].pending)
    assert [m.body for m in back] == [b"one"] and [m.body for m in broker.queues[OTHER].pending] == [b"two"]
    assert back[0].headers == {"k": "v"} and back[0].redeliveries == 0 and back[0].persistent
    # one store record each: the copy's add with the dead letter's ack
    tx = [call for call in store.calls if call[0] == "tx" and call[2] == (("/queue/DLQ", dead[b"one"].id),)]
    assert len(tx) == 1 and tx[0][1] == ((back[0].id, ("/queue/orders",)),)


def test_a_consumer_of_the_original_queue_gets_the_retried_message() -> None:
    broker, _ = make()
    dead_letter(broker, Q, b"again")
    sink = RecordingSink()
    broker.open_client(sink).subscribe("s", Q, AckMode.AUTO)
    deadletters.retry(broker, broker.queues[DLQ])
    assert sink.bodies == [b"again"]


def test_only_the_chosen_messages_move_and_the_rest_keep_their_order() -> None:
    broker, _ = make()
    for body in (b"a", b"b", b"c"):
        dead_letter(broker, Q, body, persistent=False)
    dlq = broker.queues[DLQ]
    chosen = [m.id for m in dlq.pending if m.body == b"b"]
    assert deadletters.retry(broker, dlq, chosen).moved == 1
    assert [m.body for m in dlq.pending] == [b"a", b"c"]
    assert [m.body for m in broker.queues[Q].pending] == [b"b"]


def test_a_message_with_no_original_destination_stays() -> None:
    broker, _ = make()
    broker.publish(broker.message(DLQ, {}, b"sent here directly"))
    result = deadletters.retry(broker, broker.queues[DLQ])
    assert (result.moved, result.skipped, broker.queues[DLQ].depth) == (0, 1, 1)


def test_a_topic_subscribers_dead_letter_is_not_published_to_every_subscriber_again() -> None:
    broker, _ = make()
    topic = address("/topic/prices")
    failing, other = RecordingSink(), RecordingSink()
    broker.open_client(other).subscribe("o", topic, AckMode.AUTO)
    consumer = broker.open_client(failing)
    subscription = consumer.subscribe("f", topic, AckMode.CLIENT_INDIVIDUAL)
    broker.open_client(RecordingSink()).send(broker.message(topic, {}, b"tick"))
    consumer.nack("f", next(iter(subscription.unacked)))
    dlq = broker.queues[DLQ]
    assert [m.headers["originalDestination"] for m in dlq.pending] == ["/topic/prices"]  # type: ignore[index]
    result = deadletters.retry(broker, dlq)
    assert (result.moved, result.skipped, dlq.depth) == (0, 1, 1)
    assert other.bodies == [b"tick"]  # once, not again


def test_a_full_destination_stops_the_retry_and_the_rest_stay() -> None:
    broker, _ = make(queue_high_water=1, send_fail_if_no_space=True)
    for body in (b"a", b"b"):
        dead_letter(broker, Q, body, persistent=False)
    broker.publish(broker.message(Q, {}, b"fills it"))
    dlq = broker.queues[DLQ]
    result = deadletters.retry(broker, dlq)
    assert result.moved == 0 and "/queue/orders" in result.reason
    assert [m.body for m in dlq.pending] == [b"a", b"b"]
