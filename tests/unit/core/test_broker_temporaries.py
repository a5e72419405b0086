"""The broker's temporary destinations: private per client, claimed on
declaration, released with their messages when the owner closes, capped.

Pure synchronous tests through the broker's door: method calls in, Sink
deliveries out, with a RecordingSink and a FakeClock; no Trio, no sockets.
"""

from __future__ import annotations

import pytest

from core.errors import LimitExceeded, NotAuthorized
from tests.support.core_fakes import AUTO, INDIVIDUAL, RecordingSink, World, address


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
