"""The broker through its door: method calls in, Sink deliveries out.

Pure synchronous tests with a RecordingSink and a FakeClock; no Trio, no sockets.
"""

from __future__ import annotations

from typing import Any

import pytest

from core.broker import Broker, BrokerSettings, Client
from core.errors import (
    DuplicateSubscription,
    InvalidDestination,
    LimitExceeded,
    NotAuthorized,
    TransactionExists,
    UnknownMessage,
    UnknownSubscription,
    UnknownTransaction,
)
from core.messages import Message
from core.names import Address
from core.subscriptions import AckMode
from tests.core_fakes import FakeClock, RecordingSink, address

Q = address("/queue/q")
AUTO, CLIENT, INDIVIDUAL = AckMode.AUTO, AckMode.CLIENT, AckMode.CLIENT_INDIVIDUAL


class World:
    """A broker with a producer client, and helpers to open consumers."""

    def __init__(self, **settings: Any) -> None:
        self.clock = FakeClock()
        self.broker = Broker(self.clock, BrokerSettings(**settings), node="test")
        self.producer_sink = RecordingSink()
        self.producer = self.broker.open_client(self.producer_sink)

    def consumer(
        self,
        token: Any = "s",
        where: Address = Q,
        mode: AckMode = AUTO,
        prefetch: int | None = None,
        *,
        accepting: bool = True,
    ) -> tuple[Client, RecordingSink]:
        sink = RecordingSink(accepting=accepting)
        client = self.broker.open_client(sink)
        client.subscribe(token, where, mode, prefetch)
        return client, sink

    def send(
        self,
        body: bytes | str,
        where: Address = Q,
        *,
        priority: int = 4,
        transaction: str | None = None,
        client: Client | None = None,
    ) -> Message:
        if isinstance(body, str):
            body = body.encode()
        message = self.broker.message(where, {"k": "v"}, body, priority=priority)
        (client or self.producer).send(message, transaction)
        return message


@pytest.fixture
def world() -> World:
    return World()


# -- messages and queues -------------------------------------------------------


def test_messages_get_unique_ids_and_the_clock_time(world: World) -> None:
    first = world.broker.message(Q, {}, b"")
    world.clock.advance(2.5)
    second = world.broker.message(Q, {}, b"", priority=7, expires=99)
    assert first.id != second.id
    assert ":" not in first.id  # STOMP 1.1+ would have to escape it
    assert first.timestamp == 1_700_000_000_000
    assert second.timestamp == 1_700_000_002_500
    assert (second.priority, second.expires, second.redeliveries) == (7, 99, 0)
    assert not second.redelivered


def test_queue_is_fifo_for_messages_sent_before_and_after_subscribing(world: World) -> None:
    for body in "abc":
        world.send(body)
    queue = world.broker.queue(Q)
    assert queue is not None and queue.depth == 3
    _, sink = world.consumer()
    for body in "de":
        world.send(body)
    assert sink.bodies == [b"a", b"b", b"c", b"d", b"e"]
    assert queue.depth == 0
    assert queue.stats.enqueued == 5


def test_each_queue_message_goes_to_one_consumer_round_robin(world: World) -> None:
    sinks = [world.consumer(f"c{i}", mode=INDIVIDUAL, prefetch=10)[1] for i in range(3)]
    for i in range(7):
        world.send(str(i))
    assert [s.bodies for s in sinks] == [[b"0", b"3", b"6"], [b"1", b"4"], [b"2", b"5"]]


def test_round_robin_skips_consumers_without_room(world: World) -> None:
    _, full = world.consumer("full", mode=INDIVIDUAL, prefetch=1)
    _, busy = world.consumer("busy", mode=AUTO, accepting=False)
    _, free = world.consumer("free", mode=INDIVIDUAL, prefetch=10)
    for i in range(4):
        world.send(str(i))
    assert full.bodies == [b"0"]
    assert busy.bodies == []
    assert free.bodies == [b"1", b"2", b"3"]


@pytest.mark.parametrize("mode", [CLIENT, INDIVIDUAL])
def test_prefetch_window_stops_delivery_until_an_ack(world: World, mode: AckMode) -> None:
    client, sink = world.consumer(mode=mode, prefetch=2)
    sent = [world.send(str(i)) for i in range(5)]
    queue = world.broker.queue(Q)
    assert queue is not None
    assert sink.bodies == [b"0", b"1"]
    assert queue.depth == 3
    assert list(client.subscription("s").unacked) == [sent[0].id, sent[1].id]
    client.ack("s", sent[0].id)
    assert sink.bodies == [b"0", b"1", b"2"]
    assert len(client.subscription("s").unacked) == 2
    client.ack("s", sent[1].id)
    client.ack("s", sent[2].id)
    assert sink.bodies == [b"0", b"1", b"2", b"3", b"4"]
    assert queue.depth == 0
    assert queue.stats.dequeued == 3


def test_default_prefetch_comes_from_settings() -> None:
    world = World(default_prefetch=3)
    client, sink = world.consumer(mode=INDIVIDUAL)
    for i in range(5):
        world.send(str(i))
    assert len(sink.deliveries) == 3
    assert client.subscription("s").prefetch == 3


def test_auto_mode_delivers_everything_at_once_and_counts_it_dequeued(world: World) -> None:
    client, sink = world.consumer(mode=AUTO, prefetch=1)
    sent = [world.send(str(i)) for i in range(5)]
    queue = world.broker.queue(Q)
    assert queue is not None
    assert sink.ids == [m.id for m in sent]
    assert queue.stats.dequeued == 5
    assert client.subscription("s").unacked == {}
    with pytest.raises(UnknownMessage):
        client.ack("s", sent[0].id)


@pytest.mark.parametrize("mode", [AUTO, CLIENT, INDIVIDUAL])
def test_a_sink_that_is_not_accepting_leaves_messages_queued_until_resume(world: World, mode: AckMode) -> None:
    client, sink = world.consumer(mode=mode, prefetch=100, accepting=False)
    for i in range(3):
        world.send(str(i))
    queue = world.broker.queue(Q)
    assert queue is not None
    assert sink.deliveries == [] and queue.depth == 3
    client.resume()  # still not accepting: nothing moves
    assert sink.deliveries == [] and queue.depth == 3
    sink.accepting = True
    assert sink.deliveries == []  # nothing moves until the connection says so
    client.resume()
    assert sink.bodies == [b"0", b"1", b"2"]
    assert queue.depth == 0


def test_cumulative_ack_in_client_mode(world: World) -> None:
    client, _ = world.consumer(mode=CLIENT, prefetch=10)
    sent = [world.send(str(i)) for i in range(4)]
    client.ack("s", sent[2].id)
    assert list(client.subscription("s").unacked) == [sent[3].id]
    queue = world.broker.queue(Q)
    assert queue is not None and queue.stats.dequeued == 3
    with pytest.raises(UnknownMessage):
        client.ack("s", sent[0].id)


def test_individual_ack_in_client_individual_mode(world: World) -> None:
    client, _ = world.consumer(mode=INDIVIDUAL, prefetch=10)
    sent = [world.send(str(i)) for i in range(4)]
    client.ack("s", sent[2].id)
    assert list(client.subscription("s").unacked) == [sent[0].id, sent[1].id, sent[3].id]
    queue = world.broker.queue(Q)
    assert queue is not None and queue.stats.dequeued == 1
    with pytest.raises(UnknownMessage):
        client.ack("s", sent[2].id)


def test_ack_and_nack_need_a_known_subscription(world: World) -> None:
    client, _ = world.consumer(mode=INDIVIDUAL)
    message = world.send("a")
    with pytest.raises(UnknownSubscription):
        client.ack("nope", message.id)
    with pytest.raises(UnknownSubscription):
        client.nack("nope", message.id)
    with pytest.raises(UnknownMessage):
        client.nack("s", "ID-unknown")


def test_nack_requeues_a_copy_at_the_head_with_one_more_delivery(world: World) -> None:
    client, sink = world.consumer(mode=INDIVIDUAL, prefetch=1)
    first, second = world.send("1"), world.send("2")
    client.nack("s", first.id)
    assert sink.bodies == [b"1", b"1"]  # ahead of "2", which was queued first
    again = sink.messages[1]
    assert again is not first
    assert again.id == first.id and again.body == first.body and again.priority == first.priority
    assert again.redeliveries == 1 and again.redelivered
    assert first.redeliveries == 0 and not first.redelivered  # the original is untouched
    queue = world.broker.queue(Q)
    assert queue is not None and queue.stats.redelivered == 1
    client.nack("s", again.id)
    assert sink.messages[2].redeliveries == 2
    client.ack("s", first.id)
    assert sink.messages[3] is second


def test_nack_in_client_mode_requeues_everything_up_to_it_in_order(world: World) -> None:
    client, sink = world.consumer(mode=CLIENT, prefetch=2)
    sent = [world.send(str(i)) for i in range(3)]
    client.nack("s", sent[1].id)
    assert sink.bodies == [b"0", b"1", b"0", b"1"]
    assert [m.redeliveries for m in sink.messages] == [0, 0, 1, 1]
    queue = world.broker.queue(Q)
    assert queue is not None and [m.body for m in queue.pending] == [b"2"]


def test_unsubscribe_requeues_unacked_to_other_consumers_as_redelivered(world: World) -> None:
    a, a_sink = world.consumer("a", mode=CLIENT, prefetch=2)
    sent = [world.send(str(i)) for i in range(3)]
    b, b_sink = world.consumer("b", mode=INDIVIDUAL, prefetch=10)
    assert b_sink.bodies == [b"2"]
    assert a.unsubscribe("a") == 0
    assert b_sink.bodies == [b"2", b"0", b"1"]
    assert [m.redeliveries for m in b_sink.messages] == [0, 1, 1]
    assert sent[0].redeliveries == 0
    assert len(a_sink.deliveries) == 2
    with pytest.raises(UnknownSubscription):
        a.unsubscribe("a")
    # The queue no longer offers anything to the unsubscribed consumer.
    world.send("3")
    assert len(a_sink.deliveries) == 2 and b_sink.bodies[-1] == b"3"


def test_close_requeues_unacked_to_other_consumers_and_is_idempotent(world: World) -> None:
    a, a_sink = world.consumer("a", mode=INDIVIDUAL, prefetch=5)
    world.send("0")
    world.send("1")
    _, b_sink = world.consumer("b", mode=INDIVIDUAL, prefetch=5)
    assert world.broker.statistics()["clients"] == 3
    a.close()
    a.close()
    assert b_sink.bodies == [b"0", b"1"]
    assert all(m.redeliveries == 1 for m in b_sink.messages)
    assert a.closed and a.subscriptions == {}
    assert world.broker.statistics()["clients"] == 2
    assert world.broker.statistics()["queues"]["/queue/q"] == (0, 1)
    assert len(a_sink.deliveries) == 2


def test_unacked_messages_wait_in_the_queue_when_nobody_is_left(world: World) -> None:
    a, _ = world.consumer(mode=INDIVIDUAL, prefetch=5)
    world.send("0")
    a.close()
    queue = world.broker.queue(Q)
    assert queue is not None and [m.redeliveries for m in queue.pending] == [1]
    _, sink = world.consumer("later", mode=AUTO)
    assert sink.bodies == [b"0"] and sink.messages[0].redelivered


def test_duplicate_subscription_token_is_refused(world: World) -> None:
    client, _ = world.consumer("s")
    with pytest.raises(DuplicateSubscription):
        client.subscribe("s", address("/queue/other"), AUTO)
    assert client.subscription("s").address == Q


# -- topics ------------------------------------------------------------------


def test_topic_fans_out_to_every_matching_subscription(world: World) -> None:
    patterns = ["/topic/a.b", "/topic/a.*", "/topic/a.>", "/topic/>", "/topic/*.b", "/topic/a"]
    sinks = {p: world.consumer(p, address(p))[1] for p in patterns}
    _, other = world.consumer("x", address("/topic/x.b.c"))
    _, temp = world.consumer("t", address("/temp-topic/a.b"))
    message = world.send("hi", address("/topic/a.b"))
    for pattern, sink in sinks.items():
        expected = [] if pattern == "/topic/a" else [message]
        assert sink.messages == expected, pattern
        if expected:
            assert sink.messages[0] is message  # shared, not copied
    assert other.deliveries == [] and temp.deliveries == []
    world.send("deep", address("/topic/a.b.c"))
    assert [p for p, s in sinks.items() if s.bodies[-1:] == [b"deep"]] == ["/topic/a.>", "/topic/>"]


def test_one_client_with_overlapping_topic_subscriptions_gets_one_copy_per_subscription(world: World) -> None:
    sink = RecordingSink()
    client = world.broker.open_client(sink)
    client.subscribe(1, address("/topic/a.b"), AUTO)
    client.subscribe(2, address("/topic/a.*"), AUTO)
    world.send("x", address("/topic/a.b"))
    assert sorted(token for token, _ in sink.deliveries) == [1, 2]


def test_topic_message_without_subscribers_is_dropped(world: World) -> None:
    world.send("nobody", address("/topic/a"))
    _, sink = world.consumer("late", address("/topic/a"))
    assert sink.deliveries == []
    assert world.broker.statistics()["messages_in"] == 1


def test_topic_subscription_acks_and_prefetch_work_like_a_queue(world: World) -> None:
    topic = address("/topic/t")
    client, sink = world.consumer("s", topic, INDIVIDUAL, prefetch=1)
    first = world.send("1", topic)
    world.send("2", topic)
    assert sink.bodies == [b"1"]
    client.ack("s", first.id)
    assert sink.bodies == [b"1", b"2"]


def test_unsubscribed_topic_subscription_gets_nothing_more(world: World) -> None:
    topic = address("/topic/t")
    client, sink = world.consumer("s", topic, INDIVIDUAL, prefetch=1)
    world.send("1", topic)
    world.send("2", topic)
    client.unsubscribe("s")
    world.send("3", topic)
    assert sink.bodies == [b"1"]
    _, again = world.consumer("s2", topic)
    assert again.deliveries == []  # a non-durable subscription's backlog is gone


def test_topic_buffer_limit_discards_the_oldest_and_counts_it() -> None:
    world = World(topic_buffer_limit=3)
    topic = address("/topic/t")
    client, sink = world.consumer("s", topic, accepting=False)
    for i in range(5):
        world.send(str(i), topic)
    private = client.subscription("s").queue
    assert private.depth == 3
    assert private.stats.discarded == 2
    sink.accepting = True
    client.resume()
    assert sink.bodies == [b"2", b"3", b"4"]


def test_topic_buffer_limit_discards_lowest_priority_first() -> None:
    world = World(topic_buffer_limit=3)
    topic = address("/topic/t")
    client, sink = world.consumer("s", topic, accepting=False)
    world.send("low-old", topic, priority=1)
    world.send("high", topic, priority=9)
    world.send("low-new", topic, priority=1)
    world.send("mid", topic, priority=5)
    private = client.subscription("s").queue
    assert private.stats.discarded == 1
    sink.accepting = True
    client.resume()
    assert sink.bodies == [b"high", b"mid", b"low-new"]


# -- priority ----------------------------------------------------------------


def test_priority_order_with_fifo_within_a_priority(world: World) -> None:
    client, sink = world.consumer(accepting=False)
    for body, priority in [("4a", 4), ("9a", 9), ("0a", 0), ("9b", 9), ("4b", 4), ("7a", 7), ("0b", 0)]:
        world.send(body, priority=priority)
    sink.accepting = True
    client.resume()
    assert sink.bodies == [b"9a", b"9b", b"7a", b"4a", b"4b", b"0a", b"0b"]


def test_redelivered_message_goes_ahead_of_its_priority_only(world: World) -> None:
    client, sink = world.consumer(mode=INDIVIDUAL, prefetch=1)
    low = world.send("low", priority=1)
    world.send("high", priority=8)
    world.send("low2", priority=1)
    client.nack("s", low.id)
    assert sink.bodies == [b"low", b"high"]
    client.ack("s", sink.ids[-1])
    assert sink.bodies[-1] == b"low" and sink.messages[-1].redeliveries == 1


# -- transactions ------------------------------------------------------------


def test_transactional_sends_are_invisible_until_commit(world: World) -> None:
    _, sink = world.consumer()
    world.producer.begin("t")
    world.send("1", transaction="t")
    world.send("2", transaction="t")
    world.send("plain")
    assert sink.bodies == [b"plain"]
    assert world.producer.commit("t") == 0
    assert sink.bodies == [b"plain", b"1", b"2"]
    assert "t" not in world.producer.transactions


def test_aborted_sends_are_discarded(world: World) -> None:
    _, sink = world.consumer()
    world.producer.begin("t")
    world.send("1", transaction="t")
    world.producer.abort("t")
    world.send("2")
    assert sink.bodies == [b"2"]
    with pytest.raises(UnknownTransaction):
        world.producer.commit("t")


def test_transactional_acks_free_credit_at_once_and_settle_on_commit(world: World) -> None:
    client, sink = world.consumer(mode=INDIVIDUAL, prefetch=1)
    first = world.send("1")
    world.send("2")
    queue = world.broker.queue(Q)
    assert queue is not None
    client.begin("t")
    client.ack("s", first.id, "t")
    assert sink.bodies == [b"1", b"2"]  # credit came back with the ack
    assert queue.stats.dequeued == 0
    client.commit("t")
    assert queue.stats.dequeued == 1
    client.ack("s", sink.ids[1])
    assert sink.bodies == [b"1", b"2"]  # "1" never comes back


def test_transactional_acks_are_requeued_on_abort(world: World) -> None:
    client, sink = world.consumer(mode=CLIENT, prefetch=5)
    sent = [world.send(str(i)) for i in range(3)]
    client.begin("t")
    client.ack("s", sent[1].id, "t")
    assert list(client.subscription("s").unacked) == [sent[2].id]
    client.abort("t")
    assert sink.bodies == [b"0", b"1", b"2", b"0", b"1"]
    assert [m.redeliveries for m in sink.messages[3:]] == [1, 1]
    queue = world.broker.queue(Q)
    assert queue is not None and queue.stats.dequeued == 0


@pytest.mark.parametrize("end", ["commit", "abort"])
def test_transactional_nacks_are_requeued_at_the_end(world: World, end: str) -> None:
    client, sink = world.consumer(mode=INDIVIDUAL, prefetch=1)
    first = world.send("1")
    client.begin("t")
    client.nack("s", first.id, "t")
    assert sink.bodies == [b"1"]
    getattr(client, end)("t")
    assert sink.bodies == [b"1", b"1"]
    assert sink.messages[1].redeliveries == 1


def test_transaction_errors(world: World) -> None:
    client, _ = world.consumer(mode=INDIVIDUAL)
    message = world.send("1")
    for call in (
        lambda: client.commit("t"),
        lambda: client.abort("t"),
        lambda: client.send(world.broker.message(Q, {}, b""), "t"),
        lambda: client.ack("s", message.id, "t"),
        lambda: client.nack("s", message.id, "t"),
    ):
        with pytest.raises(UnknownTransaction):
            call()
    assert list(client.subscription("s").unacked) == [message.id]  # the failed ack took nothing
    client.begin("t")
    with pytest.raises(TransactionExists):
        client.begin("t")


def test_close_discards_open_transactional_sends(world: World) -> None:
    _, sink = world.consumer()
    world.producer.begin("t")
    world.send("1", transaction="t")
    world.producer.close()
    assert sink.deliveries == []
    assert world.producer.transactions == {}


def test_close_rolls_back_transactional_acks_to_the_other_consumers_once(world: World) -> None:
    a, a_sink = world.consumer("a", mode=INDIVIDUAL, prefetch=10)
    message = world.send("1")
    a.begin("t")
    a.ack("a", message.id, "t")
    _, b_sink = world.consumer("b", mode=INDIVIDUAL, prefetch=10)
    a.close()
    # The closing client gets nothing more; the message reaches B redelivered once.
    assert a_sink.messages == [message]
    assert b_sink.ids == [message.id]
    assert b_sink.messages[0].redeliveries == 1


# -- limits ------------------------------------------------------------------


def test_max_transactions_per_client() -> None:
    world = World(max_transactions_per_client=2)
    world.producer.begin("t1")
    world.producer.begin("t2")
    with pytest.raises(LimitExceeded):
        world.producer.begin("t3")
    assert set(world.producer.transactions) == {"t1", "t2"}
    world.producer.commit("t1")
    world.producer.begin("t3")
    other = world.broker.open_client(RecordingSink())
    other.begin("t1")  # the limit is per client


def test_max_transaction_messages() -> None:
    world = World(max_transaction_messages=2)
    _, sink = world.consumer()
    world.producer.begin("t")
    world.send("1", transaction="t")
    world.send("2", transaction="t")
    with pytest.raises(LimitExceeded):
        world.send("3", transaction="t")
    world.producer.commit("t")
    assert sink.bodies == [b"1", b"2"]


@pytest.mark.parametrize("verb", ["ack", "nack"])
def test_refused_transactional_ack_over_the_size_limit_leaves_the_message_unacked(verb: str) -> None:
    world = World(max_transaction_messages=1)
    client, _ = world.consumer(mode=INDIVIDUAL, prefetch=10)
    first, second = world.send("1"), world.send("2")
    client.begin("t")
    getattr(client, verb)("s", first.id, "t")
    with pytest.raises(LimitExceeded):
        getattr(client, verb)("s", second.id, "t")
    # The refused ACK/NACK changed nothing: the message is still awaiting acknowledgement.
    assert list(client.subscription("s").unacked) == [second.id]


def test_max_subscriptions_per_client() -> None:
    world = World(max_subscriptions_per_client=2)
    sink = RecordingSink()
    client = world.broker.open_client(sink)
    client.subscribe(1, Q, AUTO)
    client.subscribe(2, address("/topic/t"), AUTO)
    with pytest.raises(LimitExceeded):
        client.subscribe(3, Q, AUTO)
    assert set(client.subscriptions) == {1, 2}
    client.unsubscribe(1)
    client.subscribe(3, Q, AUTO)
    world.consumer("other")  # the limit is per client


def test_max_destinations() -> None:
    world = World(max_destinations=2)
    world.send("a", address("/queue/a"))
    world.consumer("b", address("/queue/b"))
    with pytest.raises(LimitExceeded):
        world.send("c", address("/queue/c"))
    with pytest.raises(LimitExceeded):
        world.consumer("c", address("/queue/c"))
    assert set(world.broker.statistics()["queues"]) == {"/queue/a", "/queue/b"}
    world.send("a2", address("/queue/a"))  # existing destinations still work
    world.consumer("t", address("/topic/t"))  # topics are not destinations held by the broker
    queue = world.broker.queue(address("/queue/a"))
    assert queue is not None and queue.depth == 2


def test_commit_is_all_or_nothing_when_a_limit_stops_it() -> None:
    world = World(max_destinations=1)
    _, sink = world.consumer("a", address("/queue/a"))
    world.producer.begin("t")
    world.send("to-a", address("/queue/a"), transaction="t")
    world.send("to-b", address("/queue/b"), transaction="t")  # a destination that cannot be created
    with pytest.raises(LimitExceeded):
        world.producer.commit("t")
    assert sink.deliveries == []  # nothing of a failed commit is visible


# -- temporary destinations --------------------------------------------------


def test_each_client_gets_its_own_temporary_queue_for_the_same_name() -> None:
    # Changed requirement: a second connection using a taken temporary name used
    # to be refused; now, as in ActiveMQ and RabbitMQ, the name is per connection.
    world = World()
    reply = address("/temp-queue/reply")
    first, first_sink = world.consumer("r", reply)
    second, second_sink = world.consumer("r", reply)
    mine, theirs = first.temporary(reply), second.temporary(reply)
    assert mine != theirs and mine.text.startswith("/temp-queue/reply.~") and mine.is_queue
    assert world.broker.queue(mine) is not None and world.broker.queue(theirs) is not None
    to_first = world.send("for first", mine)  # a responder replies to the private name
    to_second = world.send("for second", theirs)
    assert first_sink.messages == [to_first]
    assert second_sink.messages == [to_second]


def test_only_the_owner_reads_a_private_temporary_name() -> None:
    world = World()
    reply = address("/temp-queue/reply")
    owner, _ = world.consumer("r", reply)
    private = owner.temporary(reply)
    other = world.broker.open_client(RecordingSink())
    with pytest.raises(NotAuthorized):
        other.subscribe("r", private, AUTO)
    assert other.subscriptions == {}
    assert other.temporary(private) is private  # forwarding someone's reply-to is fine
    assert other.temporaries == {}
    owner.subscribe("r2", private, AUTO)  # the owner may use either name


def test_declared_temporary_queue_is_claimed_before_subscribing() -> None:
    world = World()
    reply = address("/temp-queue/reply")
    sink = RecordingSink()
    owner = world.broker.open_client(sink)
    private = owner.temporary(reply)
    assert world.broker.queue(private) is not None
    world.send("early", private)
    assert sink.deliveries == []
    owner.subscribe("r", reply, AUTO)
    assert sink.bodies == [b"early"]


def test_temporary_topics_are_per_client_too() -> None:
    world = World()
    temp = address("/temp-topic/events")
    first, first_sink = world.consumer("t", temp)
    _, second_sink = world.consumer("t", temp)
    message = world.send("e", first.temporary(temp))
    assert first_sink.messages == [message]
    assert second_sink.deliveries == []


def test_a_send_to_a_plain_temporary_name_goes_to_the_senders_own_destination() -> None:
    world = World()
    reply = address("/temp-queue/reply")
    _, owner_sink = world.consumer("r", reply)
    message = world.send("to myself", reply)  # the producer's own /temp-queue/reply
    assert owner_sink.deliveries == []
    queue = world.broker.queue(world.producer.temporaries[reply])
    assert queue is not None and queue.depth == 1 and message.address is queue.address


def test_close_releases_temporary_queue_with_its_pending_messages() -> None:
    world = World()
    reply = address("/temp-queue/reply")
    owner, _ = world.consumer("r", reply, INDIVIDUAL, prefetch=1)
    private = owner.temporary(reply)
    for i in range(3):
        world.send(str(i), private)
    queue = world.broker.queue(private)
    assert queue is not None and queue.depth == 2
    owner.close()
    assert world.broker.queue(private) is None
    assert not any(name.startswith("/temp-queue/") for name in world.broker.statistics()["queues"])
    assert queue.stats.discarded == 3  # two pending and the one left unacked
    assert queue.depth == 0
    # A new client with the same name starts empty, on a queue of its own.
    _, fresh = world.consumer("r", reply)
    assert fresh.deliveries == []


def test_sends_to_a_released_temporary_queue_are_discarded_and_counted() -> None:
    world = World()
    reply = address("/temp-queue/reply")
    owner, _ = world.consumer("r", reply)
    private = owner.temporary(reply)
    owner.close()
    world.send("late", private)
    assert world.broker.queue(private) is None
    assert world.producer.temporaries == {}  # a reply to a gone owner claims nothing
    stats = world.broker.statistics()
    assert stats["messages_discarded"] == 1
    assert stats["messages_in"] == 1


def test_temporaries_are_capped_per_client_and_do_not_use_up_destinations() -> None:
    world = World(max_temporaries_per_client=2, max_destinations=1)
    greedy = world.broker.open_client(RecordingSink())
    greedy.temporary(address("/temp-queue/a"))
    greedy.temporary(address("/temp-topic/b"))
    with pytest.raises(LimitExceeded, match=r"too many temporary destinations on this connection \(limit 2\)"):
        greedy.temporary(address("/temp-queue/c"))
    greedy.temporary(address("/temp-queue/a"))  # its own names still work
    world.consumer("q", address("/queue/work"))  # the broker-wide limit is untouched
    world.consumer("r", address("/temp-queue/a"))  # and so are other clients' temporaries
    greedy.close()
    greedy = world.broker.open_client(RecordingSink())
    greedy.temporary(address("/temp-queue/c"))


# -- wildcards ---------------------------------------------------------------


@pytest.mark.parametrize("text", ["/queue/a.*", "/queue/>", "/temp-queue/*"])
def test_wildcard_queue_subscription_is_refused(world: World, text: str) -> None:
    client = world.broker.open_client(RecordingSink())
    with pytest.raises(InvalidDestination):
        client.subscribe("s", address(text), AUTO)
    assert client.subscriptions == {}
    assert world.broker.queues == {}


@pytest.mark.parametrize("text", ["/queue/a.*", "/topic/a.>", "/topic/*", "/temp-topic/>"])
def test_sending_to_a_wildcard_is_refused(world: World, text: str) -> None:
    with pytest.raises(InvalidDestination):
        world.broker.message(address(text), {}, b"")


def test_errors_carry_a_reason(world: World) -> None:
    client = world.broker.open_client(RecordingSink())
    with pytest.raises(UnknownSubscription) as info:
        client.unsubscribe("missing")
    assert "missing" in info.value.reason
    assert str(info.value) == info.value.reason
