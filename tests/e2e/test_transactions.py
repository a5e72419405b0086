"""Transactions: BEGIN / COMMIT / ABORT over SEND, ACK and NACK; a dropped
connection aborts its open transactions; transaction errors."""

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
        return 0

    return broker.call(look)


def tx(client, command: str, transaction: str) -> None:
    """BEGIN, COMMIT or ABORT with a receipt, and wait for it."""
    rid = unique(command.lower() + "-")
    getattr(client.conn, command.lower())(transaction, headers={"receipt": rid})
    client.wait_receipt(rid)


def ack_in(client, message, transaction: str) -> None:
    rid = unique("ack-")
    client.conn.ack(message.headers["ack"], transaction=transaction, receipt=rid)
    client.wait_receipt(rid)


def nack_in(client, message, transaction: str) -> None:
    rid = unique("nack-")
    client.conn.nack(message.headers["ack"], transaction=transaction, receipt=rid)
    client.wait_receipt(rid)


def connections(broker) -> int:
    return broker.call(lambda: len(broker.running.server.connections))


def test_sends_in_a_transaction_are_invisible_until_commit(broker, stomp_client):
    producer = stomp_client(broker)
    consumer = stomp_client(broker)
    queue = qname()
    consumer.subscribe(queue)
    tx(producer, "BEGIN", "t1")
    for body in (b"t-1", b"t-2", b"t-3"):
        producer.send(queue, body, transaction="t1")
    producer.send(queue, b"outside")  # not in the transaction: visible at once
    consumer.wait_messages(1)
    consumer.barrier()
    assert consumer.bodies == [b"outside"]
    assert depth(broker, queue) == 0
    tx(producer, "COMMIT", "t1")
    consumer.wait_messages(4)
    consumer.barrier()
    assert consumer.bodies == [b"outside", b"t-1", b"t-2", b"t-3"]


def test_committed_sends_wait_in_the_queue_like_any_other(broker, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    tx(producer, "BEGIN", "t")
    producer.send(queue, b"a", transaction="t")
    producer.send(queue, b"b", transaction="t")
    assert depth(broker, queue) == 0
    tx(producer, "COMMIT", "t")
    assert depth(broker, queue) == 2


def test_abort_discards_the_transactions_sends(broker, stomp_client):
    producer = stomp_client(broker)
    consumer = stomp_client(broker)
    queue = qname()
    consumer.subscribe(queue)
    tx(producer, "BEGIN", "t1")
    producer.send(queue, b"discarded 1", transaction="t1")
    producer.send(queue, b"discarded 2", transaction="t1")
    tx(producer, "ABORT", "t1")
    producer.send(queue, b"after")
    consumer.wait_messages(1)
    consumer.barrier()
    assert consumer.bodies == [b"after"]


def test_transaction_ids_belong_to_their_connection(broker, stomp_client):
    a = stomp_client(broker)
    b = stomp_client(broker)
    consumer = stomp_client(broker)
    queue = qname()
    consumer.subscribe(queue)
    tx(a, "BEGIN", "same")
    tx(b, "BEGIN", "same")
    a.send(queue, b"from a", transaction="same")
    b.send(queue, b"from b", transaction="same")
    tx(b, "ABORT", "same")
    tx(a, "COMMIT", "same")
    consumer.wait_messages(1)
    consumer.barrier()
    assert consumer.bodies == [b"from a"]


def test_acks_in_a_transaction_take_effect_on_commit(broker, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    producer.send(queue, b"m1")
    producer.send(queue, b"m2")
    consumer = stomp_client(broker)
    consumer.subscribe(queue, ack="client-individual")
    m1, m2 = consumer.wait_messages(2)
    tx(consumer, "BEGIN", "t")
    ack_in(consumer, m1, "t")
    ack_in(consumer, m2, "t")
    tx(consumer, "COMMIT", "t")
    consumer.close()
    successor = stomp_client(broker)
    successor.subscribe(queue)
    successor.barrier()
    assert successor.messages == []
    assert depth(broker, queue) == 0


def test_acks_in_an_aborted_transaction_are_redelivered(broker, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    producer.send(queue, b"m1")
    producer.send(queue, b"m2")
    consumer = stomp_client(broker)
    consumer.subscribe(queue, ack="client-individual")
    m1, m2 = consumer.wait_messages(2)
    tx(consumer, "BEGIN", "t")
    ack_in(consumer, m1, "t")
    ack_in(consumer, m2, "t")
    tx(consumer, "ABORT", "t")
    again = consumer.wait_messages(4)[2:]
    assert [m.body for m in again] == [b"m1", b"m2"]
    assert all(m.headers["redelivered"] == "true" for m in again)
    assert all(m.headers["x-delivery-count"] == "1" for m in again)


def test_nack_in_a_transaction_waits_for_commit(broker, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    producer.send(queue, b"m1")
    consumer = stomp_client(broker)
    consumer.subscribe(queue, ack="client-individual")
    (m1,) = consumer.wait_messages(1)
    tx(consumer, "BEGIN", "t")
    nack_in(consumer, m1, "t")
    consumer.barrier()
    assert len(consumer.messages) == 1, "a NACK in a transaction redelivered before COMMIT"
    tx(consumer, "COMMIT", "t")
    again = consumer.wait_messages(2)[1]
    assert again.body == b"m1"
    assert again.headers["x-delivery-count"] == "1"


def test_dropped_connection_aborts_its_open_transaction_sends(broker, stomp_client, raw_client):
    consumer = stomp_client(broker)
    queue = qname()
    consumer.subscribe(queue)
    raw = raw_client(broker)
    raw.connect()
    raw.send_frame("BEGIN", {"transaction": "t", "receipt": "b"})
    raw.receipt("b")
    raw.send_frame("SEND", {"destination": queue, "transaction": "t", "receipt": "s"}, b"never")
    raw.receipt("s")
    before = connections(broker)
    raw.abort()
    wait_for(lambda: connections(broker) == before - 1, what="dropped connection released")
    stomp_client(broker).send(queue, b"marker")
    consumer.wait_messages(1)
    consumer.barrier()
    assert consumer.bodies == [b"marker"]


def test_dropped_connection_aborts_its_open_transaction_acks(broker, stomp_client, raw_client):
    producer = stomp_client(broker)
    queue = qname()
    producer.send(queue, b"m1")
    raw = raw_client(broker)
    raw.connect()
    raw.send_frame("SUBSCRIBE", {"destination": queue, "id": "1", "ack": "client-individual"})
    message = raw.expect("MESSAGE")
    raw.send_frame("BEGIN", {"transaction": "t"})
    raw.send_frame("ACK", {"id": message.headers["ack"], "transaction": "t", "receipt": "a"})
    raw.receipt("a")
    raw.abort()
    successor = stomp_client(broker)
    successor.subscribe(queue)
    again = successor.wait_messages(1)[0]
    assert again.body == b"m1"
    assert again.headers["redelivered"] == "true"


def test_begin_of_an_open_transaction_is_an_error(broker, stomp_client, raw_client):
    consumer = stomp_client(broker)
    queue = qname()
    consumer.subscribe(queue)
    raw = raw_client(broker)
    raw.connect()
    raw.send_frame("BEGIN", {"transaction": "t", "receipt": "b1"})
    raw.receipt("b1")
    raw.send_frame("SEND", {"destination": queue, "transaction": "t"}, b"in t")
    raw.send_frame("BEGIN", {"transaction": "t", "receipt": "b2"})
    error = raw.expect_error_and_close()
    assert error.headers["receipt-id"] == "b2"
    assert "t" in error.headers["message"]
    # The connection closed with the transaction open: its send is discarded.
    stomp_client(broker).send(queue, b"marker")
    consumer.wait_messages(1)
    consumer.barrier()
    assert consumer.bodies == [b"marker"]


@pytest.mark.parametrize(
    ("command", "headers"),
    [
        ("COMMIT", {"transaction": "never-begun"}),
        ("ABORT", {"transaction": "never-begun"}),
        ("SEND", {"transaction": "never-begun", "destination": "/queue/tx-unknown"}),
        ("COMMIT", {"transaction": "done"}),  # already committed below
    ],
)
def test_unknown_transaction_is_an_error(broker, raw_client, command, headers):
    raw = raw_client(broker)
    raw.connect()
    raw.send_frame("BEGIN", {"transaction": "done"})
    raw.send_frame("COMMIT", {"transaction": "done", "receipt": "c"})
    raw.receipt("c")
    raw.send_frame(command, {**headers, "receipt": "bad"})
    error = raw.expect_error_and_close()
    assert error.headers["receipt-id"] == "bad"
    assert "transaction" in error.headers["message"]


def test_ack_in_an_unknown_transaction_is_an_error(broker, raw_client, stomp_client):
    producer = stomp_client(broker)
    queue = qname()
    producer.send(queue, b"m1")
    raw = raw_client(broker)
    raw.connect()
    raw.send_frame("SUBSCRIBE", {"destination": queue, "id": "1", "ack": "client"})
    message = raw.expect("MESSAGE")
    raw.send_frame("ACK", {"id": message.headers["ack"], "transaction": "nope", "receipt": "bad"})
    error = raw.expect_error_and_close()
    assert error.headers["receipt-id"] == "bad"
    # The message was not acked: it comes back.
    successor = stomp_client(broker)
    successor.subscribe(queue)
    assert successor.wait_messages(1)[0].body == b"m1"


def test_missing_transaction_header_is_an_error(broker, raw_client):
    raw = raw_client(broker)
    raw.connect()
    raw.send_frame("BEGIN", {"receipt": "b"})
    error = raw.expect_error_and_close()
    assert error.headers["receipt-id"] == "b"
    assert "transaction" in error.headers["message"]


def test_open_transactions_are_bounded_in_bytes_per_connection_and_broker_wide(broker_factory, raw_client):
    broker = broker_factory(broker={"max_transaction_bytes_per_client": 1000, "max_transaction_bytes_total": 1500})
    queue = qname()
    held = lambda: broker.call(lambda: broker.running.broker.transaction_bytes)  # noqa: E731

    def session(transaction: str):
        client = raw_client(broker)
        client.connect()
        client.send_frame("BEGIN", {"transaction": transaction, "receipt": "b"})
        client.receipt("b")
        return client

    def send(client, transaction: str, size: int, receipt: str) -> None:
        client.send_frame("SEND", {"destination": queue, "transaction": transaction, "receipt": receipt}, b"x" * size)

    first = session("a")
    send(first, "a", 900, "a1")
    first.receipt("a1")
    second = session("b")
    send(second, "b", 500, "b1")
    second.receipt("b1")
    send(second, "b", 200, "b2")  # 1,600 in all
    error = second.expect_error_and_close()
    assert (error.headers["receipt-id"], error.headers["message"]) == (
        "b2", "open transactions on the broker hold too many bytes (limit 1500)"
    )
    send(first, "a", 200, "a2")  # 1,100 on one connection
    error = first.expect_error_and_close()
    assert (error.headers["receipt-id"], error.headers["message"]) == (
        "a2", "open transactions on this connection hold too many bytes (limit 1000)"
    )
    wait_for(lambda: held() == 0, what="closing frees a connection's transaction bytes")
    # Freed on close, commit and abort alike: each 900 fits again.
    third = session("c")
    for step, end in enumerate(["COMMIT", "ABORT"]):
        send(third, "c", 900, f"c{step}")
        third.receipt(f"c{step}")
        third.send_frame(end, {"transaction": "c", "receipt": end})
        third.receipt(end)
        third.send_frame("BEGIN", {"transaction": "c", "receipt": f"again{step}"})
        third.receipt(f"again{step}")
    send(third, "c", 900, "last")
    third.receipt("last")
    assert depth(broker, queue) == 1  # the committed one
