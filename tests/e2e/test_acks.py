"""Acknowledgement: auto, client (cumulative) and client-individual modes; ACK
and NACK in the 1.2 form (`id`) and the 1.0/1.1 form (`message-id` +
`subscription`); redelivery with `redelivered:true` and a delivery count when a
consumer unsubscribes, disconnects, drops or NACKs; ACK of an unknown id."""

from __future__ import annotations

import pytest

from tests.support.helpers import unique, wait_for


def qname() -> str:
    return f"/queue/{unique('q')}"


def state(broker, queue: str) -> tuple[int, list[int]]:
    """(messages waiting, unacked count per consumer) of ``queue``."""

    def look() -> tuple[int, list[int]]:
        for address, q in broker.running.broker.queues.items():
            if address.text == queue:
                return q.depth, [len(c.unacked) for c in q.consumers]
        return -1, []

    return broker.call(look)


def fill(client, queue: str, n: int) -> list[bytes]:
    bodies = [f"m{i}".encode() for i in range(1, n + 1)]
    for body in bodies:
        client.send(queue, body)
    return bodies


def ack(client, message, transaction=None, receipt=None):
    """ACK a received message in the form its client's version uses."""
    if client.version == "1.2":
        client.conn.ack(message.headers["ack"], transaction=transaction, receipt=receipt)
    elif client.version == "1.1":
        client.conn.ack(message.headers["message-id"], message.headers["subscription"], transaction=transaction, receipt=receipt)
    else:
        client.conn.ack(message.headers["message-id"], transaction=transaction, receipt=receipt)


def nack(client, message, transaction=None, receipt=None):
    if client.version == "1.2":
        client.conn.nack(message.headers["ack"], transaction=transaction, receipt=receipt)
    else:
        client.conn.nack(message.headers["message-id"], message.headers["subscription"], transaction=transaction, receipt=receipt)


def acked(client, message) -> None:
    """ACK with a receipt and wait for it."""
    rid = unique("ack-")
    ack(client, message, receipt=rid)
    client.wait_receipt(rid)


def remaining(broker, stomp_client, queue: str) -> list:
    """What a fresh consumer of ``queue`` receives (everything, then a barrier)."""
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    wait_for(lambda: state(broker, queue)[0] == 0, what="queue drained")
    consumer.barrier()
    return consumer.messages


def test_first_delivery_is_not_marked_redelivered(broker, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    fill(producer, queue, 1)
    consumer = stomp_client(broker)
    consumer.subscribe(queue, ack="client")
    message = consumer.wait_messages(1)[0]
    assert message.headers["redelivered"] == "false"
    assert "x-delivery-count" not in message.headers


def test_auto_ack_needs_no_ack(broker, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    bodies = fill(producer, queue, 3)
    consumer = stomp_client(broker)
    consumer.subscribe(queue, ack="auto")
    consumer.wait_messages(3)
    assert "ack" not in consumer.messages[0].headers
    assert state(broker, queue) == (0, [0])
    consumer.close()
    assert consumer.bodies == bodies
    assert remaining(broker, stomp_client, queue) == []


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_client_ack_is_cumulative(broker, stomp_client, version):
    producer = stomp_client(broker)
    queue = qname()
    fill(producer, queue, 3)
    consumer = stomp_client(broker, version)
    consumer.subscribe(queue, "sub", ack="client")
    messages = consumer.wait_messages(3)
    assert state(broker, queue) == (0, [3])
    acked(consumer, messages[2])  # the third covers the first and second too
    assert state(broker, queue) == (0, [0])
    consumer.close()
    assert remaining(broker, stomp_client, queue) == []


def test_client_ack_of_a_middle_message_keeps_the_later_ones(broker, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    fill(producer, queue, 3)
    consumer = stomp_client(broker)
    consumer.subscribe(queue, ack="client")
    messages = consumer.wait_messages(3)
    acked(consumer, messages[1])
    assert state(broker, queue) == (0, [1])
    consumer.close()
    again = remaining(broker, stomp_client, queue)
    assert [m.body for m in again] == [b"m3"]
    assert again[0].headers["redelivered"] == "true"


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_client_individual_ack_covers_one_message(broker, stomp_client, version):
    producer = stomp_client(broker)
    queue = qname()
    fill(producer, queue, 3)
    consumer = stomp_client(broker, version)
    consumer.subscribe(queue, "sub", ack="client-individual")
    messages = consumer.wait_messages(3)
    acked(consumer, messages[2])
    assert state(broker, queue) == (0, [2])
    consumer.close()
    again = remaining(broker, stomp_client, queue)
    assert [m.body for m in again] == [b"m1", b"m2"]
    assert all(m.headers["redelivered"] == "true" for m in again)
    assert all(m.headers["x-delivery-count"] == "1" for m in again)


def test_stomp_1_0_ack_without_subscription_header(broker, raw_client, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    fill(producer, queue, 2)
    raw = raw_client(broker)
    raw.connect(version=None)
    raw.send_frame("SUBSCRIBE", {"destination": queue, "ack": "client"})
    raw.expect("MESSAGE")
    second = raw.expect("MESSAGE")  # a cumulative ACK of the second covers the first
    raw.send_frame("ACK", {"message-id": second.headers["message-id"], "receipt": "a"})
    raw.receipt("a")
    assert state(broker, queue) == (0, [0])


# -- redelivery when a consumer goes away -----------------------------------


def check_redelivered(broker, stomp_client, queue: str, bodies: list[bytes]) -> None:
    successor = stomp_client(broker)
    successor.subscribe(queue, ack="client-individual")
    messages = successor.wait_messages(len(bodies))
    successor.barrier()
    assert [m.body for m in successor.messages] == bodies
    for m in messages:
        assert m.headers["redelivered"] == "true"
        assert m.headers["x-delivery-count"] == "1"


def test_unacked_messages_return_on_unsubscribe(broker, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    bodies = fill(producer, queue, 3)
    consumer = stomp_client(broker)
    sub = consumer.subscribe(queue, ack="client")
    consumer.wait_messages(3)
    consumer.unsubscribe(sub)
    assert state(broker, queue) == (3, [])
    check_redelivered(broker, stomp_client, queue, bodies)


def test_unacked_messages_return_on_disconnect(broker, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    bodies = fill(producer, queue, 3)
    consumer = stomp_client(broker)
    consumer.subscribe(queue, ack="client-individual")
    consumer.wait_messages(3)
    consumer.close()
    check_redelivered(broker, stomp_client, queue, bodies)


@pytest.mark.parametrize("how", ["reset", "close"])
def test_unacked_messages_return_when_the_socket_drops(broker, stomp_client, raw_client, how):
    producer = stomp_client(broker)
    queue = qname()
    bodies = fill(producer, queue, 2)
    raw = raw_client(broker)
    raw.connect()
    raw.send_frame("SUBSCRIBE", {"destination": queue, "id": "1", "ack": "client"})
    assert [raw.expect("MESSAGE").body, raw.expect("MESSAGE").body] == bodies
    raw.abort() if how == "reset" else raw.close()  # no DISCONNECT: the process died
    check_redelivered(broker, stomp_client, queue, bodies)


def test_delivery_count_grows_with_each_return(broker, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    fill(producer, queue, 1)
    counts = []
    for _ in range(3):
        consumer = stomp_client(broker)
        sub = consumer.subscribe(queue, ack="client")
        counts.append(consumer.wait_messages(1)[0].headers.get("x-delivery-count"))
        consumer.unsubscribe(sub)
    assert counts == [None, "1", "2"]


# -- NACK --------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_nack_redelivers_at_once_with_the_count_raised(broker, stomp_client, version):
    producer = stomp_client(broker)
    queue = qname()
    fill(producer, queue, 2)
    consumer = stomp_client(broker, version)
    consumer.subscribe(queue, "sub", ack="client-individual", **{"activemq.prefetchSize": "1"})
    seen = []
    for n in range(1, 4):
        message = consumer.wait_messages(n)[-1]
        seen.append((message.body, message.headers["redelivered"], message.headers.get("x-delivery-count")))
        nack(consumer, message)
    # The NACKed message went back to the head of the queue, ahead of m2.
    message = consumer.wait_messages(4)[-1]
    seen.append((message.body, message.headers["redelivered"], message.headers.get("x-delivery-count")))
    assert seen == [
        (b"m1", "false", None),
        (b"m1", "true", "1"),
        (b"m1", "true", "2"),
        (b"m1", "true", "3"),
    ]
    acked(consumer, message)
    m2 = consumer.wait_messages(5)[-1]
    assert m2.body == b"m2"
    acked(consumer, m2)
    assert state(broker, queue) == (0, [0])


def test_nack_goes_to_another_consumer_when_one_has_room(broker, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    a = stomp_client(broker)
    b = stomp_client(broker)
    a.subscribe(queue, ack="client-individual", **{"activemq.prefetchSize": "1"})
    b.subscribe(queue, ack="client-individual", **{"activemq.prefetchSize": "1"})
    fill(producer, queue, 1)
    wait_for(lambda: a.messages or b.messages)
    first, other = (a, b) if a.messages else (b, a)
    nack(first, first.messages[0])
    # Round-robin: the other consumer has room and its turn.
    redelivered = other.wait_messages(1)[0]
    assert redelivered.body == b"m1"
    assert redelivered.headers["x-delivery-count"] == "1"


# -- unknown ids ---------------------------------------------------------------


_UNKNOWN_IDS = [
    ("1.2", {"id": "no-such-ack-id"}),
    ("1.2", {"id": "1/ID-nope-1"}),
    ("1.1", {"message-id": "ID-nope-1", "subscription": "s"}),
    ("1.1", {"message-id": "ID-nope-1", "subscription": "no-such-subscription"}),
]


@pytest.mark.parametrize(
    ("command", "version", "headers"),
    [("ACK", v, h) for v, h in _UNKNOWN_IDS]
    + [("NACK", v, h) for v, h in _UNKNOWN_IDS]
    + [("ACK", "1.0", {"message-id": "ID-nope-1"})],  # 1.0 has no NACK
)
def test_ack_of_an_unknown_id_is_an_error(broker, raw_client, stomp_client, version, headers, command):
    producer = stomp_client(broker)
    queue = qname()
    fill(producer, queue, 1)
    raw = raw_client(broker)
    raw.connect(version)
    raw.send_frame("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "client"})
    raw.expect("MESSAGE")
    raw.send_frame(command, {**headers, "receipt": "bad-ack"})
    error = raw.expect_error_and_close()
    assert error.headers["receipt-id"] == "bad-ack"
    # The failed connection's unacked message went back to the queue.
    check_redelivered(broker, stomp_client, queue, [b"m1"])


def test_ack_of_an_already_acked_message_is_an_error(broker, raw_client, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    fill(producer, queue, 1)
    raw = raw_client(broker)
    raw.connect()
    raw.send_frame("SUBSCRIBE", {"destination": queue, "id": "s", "ack": "client-individual"})
    message = raw.expect("MESSAGE")
    raw.send_frame("ACK", {"id": message.headers["ack"], "receipt": "first"})
    raw.receipt("first")
    raw.send_frame("ACK", {"id": message.headers["ack"], "receipt": "again"})
    error = raw.expect_error_and_close()
    assert error.headers["receipt-id"] == "again"


# -- dead letters ----------------------------------------------------------------


@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
def test_a_poison_message_reaches_the_dlq_after_exactly_max_redeliveries(broker_factory, stomp_client, persistent):
    broker = broker_factory(broker={"max_redeliveries": 2})
    queue = qname()
    producer = stomp_client(broker)
    producer.send(queue, b"poison", **({"persistent": "true"} if persistent else {}), **{"x-app": "1"})
    producer.send(queue, b"fine")
    consumer = stomp_client(broker)
    consumer.subscribe(queue, "s", ack="client-individual", **{"activemq.prefetchSize": "1"})
    deliveries = 0
    while True:
        message = consumer.wait_messages(deliveries + 1)[deliveries]
        deliveries += 1
        if message.body != b"poison":
            consumer.conn.ack(message.headers["ack"])
            break
        consumer.conn.nack(message.headers["ack"])
    assert deliveries == 1 + 3 + 0  # delivered 3 times (1 + max_redeliveries 2), then "fine"
    dlq = stomp_client(broker)
    dlq.subscribe("/queue/DLQ", ack="client-individual")  # looked at, not consumed
    dead = dlq.wait_messages(1)[0]
    assert dead.body == b"poison" and dead.headers["x-app"] == "1"
    assert dead.headers["originalDestination"] == queue
    assert "delivered 3 times" in dead.headers["dlqDeliveryFailureCause"]
    assert (dead.headers.get("persistent") == "true") is persistent
    if persistent:  # the move is stored: after a restart it is on the DLQ, not back on its queue
        broker.stop()
        broker = broker_factory(broker={"max_redeliveries": 2})
        again = stomp_client(broker)
        again.subscribe("/queue/DLQ")
        again.subscribe(queue)
        again.wait_messages(1)
        again.barrier()
        assert [(m.headers["destination"], m.body) for m in again.messages] == [("/queue/DLQ", b"poison")]


# -- expiry ------------------------------------------------------------------------


def test_expired_messages_are_never_delivered_whichever_dialect(broker, stomp_client):
    import time as _time

    queue = qname()
    producer = stomp_client(broker)
    now_ms = int(_time.time() * 1000)
    producer.send(queue, b"activemq-past", expires=str(now_ms - 1))
    producer.send(queue, b"rabbitmq-short", expiration="50")
    producer.send(queue, b"activemq-future", expires=str(now_ms + 60_000))
    producer.send(queue, b"rabbitmq-long", expiration="60000")
    _time.sleep(0.1)
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    consumer.wait_messages(2)
    consumer.barrier()
    assert consumer.bodies == [b"activemq-future", b"rabbitmq-long"]
    assert "expiration" not in consumer.messages[1].headers
    assert int(consumer.messages[1].headers["expires"]) >= now_ms + 60_000
    assert broker.call(lambda: broker.running.broker.queues[next(
        a for a in broker.running.broker.queues if a.text == queue)].stats.expired) == 2


def test_redelivery_waits_the_policys_delay_with_backoff(broker_factory, stomp_client):
    import time as _time

    policy = {"destination": "/queue/slow.>", "redelivery_delay_ms": 300, "redelivery_backoff": 2.0}
    broker = broker_factory(broker={"policies": [policy]})
    queue = f"/queue/slow.{unique('d')}"
    stomp_client(broker).send(queue, b"retry me")
    consumer = stomp_client(broker)
    consumer.subscribe(queue, "s", ack="client-individual")
    times = []
    for attempt in range(3):
        message = consumer.wait_messages(attempt + 1, timeout=5)[attempt]
        times.append(_time.monotonic())
        if attempt < 2:
            consumer.conn.nack(message.headers["ack"])
    gaps = [b - a for a, b in zip(times, times[1:])]
    # Not before the delay (300 ms, then 600 ms); the upper bounds only catch a
    # delay that is never released, not a slow machine.
    assert 0.28 <= gaps[0] < 3.0, gaps
    assert 0.58 <= gaps[1] < 4.0, gaps
    assert consumer.messages[2].headers["redelivered"] == "true"
