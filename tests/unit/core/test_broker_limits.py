"""The broker's limits: transactions, transaction size, subscriptions and
destinations, each refused with LimitExceeded and without side effects.

Pure synchronous tests through the broker's door: method calls in, Sink
deliveries out, with a RecordingSink and a FakeClock; no Trio, no sockets.
"""

from __future__ import annotations

import pytest

from core.errors import LimitExceeded
from tests.support.core_fakes import AUTO, INDIVIDUAL, Q, RecordingSink, World, address


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
