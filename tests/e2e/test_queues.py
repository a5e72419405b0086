"""Queues: SEND / SUBSCRIBE / UNSUBSCRIBE on /queue/, FIFO, one consumer per
message, round-robin over consumers with room, prefetch, messages waiting for
a consumer; bodies as bytes; header escaping and CRLF line endings."""

from __future__ import annotations

import pytest

from tests.support.helpers import unique, wait_for


def qname() -> str:
    return f"/queue/{unique('q')}"


def depth(broker, queue: str) -> int:
    def look() -> int:
        for address, q in broker.running.broker.queues.items():
            if address.text == queue:
                return q.depth
        return -1

    return broker.call(look)


def unacked(broker, queue: str) -> list[int]:
    """How many messages each consumer of ``queue`` holds unacknowledged."""

    def look() -> list[int]:
        for address, q in broker.running.broker.queues.items():
            if address.text == queue:
                return [len(c.unacked) for c in q.consumers]
        return []

    return broker.call(look)


def test_send_subscribe_unsubscribe(broker, stomp_client):
    producer = stomp_client(broker)
    consumer = stomp_client(broker)
    queue = qname()
    sub = consumer.subscribe(queue, "mine")
    producer.send(queue, b"one", **{"x-app": "v"})
    message = consumer.wait_messages(1)[0]
    assert message.body == b"one"
    assert message.headers["destination"] == queue
    assert message.headers["subscription"] == "mine"
    assert message.headers["message-id"]
    assert message.headers["x-app"] == "v"
    consumer.unsubscribe(sub)
    producer.send(queue, b"two")
    consumer.barrier()
    assert consumer.bodies == [b"one"]
    # Not lost: it waits in the queue for the next consumer.
    assert depth(broker, queue) == 1
    other = stomp_client(broker)
    other.subscribe(queue)
    assert other.wait_messages(1)[0].body == b"two"


def test_stomp_1_0_subscription_without_id_and_unsubscribe_by_destination(broker, raw_client, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    raw = raw_client(broker)
    raw.connect(version=None)
    raw.send_frame("SUBSCRIBE", {"destination": queue, "receipt": "s"})
    raw.receipt("s")
    producer.send(queue, b"one")
    assert raw.expect("MESSAGE").body == b"one"
    raw.send_frame("UNSUBSCRIBE", {"destination": queue, "receipt": "u"})
    raw.receipt("u")
    producer.send(queue, b"two")
    assert depth(broker, queue) == 1


def test_fifo_order(broker, stomp_client):
    producer = stomp_client(broker)
    consumer = stomp_client(broker)
    queue = qname()
    consumer.subscribe(queue)
    bodies = [str(i).encode() for i in range(300)]
    for body in bodies[:-1]:
        producer.send(queue, body, receipt=False)
    producer.send(queue, bodies[-1])
    consumer.wait_messages(len(bodies))
    assert consumer.bodies == bodies


def test_each_message_goes_to_exactly_one_consumer(broker, stomp_client):
    producer = stomp_client(broker)
    consumers = [stomp_client(broker) for _ in range(3)]
    queue = qname()
    for consumer in consumers:
        consumer.subscribe(queue)
    bodies = {str(i).encode() for i in range(90)}
    for body in sorted(bodies):
        producer.send(queue, body, receipt=False)
    producer.barrier()
    wait_for(lambda: sum(len(c.messages) for c in consumers) >= len(bodies))
    for consumer in consumers:
        consumer.barrier()
    received = [body for c in consumers for body in c.bodies]
    assert sorted(received) == sorted(bodies), "every message exactly once"
    assert all(c.messages for c in consumers)


def test_round_robin_across_consumers(broker, stomp_client):
    producer = stomp_client(broker)
    a = stomp_client(broker)
    b = stomp_client(broker)
    queue = qname()
    a.subscribe(queue)
    b.subscribe(queue)
    for i in range(10):
        producer.send(queue, str(i).encode(), receipt=False)
    producer.barrier()
    a.wait_messages(5)
    b.wait_messages(5)
    evens = [str(i).encode() for i in range(0, 10, 2)]
    odds = [str(i).encode() for i in range(1, 10, 2)]
    assert sorted([a.bodies, b.bodies]) == sorted([evens, odds])


def test_round_robin_skips_a_consumer_without_prefetch_room(broker, stomp_client):
    producer = stomp_client(broker)
    small = stomp_client(broker)
    large = stomp_client(broker)
    queue = qname()
    small.subscribe(queue, "s", ack="client-individual", **{"activemq.prefetchSize": "1"})
    large.subscribe(queue, "l", ack="client-individual", **{"activemq.prefetchSize": "100"})
    for i in range(6):
        producer.send(queue, str(i).encode())
    large.wait_messages(5)
    small.barrier()
    large.barrier()
    assert small.bodies == [b"0"]
    assert large.bodies == [b"1", b"2", b"3", b"4", b"5"]
    # Once the small consumer acks, it has room and takes its turn again.
    small.conn.ack(small.messages[0].headers["ack"])
    producer.send(queue, b"6")
    producer.send(queue, b"7")
    wait_for(lambda: len(small.messages) + len(large.messages) == 8)
    assert len(small.messages) == 2


def test_prefetch_size_limits_unacked_messages(broker, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    for i in range(5):
        producer.send(queue, str(i).encode())
    consumer = stomp_client(broker)
    consumer.subscribe(queue, "p", ack="client", **{"activemq.prefetchSize": "2"})
    consumer.wait_messages(2)
    consumer.barrier()
    assert consumer.bodies == [b"0", b"1"]
    assert depth(broker, queue) == 3
    assert unacked(broker, queue) == [2]
    # Acking the first frees one slot: exactly one more arrives.
    consumer.conn.ack(consumer.messages[0].headers["ack"])
    consumer.wait_messages(3)
    consumer.barrier()
    assert consumer.bodies == [b"0", b"1", b"2"]
    # A cumulative ack of the third frees two.
    consumer.conn.ack(consumer.messages[2].headers["ack"])
    consumer.wait_messages(5)
    consumer.barrier()
    assert consumer.bodies == [b"0", b"1", b"2", b"3", b"4"]
    assert depth(broker, queue) == 0


def test_messages_wait_in_the_queue_until_a_consumer_subscribes(broker, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    for body in (b"a", b"b", b"c"):
        producer.send(queue, body)
    producer.close()
    assert depth(broker, queue) == 3
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    consumer.wait_messages(3)
    assert consumer.bodies == [b"a", b"b", b"c"]
    assert depth(broker, queue) == 0


def test_a_subscribe_receipt_comes_before_the_backlog_it_releases(broker, raw_client, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    producer.send(queue, b"one")
    producer.send(queue, b"two")
    raw = raw_client(broker)
    raw.connect()
    raw.send_frame("SUBSCRIBE", {"destination": queue, "id": "1", "receipt": "r"})
    raw.receipt("r")  # the subscription is in place; then the messages flow
    assert raw.expect("MESSAGE").body == b"one"
    assert raw.expect("MESSAGE").body == b"two"


def test_stomp_py_sees_the_subscribe_receipt_before_the_backlog(broker, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    producer.send(queue, b"one")
    producer.send(queue, b"two")
    consumer = stomp_client(broker)
    consumer.subscribe(queue)  # waits for the receipt
    consumer.wait_messages(2)
    assert consumer.rec.order == [f"RECEIPT {consumer.rec.receipts[0]}", "MESSAGE", "MESSAGE"]
    assert consumer.bodies == [b"one", b"two"]


# -- bodies ----------------------------------------------------------------


def test_content_length_carries_nul_bytes(broker, raw_client, stomp_client):
    consumer = stomp_client(broker)
    queue = qname()
    consumer.subscribe(queue)
    raw = raw_client(broker)
    raw.connect()
    body = b"ab\x00cd\x00\x00"
    raw.send_frame("SEND", {"destination": queue, "content-length": str(len(body)), "receipt": "r"}, body)
    raw.receipt("r")
    message = consumer.wait_messages(1)[0]
    assert message.body == body
    assert message.headers["content-length"] == str(len(body))


def test_body_without_content_length_ends_at_the_first_nul(broker, raw_client):
    raw = raw_client(broker)
    raw.connect()
    queue = qname()
    raw.send_frame("SUBSCRIBE", {"destination": queue, "id": "1", "receipt": "s"})
    raw.receipt("s")
    raw.send_frame("SEND", {"destination": queue}, b"plain text")
    message = raw.expect("MESSAGE")
    assert message.body == b"plain text"
    assert message.headers["content-length"] == "10"


def test_binary_body_of_every_byte_value(broker, stomp_client):
    producer = stomp_client(broker)
    consumer = stomp_client(broker)
    queue = qname()
    consumer.subscribe(queue)
    body = bytes(range(256)) * 64
    producer.send(queue, body, content_type="application/octet-stream")
    message = consumer.wait_messages(1)[0]
    assert message.body == body
    assert message.headers["content-type"] == "application/octet-stream"


def test_large_body_arrives_intact(broker, stomp_client):
    producer = stomp_client(broker)
    consumer = stomp_client(broker)
    queue = qname()
    consumer.subscribe(queue)
    body = bytes(i * 7 % 251 for i in range(1024 * 1024))
    producer.send(queue, body)
    assert consumer.wait_messages(1)[0].body == body


def test_content_type_passes_through(broker, stomp_client):
    producer = stomp_client(broker)
    consumer = stomp_client(broker)
    queue = qname()
    consumer.subscribe(queue)
    producer.send(queue, b'{"a": 1}', content_type="application/json;charset=utf-8")
    assert consumer.wait_messages(1)[0].headers["content-type"] == "application/json;charset=utf-8"


# -- header escaping and line endings --------------------------------------


@pytest.mark.parametrize(
    ("version", "value"),
    [("1.1", "a:b\nc\\d::"), ("1.2", "a:b\nc\\d\re::")],
)
def test_escaped_header_values_round_trip(broker, stomp_client, version, value):
    producer = stomp_client(broker, version)
    consumer = stomp_client(broker, version)
    queue = qname()
    consumer.subscribe(queue, "e")
    producer.send(queue, b"x", **{"x-tricky": value})
    assert consumer.wait_messages(1)[0].headers["x-tricky"] == value


def test_broker_escapes_header_values_on_the_wire(broker, raw_client, stomp_client):
    producer = stomp_client(broker)
    raw = raw_client(broker)
    raw.connect("1.2")
    queue = qname()
    raw.send_frame("SUBSCRIBE", {"destination": queue, "id": "1", "receipt": "s"})
    raw.receipt("s")
    producer.send(queue, b"x", **{"x-tricky": "a:b\nc\\d\re"})
    message = raw.expect("MESSAGE")
    assert message.headers["x-tricky"] == "a:b\nc\\d\re"
    assert b"x-tricky:a\\cb\\nc\\\\d\\re\n" in raw.received


def test_escaped_header_names_are_unescaped(broker, raw_client):
    raw = raw_client(broker)
    raw.connect("1.2")
    queue = qname()
    raw.send_frame("SUBSCRIBE", {"destination": queue, "id": "1", "receipt": "s"})
    raw.receipt("s")
    raw.send_frame("SEND", [("destination", queue), ("x\\cname", "v\\\\al")], b"x")
    message = raw.expect("MESSAGE")
    assert message.headers["x:name"] == "v\\al"


def test_header_escaping_follows_each_consumers_version(broker, stomp_client, raw_client):
    producer = stomp_client(broker, "1.2")
    old = raw_client(broker)
    old.connect(version=None)  # STOMP 1.0: no escaping
    mid = raw_client(broker)
    mid.connect("1.1")
    topic = f"/topic/{unique('t')}"
    for raw in (old, mid):
        raw.send_frame("SUBSCRIBE", {"destination": topic, "id": "1", "receipt": "s"})
        raw.receipt("s")
    producer.send(topic, b"x", **{"x-h": "a:b\\c"})
    assert old.expect("MESSAGE").headers["x-h"] == "a:b\\c"
    assert b"x-h:a:b\\c\n" in old.received
    assert mid.expect("MESSAGE").headers["x-h"] == "a:b\\c"
    assert b"x-h:a\\cb\\\\c\n" in mid.received


def test_crlf_line_endings_are_accepted(broker, raw_client):
    raw = raw_client(broker)
    raw.send_frame("CONNECT", {"accept-version": "1.2", "host": "h"}, eol="\r\n")
    connected = raw.expect("CONNECTED")
    assert connected.headers["version"] == "1.2"
    raw.codec.set_version("1.2")
    queue = qname()
    raw.send_frame("SUBSCRIBE", {"destination": queue, "id": "1", "receipt": "s"}, eol="\r\n")
    raw.receipt("s")
    body = b"line one\r\nline two\r\n"
    raw.send_frame("SEND", {"destination": queue, "x-h": "v", "receipt": "r"}, body, eol="\r\n")
    got = {f.command: f for f in (raw.next_frame(), raw.next_frame())}
    assert got["RECEIPT"].headers["receipt-id"] == "r"
    message = got["MESSAGE"]
    assert message.headers["destination"] == queue
    assert message.headers["x-h"] == "v"
    assert message.body == body
