"""The broker's transactions: sends invisible until COMMIT, ACKs and NACKs
settled or requeued at the end, and what a closing client leaves behind.

Pure synchronous tests through the broker's door: method calls in, Sink
deliveries out, with a RecordingSink and a FakeClock; no Trio, no sockets.
"""

from __future__ import annotations

import pytest

from core.errors import TransactionExists, UnknownTransaction
from tests.support.core_fakes import CLIENT, INDIVIDUAL, Q, World


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
