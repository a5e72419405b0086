"""The broker's topics: fan-out to every matching subscription, per-subscription
acks and buffer limits, and wildcards refused where they make no sense.

Pure synchronous tests through the broker's door: method calls in, Sink
deliveries out, with a RecordingSink and a FakeClock; no Trio, no sockets.
"""

from __future__ import annotations

import pytest

from core.errors import InvalidDestination
from tests.support.core_fakes import AUTO, INDIVIDUAL, RecordingSink, World, address


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
