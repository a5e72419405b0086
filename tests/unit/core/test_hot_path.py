"""The core's per-message shortcuts, pinned to what they stand in for:
identity-hashed enums, the routing loop over topic subscriptions, the
buffer's length read directly, a single consumer's room checked inline, and
a message made from positional arguments."""

from __future__ import annotations

import pytest

from core import names
from core.buffers import PriorityBuffer
from core.errors import LimitExceeded
from core.messages import Message
from core.names import Kind
from core.selectors import compile_selector
from core.subscriptions import AckMode
from tests.support.core_fakes import Q, World, address


def test_kinds_key_dicts_by_identity_and_the_topic_prefix_is_the_kinds() -> None:
    by_kind = {kind: kind.value for kind in Kind}
    assert all(by_kind[kind] == kind.value for kind in Kind) and len(by_kind) == 4
    assert names.TOPIC_PREFIX == Kind.TOPIC.value
    assert names.topic("a.b") is names.parse("/topic/a.b")


def test_routing_to_topic_subscribers_keeps_their_order_and_applies_selectors() -> None:
    world = World()
    topic = address("/topic/t")
    sinks = []
    for token, selector in (("a", None), ("b", "k = 'v'"), ("c", "k = 'w'"), ("d", None)):
        client, sink = world.consumer(token, topic)
        if selector is not None:  # again, with a selector
            client.unsubscribe(token)
            client.subscribe(token, topic, AckMode.AUTO, selector=compile_selector(selector))
        sinks.append(sink)
    message = world.send("m", topic)  # headers {"k": "v"}
    targets = world.broker.registry.targets_for(message)
    everyone = [t.queue for t in world.broker.registry.trees[Kind.TOPIC].match(topic.segments)]
    assert targets == [q for q in everyone if q.selector is None or q.selector.matches(message)]
    assert [len(sink.deliveries) for sink in sinks] == [1, 1, 0, 1]
    plain = World()
    plain.consumer("a", topic)
    plain.consumer("b", topic)
    unselected = plain.broker.registry.targets_for(plain.broker.message(topic, {}, b""))
    assert unselected == [t.queue for t in plain.broker.registry.trees[Kind.TOPIC].match(topic.segments)]


def test_the_buffer_length_is_its_len() -> None:
    buffer = PriorityBuffer()
    queue = address("/queue/b")
    for i, priority in enumerate([4, 9, 0, 4, 7]):
        buffer.push(Message(str(i), queue, {}, b"", priority=priority))
        assert buffer.length == len(buffer) == i + 1
    buffer.push_front(Message("f", queue, {}, b"", priority=9))
    buffer.pop()
    buffer.pop_lowest()
    assert buffer.length == len(buffer) == 4 and bool(buffer)
    buffer.clear()
    assert buffer.length == len(buffer) == 0 and not buffer


@pytest.mark.parametrize("exclusive", [False, True])  # an exclusive consumer takes _pick's ranked path
@pytest.mark.parametrize("accepting", [True, False])
@pytest.mark.parametrize(("mode", "unacked"), [(AckMode.AUTO, 0), (AckMode.CLIENT_INDIVIDUAL, 1), (AckMode.CLIENT_INDIVIDUAL, 2)])
def test_a_single_consumer_gets_a_message_directly_exactly_when_it_has_room(
    exclusive: bool, accepting: bool, mode: AckMode, unacked: int
) -> None:
    world = World()
    client, sink = world.consumer("s", Q, mode, prefetch=2)
    if exclusive:
        client.unsubscribe("s")
        client.subscribe("s", Q, mode, 2, exclusive=True)
    for i in range(unacked):
        world.send(f"before {i}")
    sink.accepting = accepting
    subscription = client.subscriptions["s"]
    room = subscription.has_room
    world.send("m")
    assert (sink.bodies[-1:] == [b"m"]) is room
    assert world.broker.queue(Q).depth == (0 if room else 1)


def test_a_message_made_from_positional_arguments_is_the_one_made_from_keywords() -> None:
    world = World()
    made = world.broker.message(Q, {"h": "1"}, b"b", True, 7, 123)
    assert (made.persistent, made.priority, made.expires, made.timestamp) == (True, 7, 123, world.clock.wall_ms())
    kw = world.broker.message(Q, {"h": "1"}, b"b", persistent=True, priority=7, expires=123)
    assert (kw.persistent, kw.priority, kw.expires, kw.timestamp, kw.address) == (True, 7, 123, made.timestamp, Q)
    assert made.id != kw.id and made.id.startswith("ID-test-")
    copy = Message("i", Q, None, None, False, 3, 5, 6, 1, 2, 1)
    assert (copy.priority, copy.expires, copy.timestamp, copy.redeliveries, copy.location, copy.qos) == (3, 5, 6, 1, 2, 1)


@pytest.mark.parametrize("exclusive", [False, True])  # an exclusive consumer takes _pick's ranked path
def test_a_single_consumer_catches_up_in_order_as_far_as_its_room_goes(exclusive: bool) -> None:
    world = World()
    sink_client, sink = world.consumer("s", Q, AckMode.CLIENT_INDIVIDUAL, prefetch=2, accepting=False)
    if exclusive:
        sink_client.unsubscribe("s")
        sink_client.subscribe("s", Q, AckMode.CLIENT_INDIVIDUAL, 2, exclusive=True)
    for i in range(5):
        world.send(f"m{i}")
    sink_client.resume()
    assert sink.bodies == []  # not accepting: nothing leaves the queue
    sink.accepting = True
    sink_client.resume()
    assert sink.bodies == [b"m0", b"m1"]  # the prefetch window's worth
    sink_client.ack("s", sink.ids[0])
    assert sink.bodies == [b"m0", b"m1", b"m2"]  # one ack, one more
    queue = world.broker.queue(Q)
    assert queue.depth == 2 and queue.pending.length == len(queue.pending) == 2


def test_the_publish_path_takes_the_base_policy_only_when_no_destination_has_its_own() -> None:
    plain = World()
    assert plain.broker.policies.uniform and plain.broker.policies.for_address(Q) is plain.broker.policies.base
    limited = World(policies=[{"destination": "/queue/q", "queue_high_water": 2, "send_fail_if_no_space": True}])
    assert not limited.broker.policies.uniform
    limited.send("1")
    limited.send("2")
    with pytest.raises(LimitExceeded):  # the destination's own policy applied on the fast path
        limited.send("3")
    plain.send("1")
    plain.send("2")
    plain.send("3")
    assert plain.broker.queue(Q).depth == 3
