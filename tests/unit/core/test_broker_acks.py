"""The broker's acknowledgements: cumulative and individual ACKs, NACKs that
requeue, redelivery when a consumer unsubscribes or closes, and the errors
for unknown subscriptions and messages.

Pure synchronous tests through the broker's door: method calls in, Sink
deliveries out, with a RecordingSink and a FakeClock; no Trio, no sockets.
"""

from __future__ import annotations

import pytest

from core.errors import DuplicateSubscription, UnknownMessage, UnknownSubscription
from tests.support.core_fakes import AUTO, CLIENT, INDIVIDUAL, Q, RecordingSink, World, address


# -- acks, nacks and redelivery ---------------------------------------------


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


def test_errors_carry_a_reason(world: World) -> None:
    client = world.broker.open_client(RecordingSink())
    with pytest.raises(UnknownSubscription) as info:
        client.unsubscribe("missing")
    assert "missing" in info.value.reason
    assert str(info.value) == info.value.reason
