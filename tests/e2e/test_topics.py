"""Topics: fan-out to every current subscriber, `*` and `>` wildcards,
UNSUBSCRIBE; temporary queues and topics: request/reply and ownership."""

from __future__ import annotations

import base64
import http.client
import json

import pytest

from gateway.auth import hash_password
from tests.support.helpers import unique, wait_for


def tname() -> str:
    return unique("t")


def test_every_current_subscriber_gets_a_copy(broker, stomp_client):
    producer = stomp_client(broker)
    subscribers = [stomp_client(broker) for _ in range(3)]
    topic = f"/topic/{tname()}"
    for s in subscribers:
        s.subscribe(topic)
    for i in range(5):
        producer.send(topic, str(i).encode())
    for s in subscribers:
        s.wait_messages(5)
        s.barrier()
        assert s.bodies == [b"0", b"1", b"2", b"3", b"4"]
        assert s.messages[0].headers["destination"] == topic


def test_topic_keeps_nothing_for_later_subscribers(broker, stomp_client):
    producer = stomp_client(broker)
    topic = f"/topic/{tname()}"
    producer.send(topic, b"before")
    late = stomp_client(broker)
    late.subscribe(topic)
    producer.send(topic, b"after")
    late.wait_messages(1)
    late.barrier()
    assert late.bodies == [b"after"]


def test_two_subscriptions_on_one_connection_each_get_a_copy(broker, stomp_client):
    producer = stomp_client(broker)
    consumer = stomp_client(broker)
    base = tname()
    consumer.subscribe(f"/topic/{base}.x", "exact")
    consumer.subscribe(f"/topic/{base}.*", "wild")
    producer.send(f"/topic/{base}.x", b"m")
    consumer.wait_messages(2)
    consumer.barrier()
    assert sorted(m.headers["subscription"] for m in consumer.messages) == ["exact", "wild"]


@pytest.mark.parametrize(
    ("pattern", "matching", "not_matching"),
    [
        ("{b}.*", ["{b}.x", "{b}.y"], ["{b}.x.y", "other.x", "{b}x"]),
        ("{b}.*.end", ["{b}.x.end", "{b}.y.end"], ["{b}.x.y.end", "{b}.end", "{b}.x.other"]),
        ("*.{b}", ["a.{b}", "z.{b}"], ["a.b.{b}", "a.{b}.c"]),
        ("{b}.>", ["{b}.x", "{b}.x.y", "{b}.x.y.z"], ["other.x", "{b}x.y"]),
        ("{b}.*.>", ["{b}.x.y", "{b}.x.y.z"], ["other.x.y"]),
    ],
)
def test_wildcard_subscriptions(broker, stomp_client, pattern, matching, not_matching):
    b = tname()
    producer = stomp_client(broker)
    consumer = stomp_client(broker)
    consumer.subscribe("/topic/" + pattern.format(b=b))
    for name in not_matching + matching:
        producer.send("/topic/" + name.format(b=b), name.format(b=b).encode())
    consumer.wait_messages(len(matching))
    consumer.barrier()
    assert consumer.bodies == [name.format(b=b).encode() for name in matching]
    assert [m.headers["destination"] for m in consumer.messages] == ["/topic/" + n.format(b=b) for n in matching]


def test_no_delivery_after_unsubscribe(broker, stomp_client):
    producer = stomp_client(broker)
    leaving = stomp_client(broker)
    staying = stomp_client(broker)
    topic = f"/topic/{tname()}"
    sub = leaving.subscribe(topic)
    staying.subscribe(topic)
    producer.send(topic, b"1")
    leaving.wait_messages(1)
    leaving.unsubscribe(sub)
    producer.send(topic, b"2")
    staying.wait_messages(2)
    leaving.barrier()
    assert leaving.bodies == [b"1"]
    assert staying.bodies == [b"1", b"2"]


def test_no_delivery_after_unsubscribing_a_wildcard(broker, stomp_client):
    producer = stomp_client(broker)
    consumer = stomp_client(broker)
    base = tname()
    sub = consumer.subscribe(f"/topic/{base}.>")
    producer.send(f"/topic/{base}.a", b"1")
    consumer.wait_messages(1)
    consumer.unsubscribe(sub)
    producer.send(f"/topic/{base}.a", b"2")
    consumer.barrier()
    assert consumer.bodies == [b"1"]


# -- temporary destinations ------------------------------------------------


def test_request_reply_through_a_temp_queue(broker, stomp_client):
    requester = stomp_client(broker)
    responder = stomp_client(broker)
    requests = f"/queue/{unique('requests')}"
    reply_to = f"/temp-queue/{unique('reply')}"
    responder.subscribe(requests)
    requester.subscribe(reply_to)
    requester.send(requests, b"what time is it?", **{"reply-to": reply_to, "correlation-id": "c-42"})
    request = responder.wait_messages(1)[0]
    # Rewritten to the requester's private queue, as ActiveMQ and RabbitMQ do.
    assert request.headers["reply-to"].startswith(reply_to + ".~")
    assert request.headers["correlation-id"] == "c-42"
    responder.send(request.headers["reply-to"], b"noon", **{"correlation-id": request.headers["correlation-id"]})
    reply = requester.wait_messages(1)[0]
    assert reply.body == b"noon"
    assert reply.headers["correlation-id"] == "c-42"
    assert reply.headers["destination"] == reply_to  # the owner sees the name it used


def test_reply_waits_in_a_temp_queue_named_in_reply_to_before_subscribing(broker, stomp_client):
    requester = stomp_client(broker)
    responder = stomp_client(broker)
    requests = f"/queue/{unique('requests')}"
    reply_to = f"/temp-queue/{unique('reply')}"
    responder.subscribe(requests)
    # The requester names its temp queue in reply-to before it subscribes.
    requester.send(requests, b"ping", **{"reply-to": reply_to, "correlation-id": "c1"})
    request = responder.wait_messages(1)[0]
    responder.send(request.headers["reply-to"], b"pong", **{"correlation-id": "c1"})
    requester.subscribe(reply_to)
    reply = requester.wait_messages(1)[0]
    assert (reply.body, reply.headers["correlation-id"]) == (b"pong", "c1")


def test_request_reply_through_a_temp_topic(broker, stomp_client):
    requester = stomp_client(broker)
    responder = stomp_client(broker)
    requests = f"/queue/{unique('requests')}"
    reply_to = f"/temp-topic/{unique('reply')}"
    responder.subscribe(requests)
    requester.subscribe(reply_to)
    requester.send(requests, b"q", **{"reply-to": reply_to, "correlation-id": "abc"})
    request = responder.wait_messages(1)[0]
    responder.send(request.headers["reply-to"], b"a", **{"correlation-id": request.headers["correlation-id"]})
    reply = requester.wait_messages(1)[0]
    assert (reply.body, reply.headers["correlation-id"]) == (b"a", "abc")
    assert reply.headers["destination"] == reply_to


@pytest.mark.parametrize("kind", ["temp-queue", "temp-topic"])
def test_instances_sharing_a_fixed_reply_name_each_get_only_their_own_replies(broker, stomp_client, kind):
    # Changed requirement: a second connection using a taken temporary name
    # used to get an ERROR ("belongs to another connection"); now each
    # connection has its own destination under that name.
    requests = f"/queue/{unique('requests')}"
    reply_to = f"/{kind}/replies"  # the same fixed name in every instance
    responder = stomp_client(broker)
    responder.subscribe(requests)
    instances = [stomp_client(broker) for _ in range(2)]
    for n, instance in enumerate(instances):
        instance.subscribe(reply_to)
        for i in range(3):
            instance.send(requests, f"{n}-{i}".encode(), **{"reply-to": reply_to})
    for request in responder.wait_messages(6):
        responder.send(request.headers["reply-to"], b"re:" + request.body)
    for n, instance in enumerate(instances):
        instance.wait_messages(3)
        instance.barrier()
        assert instance.bodies == [f"re:{n}-{i}".encode() for i in range(3)]
        assert {m.headers["destination"] for m in instance.messages} == {reply_to}
        assert not instance.rec.errors


def temp_queues(broker) -> set[str]:
    return broker.call(lambda: {a.text for a in broker.running.broker.queues if a.is_temporary})


def listed_destinations(broker) -> set[str]:
    connection = http.client.HTTPConnection("127.0.0.1", broker.admin_port, timeout=5)
    auth = base64.b64encode(b"ops:ops-pw").decode()
    connection.request("GET", "/api/v1/destinations", headers={"Authorization": f"Basic {auth}"})
    response = connection.getresponse()
    body = response.read()
    connection.close()
    assert response.status == 200, body
    return {d["name"] for d in json.loads(body)}


def request_reply_name(stomp_client, broker, requester, reply_to) -> str:
    """The private name a responder gets in ``requester``'s reply-to."""
    responder = stomp_client(broker)
    requests = f"/queue/{unique('requests')}"
    responder.subscribe(requests)
    requester.send(requests, b"request", **{"reply-to": reply_to})
    return responder.wait_messages(1)[0].headers["reply-to"]


def test_temp_queue_vanishes_with_its_connection(broker_factory, stomp_client):
    ops = {"name": "ops", "password_hash": hash_password("ops-pw", iterations=1000), "role": "read"}
    broker = broker_factory(admin={"users": [ops]})
    owner = stomp_client(broker)
    other = stomp_client(broker)
    reply_to = f"/temp-queue/{unique('gone')}"
    owner.subscribe(reply_to)
    private = request_reply_name(stomp_client, broker, owner, reply_to)
    other.send(private, b"while owned")
    owner.wait_messages(1)
    assert private in listed_destinations(broker)
    owner.close()
    wait_for(lambda: private not in listed_destinations(broker), what="temp queue released")
    # A reply to a requester that left is dropped, not kept for whoever
    # takes the name next.
    other.send(private, b"too late")
    assert private not in listed_destinations(broker)
    newcomer = stomp_client(broker)
    newcomer.subscribe(reply_to)
    other.send(request_reply_name(stomp_client, broker, newcomer, reply_to), b"for the newcomer")
    newcomer.wait_messages(1)
    newcomer.barrier()
    assert newcomer.bodies == [b"for the newcomer"]


def test_unconsumed_messages_vanish_with_the_temp_queue(broker, stomp_client):
    owner = stomp_client(broker)
    other = stomp_client(broker)
    reply_to = f"/temp-queue/{unique('gone')}"
    # Claimed through reply-to, never subscribed: replies pile up.
    private = request_reply_name(stomp_client, broker, owner, reply_to)
    other.send(private, b"unread 1")
    other.send(private, b"unread 2")
    owner.close()
    wait_for(lambda: private not in temp_queues(broker), what="temp queue released")
    assert temp_queues(broker) == set()
    newcomer = stomp_client(broker)
    newcomer.subscribe(reply_to)
    newcomer.barrier()
    assert newcomer.messages == []


def test_temp_topic_is_released_with_its_owner(broker, stomp_client):
    owner = stomp_client(broker)
    temp = f"/temp-topic/{unique('tt')}"
    owner.subscribe(temp)
    private = request_reply_name(stomp_client, broker, owner, temp)
    owners = lambda: broker.call(lambda: {a.text for a in broker.running.broker.temporaries.owners})  # noqa: E731
    assert private in owners()
    owner.close()
    wait_for(lambda: private not in owners(), what="temp topic released")


@pytest.mark.parametrize("kind", ["temp-queue", "temp-topic"])
def test_another_connection_cannot_subscribe_to_a_private_temp_name(broker, stomp_client, raw_client, kind):
    owner = stomp_client(broker)
    temp = f"/{kind}/{unique('mine')}"
    owner.subscribe(temp)
    private = request_reply_name(stomp_client, broker, owner, temp)
    intruder = raw_client(broker)
    intruder.connect()
    intruder.send_frame("SUBSCRIBE", {"destination": private, "id": "1", "receipt": "s"})
    error = intruder.expect_error_and_close()
    assert error.headers["receipt-id"] == "s"
    assert "another connection" in error.headers["message"]
    # The owner still gets what is sent there.
    stomp_client(broker).send(private, b"still mine")
    assert owner.wait_messages(1)[0].body == b"still mine"


def test_a_send_to_a_plain_temp_name_stays_with_its_sender(broker, stomp_client):
    owner = stomp_client(broker)
    temp = f"/temp-queue/{unique('mine')}"
    owner.subscribe(temp)
    other = stomp_client(broker)
    other.subscribe(temp)
    other.send(temp, b"to my own")  # the name is per connection: this is other's queue
    assert other.wait_messages(1)[0].body == b"to my own"
    owner.barrier()
    assert owner.messages == []


def test_a_wildcard_subscription_does_not_see_anothers_temp_topic(broker, stomp_client, raw_client):
    owner = stomp_client(broker)
    base = unique("private")
    temp = f"/temp-topic/{base}.replies"
    owner.subscribe(temp)
    eavesdropper = raw_client(broker)
    eavesdropper.connect()
    eavesdropper.send_frame("SUBSCRIBE", {"destination": f"/temp-topic/{base}.>", "id": "1", "receipt": "s"})
    answer = eavesdropper.next_frame()
    if answer.command == "ERROR":
        return  # refusing the subscription is one right answer
    assert answer.command == "RECEIPT"
    stomp_client(broker).send(temp, b"secret")
    owner.wait_messages(1)
    eavesdropper.send_frame("SEND", {"destination": "/topic/sync", "receipt": "sync"})
    received = [eavesdropper.next_frame()]
    while received[-1].command != "RECEIPT":
        received.append(eavesdropper.next_frame())
    assert [f.command for f in received] == ["RECEIPT"], "a temporary topic's message reached another connection"


def test_send_to_a_wildcard_destination_is_an_error(broker, raw_client):
    raw = raw_client(broker)
    raw.connect()
    raw.send_frame("SEND", {"destination": "/topic/a.*", "receipt": "w"}, b"x")
    error = raw.expect_error_and_close()
    assert error.headers["receipt-id"] == "w"
    assert "wildcard" in error.headers["message"]


def test_wildcards_on_queues_are_refused(broker, raw_client):
    raw = raw_client(broker)
    raw.connect()
    raw.send_frame("SUBSCRIBE", {"destination": "/queue/a.>", "id": "1", "receipt": "w"})
    error = raw.expect_error_and_close()
    assert error.headers["receipt-id"] == "w"
