"""What the core asks of the store: persistent messages stored once, acks,
transactions as one record, durable subscriptions, paging, restore."""

from __future__ import annotations

import pytest

from core.broker import Broker, BrokerSettings
from core.durables import durable_key, parse_durable_key
from core.errors import DuplicateSubscription, InvalidDestination
from core.messages import Message
from core.subscriptions import AckMode
from tests.support.core_fakes import FakeClock, RecordingSink, RecordingStore, address

Q = address("/queue/orders")
T = address("/topic/prices.eu")
INDIVIDUAL = AckMode.CLIENT_INDIVIDUAL


def make(**settings: object) -> tuple[Broker, RecordingStore]:
    store = RecordingStore()
    return Broker(FakeClock(), BrokerSettings(**settings), node="t", store=store), store  # type: ignore[arg-type]


def send(broker: Broker, client: object, where=Q, body: bytes = b"x", persistent: bool = True, tx: str | None = None) -> tuple[Message, int]:
    message = broker.message(where, {"h": "v"}, body, persistent=persistent)
    return message, client.send(message, tx)  # type: ignore[attr-defined]


def test_a_persistent_send_to_a_queue_is_stored_under_the_queue_and_returns_its_lsn() -> None:
    broker, store = make()
    producer = broker.open_client(RecordingSink())
    message, lsn = send(broker, producer)
    assert store.calls == [("add", message.id, ("/queue/orders",))]
    assert lsn == store.lsn and message.stored


def test_non_persistent_and_temporary_messages_never_touch_the_store() -> None:
    broker, store = make()
    owner = broker.open_client(RecordingSink())
    owner.subscribe("r", address("/temp-queue/replies"), AckMode.AUTO)
    producer = broker.open_client(RecordingSink())
    assert send(broker, producer, persistent=False)[1] == 0
    reply = owner.temporary(address("/temp-queue/replies"))
    assert send(broker, producer, reply)[1] == 0
    assert send(broker, producer, T)[1] == 0  # a topic with no durable subscriber
    assert store.calls == []


def test_acks_of_stored_messages_are_stored_auto_at_delivery_client_on_ack() -> None:
    broker, store = make()
    producer = broker.open_client(RecordingSink())
    auto = broker.open_client(RecordingSink())
    auto.subscribe("a", Q, AckMode.AUTO)
    first, _ = send(broker, producer)
    assert store.calls[-1] == ("ack", "/queue/orders", first.id)
    auto.close()
    client = broker.open_client(RecordingSink())
    client.subscribe("c", Q, INDIVIDUAL)
    second, _ = send(broker, producer)
    assert store.kinds()[-1] == "add"
    lsn = client.ack("c", second.id)
    assert store.calls[-1] == ("ack", "/queue/orders", second.id) and lsn == store.lsn


def test_a_transaction_is_one_store_record_at_commit() -> None:
    broker, store = make()
    consumer = broker.open_client(RecordingSink())
    consumer.subscribe("c", Q, INDIVIDUAL)
    producer = broker.open_client(RecordingSink())
    delivered, _ = send(broker, producer)
    store.calls.clear()
    consumer.begin("t")
    consumer.ack("c", delivered.id, "t")
    one, _ = send(broker, consumer, tx="t")
    two, _ = send(broker, consumer, address("/queue/other"), tx="t")
    assert store.calls == []  # nothing before COMMIT
    lsn = consumer.commit("t")
    assert store.calls == [
        ("tx", ((one.id, ("/queue/orders",)), (two.id, ("/queue/other",))), (("/queue/orders", delivered.id),))
    ]
    assert lsn == store.lsn


def test_an_aborted_transaction_stores_nothing() -> None:
    broker, store = make()
    producer = broker.open_client(RecordingSink())
    producer.begin("t")
    send(broker, producer, tx="t")
    producer.abort("t")
    assert store.calls == []


def test_a_durable_subscriber_gets_what_was_published_while_it_was_away_in_order() -> None:
    broker, store = make()
    sink = RecordingSink()
    subscriber = broker.open_client(sink, client_id="app")
    subscriber.subscribe("s", T, INDIVIDUAL, durable=("app", "prices"))
    assert store.calls == [("sub", durable_key("app", "prices"), "/topic/prices.eu")]
    assert subscriber.last_lsn == store.lsn
    subscriber.close()
    producer = broker.open_client(RecordingSink())
    sent = [send(broker, producer, T, body=str(i).encode())[0] for i in range(3)]
    # Stored once each, for the durable subscription only.
    assert [c for c in store.calls if c[0] == "add"] == [("add", m.id, (durable_key("app", "prices"),)) for m in sent]
    back_sink = RecordingSink()
    back = broker.open_client(back_sink, client_id="app")
    back.subscribe("s2", T, INDIVIDUAL, durable=("app", "prices"))
    assert back_sink.bodies == [b"0", b"1", b"2"]
    assert sink.bodies == []


def test_a_topic_message_is_stored_once_for_every_durable_subscriber() -> None:
    broker, store = make()
    for name in ("a", "b"):
        broker.open_client(RecordingSink(), client_id=name).subscribe("s", address("/topic/prices.>"), INDIVIDUAL, durable=(name, "n"))
    broker.open_client(RecordingSink()).subscribe("plain", T, AckMode.AUTO)  # not durable: not a key
    message, _ = send(broker, broker.open_client(RecordingSink()), T)
    adds = [c for c in store.calls if c[0] == "add"]
    assert adds == [("add", message.id, (durable_key("a", "n"), durable_key("b", "n")))]


def test_an_active_durable_subscription_cannot_be_taken_twice() -> None:
    broker, _ = make()
    broker.open_client(RecordingSink(), client_id="app").subscribe("s", T, INDIVIDUAL, durable=("app", "n"))
    with pytest.raises(DuplicateSubscription):
        broker.open_client(RecordingSink(), client_id="app").subscribe("s", T, INDIVIDUAL, durable=("app", "n"))


def test_durable_subscriptions_are_for_topics() -> None:
    broker, _ = make()
    with pytest.raises(InvalidDestination):
        broker.open_client(RecordingSink(), client_id="app").subscribe("s", Q, INDIVIDUAL, durable=("app", "n"))


def test_unsubscribing_keeps_a_durable_subscription_unless_asked_to_remove_it() -> None:
    broker, store = make()
    client = broker.open_client(RecordingSink(), client_id="app")
    client.subscribe("s", T, INDIVIDUAL, durable=("app", "n"))
    client.unsubscribe("s")
    assert durable_key("app", "n") in broker.durables
    producer = broker.open_client(RecordingSink())
    send(broker, producer, T)
    client.subscribe("s", T, INDIVIDUAL, durable=("app", "n"))
    lsn = client.unsubscribe("s", remove_durable=True)
    assert store.calls[-1] == ("unsub", durable_key("app", "n")) and lsn == store.lsn
    assert broker.durables == {}
    send(broker, producer, T)
    assert store.kinds()[-1] != "add"  # nobody keeps topic messages now


def test_an_offline_durable_subscription_can_be_removed_by_name() -> None:
    broker, store = make()
    client = broker.open_client(RecordingSink(), client_id="app")
    client.subscribe("s", T, INDIVIDUAL, durable=("app", "n"))
    client.close()
    other = broker.open_client(RecordingSink(), client_id="app")
    other.remove_durable("app", "n")
    assert broker.durables == {} and store.kinds()[-1] == "unsub"


def test_unacked_messages_of_a_durable_subscriber_wait_for_its_return() -> None:
    broker, _ = make()
    client = broker.open_client(RecordingSink(), client_id="app")
    client.subscribe("s", T, INDIVIDUAL, durable=("app", "n"))
    message, _ = send(broker, broker.open_client(RecordingSink()), T)
    client.close()
    sink = RecordingSink()
    broker.open_client(sink, client_id="app").subscribe("s", T, INDIVIDUAL, durable=("app", "n"))
    assert sink.ids == [message.id] and sink.messages[0].redelivered


def test_past_the_resident_limit_bodies_wait_on_disk_and_come_back_on_dispatch() -> None:
    broker, store = make(resident_messages=2)
    producer = broker.open_client(RecordingSink())
    sent = [send(broker, producer, body=str(i).encode())[0] for i in range(5)]
    queue = broker.queues[Q]
    held = list(queue.pending)
    assert [m.body for m in held] == [b"0", b"1", None, None, None]
    sink = RecordingSink()
    broker.open_client(sink).subscribe("c", Q, AckMode.AUTO)
    assert sink.bodies == [b"0", b"1", b"2", b"3", b"4"]
    assert [m.headers for m in sink.messages] == [{"h": "v"}] * 5
    assert store.loads == 3
    assert all(m.body is not None for m in sent)  # the producer's copy was never touched


def test_restore_rebuilds_queues_and_durable_subscriptions() -> None:
    broker, _ = make()
    key = durable_key("app", "n")
    stub = Message("ID-1", Q, None, None, persistent=True, location=0)
    topic_stub = Message("ID-2", T, None, None, persistent=True, location=1)
    broker.restore({key: ("app", "n", T, None, "")}, {"/queue/orders": [stub], key: [topic_stub]})
    assert broker.queues[Q].depth == 1
    assert broker.durables[key].queue.depth == 1
    assert parse_durable_key(key) == ("app", "n")
    assert parse_durable_key("/queue/orders") is None
    assert parse_durable_key(durable_key("a:b", "c:d")) == ("a:b", "c:d")


def backlog(selector: object = None, ack: AckMode = AckMode.AUTO, **settings: object) -> tuple[Broker, RecordingStore, list[Message]]:
    """Five stored messages, the last three paged out; the fourth's record is damaged."""
    broker, store = make(resident_messages=2, **settings)
    producer = broker.open_client(RecordingSink())
    sent = [send(broker, producer, body=str(i).encode())[0] for i in range(5)]
    store.damaged.add(sent[3].location)
    return broker, store, sent


@pytest.mark.parametrize("ack", [AckMode.AUTO, INDIVIDUAL])
def test_a_damaged_record_loses_only_its_message_and_dispatch_goes_on(ack: AckMode) -> None:
    broker, store, sent = backlog()
    sink = RecordingSink()
    broker.open_client(sink).subscribe("c", Q, ack)
    assert sink.bodies == [b"0", b"1", b"2", b"4"]
    # Forgotten in the store too, so a restart does not bring it back.
    assert ("ack", "/queue/orders", sent[3].id) in store.calls
    acked = {call[2] for call in store.calls if call[0] == "ack"}
    assert acked == ({m.id for m in sent} if ack is AckMode.AUTO else {sent[3].id})
    assert broker.queues[Q].depth == 0 and broker.queues[Q].stats.discarded == 1


def test_a_damaged_record_is_dropped_by_a_selective_dispatch_too() -> None:
    from core.selectors import compile_selector

    broker, store, sent = backlog()
    sink = RecordingSink()
    broker.open_client(sink).subscribe("c", Q, AckMode.AUTO, selector=compile_selector("h = 'v'"))
    assert sink.bodies == [b"0", b"1", b"2", b"4"]
    assert ("ack", "/queue/orders", sent[3].id) in store.calls


def test_a_damaged_record_due_for_the_dead_letter_queue_is_only_forgotten() -> None:
    broker, store, sent = backlog(max_redeliveries=0)
    store.damaged.add(sent[0].location)
    queue = broker.queues[Q]
    assert queue.max_redeliveries == 0
    queue.requeue([sent[0].stub()])  # delivered too often: to the DLQ, but its record is unreadable
    assert ("ack", "/queue/orders", sent[0].id) in store.calls
    assert not any(call[0] == "tx" for call in store.calls)


def test_a_paged_out_message_goes_to_the_dead_letter_queue_with_its_body_and_headers() -> None:
    broker, store, sent = backlog(max_redeliveries=0)
    queue = broker.queues[Q]
    queue.requeue([sent[4].stub()])  # as a restart holds it: on disk only
    dead = broker.queues[address("/queue/DLQ")]
    [letter] = list(dead.pending)
    assert letter.body == b"4" and letter.headers is not None
    assert letter.headers["h"] == "v" and letter.headers["originalMessageId"] == sent[4].id
