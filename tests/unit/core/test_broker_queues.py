"""The broker's queues: unique message ids, FIFO and priority order, round
robin between consumers, prefetch windows and sinks that are not accepting.

Pure synchronous tests through the broker's door: method calls in, Sink
deliveries out, with a RecordingSink and a FakeClock; no Trio, no sockets.
"""

from __future__ import annotations

import pytest

from core.errors import UnknownMessage
from core.subscriptions import AckMode
from tests.support.core_fakes import AUTO, CLIENT, INDIVIDUAL, Q, World


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
