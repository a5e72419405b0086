"""Producer flow control on topics, end to end: a subscriber that reads slowly
slows the producer down instead of losing messages; one that stops reading is
cut loose so the others keep flowing (tests/e2e/test_errors.py)."""

from __future__ import annotations

import threading
import time

from tests.support.helpers import unique, wait_for


def test_a_slow_reader_slows_the_topic_producer_and_loses_nothing(broker_factory, raw_client, stomp_client):
    # Small buffers so that, without flow control, the producer would overrun
    # the subscriber's topic buffer within a few milliseconds.
    broker = broker_factory(
        broker={"topic_high_water": 20, "topic_buffer_limit": 40},
        stomp={"outbox_high_water_bytes": 8192},
    )
    topic = f"/topic/{unique('flow')}"
    reader = raw_client(broker, rcvbuf=4096)
    reader.connect(heart_beat="0,0")
    reader.send_frame("SUBSCRIBE", {"destination": topic, "id": "1", "receipt": "s"})
    reader.receipt("s")
    producer = stomp_client(broker)
    count = 1500
    bodies = [f"{i:05d}".encode() + b"x" * 1000 for i in range(count)]

    def produce() -> None:
        for i, body in enumerate(bodies):
            producer.send(topic, body, receipt=(i == count - 1))

    sender = threading.Thread(target=produce)
    sender.start()
    received = []
    while len(received) < count:
        received.append(reader.expect("MESSAGE").body)
        if len(received) % 8 == 0:
            time.sleep(0.002)  # about 4,000 messages a second: slower than the producer
    sender.join(10)
    assert not sender.is_alive()
    assert received == bodies
    assert broker.call(lambda: broker.running.broker.stats.producer_holds) > 0, "flow control never engaged"
    discarded = broker.call(
        lambda: sum(q.stats.discarded for c in broker.running.server.connections.values()
                    if c.session.client is not None for s in c.session.client.subscriptions.values()
                    for q in [s.queue])
    )
    assert discarded == 0


def test_a_full_queue_holds_its_producer_until_consumers_make_room(broker_factory, raw_client, stomp_client):
    broker = broker_factory(broker={"queue_high_water": 10})
    queue = f"/queue/{unique('full')}"
    producer = raw_client(broker)
    producer.connect(heart_beat="0,0")
    for i in range(30):
        producer.send_frame("SEND", {"destination": queue, "receipt": f"r{i}"}, f"m{i}".encode())
    receipts = [producer.expect("RECEIPT").headers["receipt-id"] for _ in range(10)]
    assert receipts == [f"r{i}" for i in range(10)]
    wait_for(lambda: broker.call(lambda: broker.running.broker.stats.producer_holds) >= 1, what="the producer held")
    assert producer.quiet_for(0.3) == [], "the producer was not held at the high-water mark"
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    consumer.wait_messages(30)
    assert consumer.bodies == [f"m{i}".encode() for i in range(30)]
    rest = []
    while len(rest) < 20:
        rest.append(producer.expect("RECEIPT").headers["receipt-id"])
    assert rest == [f"r{i}" for i in range(10, 30)]


def test_a_producer_held_after_its_commit_can_still_disconnect_with_a_receipt(broker_factory, raw_client, stomp_client):
    # As a Spark writer task does: a transaction that takes the queue past its
    # high-water mark, COMMIT with a receipt, then DISCONNECT with a receipt.
    broker = broker_factory(broker={"queue_high_water": 10})
    queue = f"/queue/{unique('held-bye')}"
    producer = raw_client(broker)
    producer.connect(heart_beat="0,0")
    producer.send_frame("BEGIN", {"transaction": "t"})
    for i in range(25):
        producer.send_frame("SEND", {"destination": queue, "transaction": "t"}, f"m{i}".encode())
    producer.send_frame("COMMIT", {"transaction": "t", "receipt": "c"})
    # The receipt says the commit filled the queue, so a writer that is then
    # held can name the queue and its limit.
    assert producer.receipt("c").headers["held-by"] == f"{queue} (high-water mark 10 messages)"
    wait_for(lambda: broker.call(lambda: broker.running.broker.stats.producer_holds) >= 1, what="the producer held")
    producer.send_frame("DISCONNECT", {"receipt": "bye"})
    producer.receipt("bye")
    assert producer.wait_closed() == []
    wait_for(lambda: broker.call(lambda: len(broker.running.server.connections)) == 0, what="the held connection released")
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    assert [m.body for m in consumer.wait_messages(25)] == [f"m{i}".encode() for i in range(25)]


def test_a_disconnect_behind_a_held_send_waits_its_turn(broker_factory, raw_client, stomp_client):
    # Frames stay in order: only a DISCONNECT that comes next is handled while
    # the producer is held; one behind a held SEND waits for the SEND.
    broker = broker_factory(broker={"queue_high_water": 3})
    queue = f"/queue/{unique('held-order')}"
    producer = raw_client(broker)
    producer.connect(heart_beat="0,0")
    for i in range(4):
        producer.send_frame("SEND", {"destination": queue, "receipt": f"r{i}"}, f"m{i}".encode())
    assert [producer.expect("RECEIPT").headers["receipt-id"] for _ in range(3)] == ["r0", "r1", "r2"]
    producer.send_frame("DISCONNECT", {"receipt": "bye"})
    assert producer.quiet_for(0.3) == [], "a frame behind a held SEND was handled before it"
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    consumer.wait_messages(4)
    assert [producer.expect("RECEIPT").headers["receipt-id"] for _ in range(2)] == ["r3", "bye"]
    assert producer.wait_closed() == []


def test_with_send_fail_if_no_space_a_full_queue_refuses_the_send(broker_factory, raw_client):
    broker = broker_factory(broker={"queue_high_water": 5, "send_fail_if_no_space": True})
    queue = f"/queue/{unique('refuse')}"
    producer = raw_client(broker)
    producer.connect(heart_beat="0,0")
    for i in range(5):
        producer.send_frame("SEND", {"destination": queue, "receipt": f"r{i}"}, b"x")
        producer.receipt(f"r{i}")
    producer.send_frame("SEND", {"destination": queue, "receipt": "over"}, b"x")
    error = producer.expect_error_and_close()
    assert error.headers["receipt-id"] == "over" and "full" in error.headers["message"]


def test_an_mqtt_publisher_is_held_back_by_a_slow_subscriber_too(broker_factory, raw_client, raw_mqtt):
    from gateway.mqtt.codec import packets

    broker = broker_factory(broker={"topic_high_water": 20, "topic_buffer_limit": 40},
                            stomp={"outbox_high_water_bytes": 8192})
    name = unique("mqttflow")
    reader = raw_client(broker, rcvbuf=4096)
    reader.connect(heart_beat="0,0")
    reader.send_frame("SUBSCRIBE", {"destination": f"/topic/{name}", "id": "1", "receipt": "s"})
    reader.receipt("s")
    publisher = raw_mqtt(broker, "publisher")
    publisher.sock.settimeout(30)  # held back for a while by design
    count = 1500
    wire = b"".join(publisher.codec.send(packets.Publish(name, f"{i:05d}".encode() + b"x" * 1000)) for i in range(count))
    sender = threading.Thread(target=publisher.send_raw, args=(wire,))
    sender.start()
    received = []
    while len(received) < count:
        received.append(reader.expect("MESSAGE").body)
        if len(received) % 8 == 0:
            time.sleep(0.002)
    sender.join(10)
    assert not sender.is_alive()
    assert received == [f"{i:05d}".encode() + b"x" * 1000 for i in range(count)]
    assert broker.call(lambda: broker.running.broker.stats.producer_holds) > 0


def commit_frames(producer, queue: str, count: int) -> None:
    producer.send_frame("BEGIN", {"transaction": "t"})
    for i in range(count):
        producer.send_frame("SEND", {"destination": queue, "transaction": "t"}, f"m{i}".encode())
    producer.send_frame("COMMIT", {"transaction": "t", "receipt": "c"})


def test_with_send_fail_if_no_space_a_commit_that_would_overfill_a_queue_is_refused_whole(
    broker_factory, raw_client, stomp_client
):
    broker = broker_factory(broker={"queue_high_water": 5, "send_fail_if_no_space": True})
    queue = f"/queue/{unique('refuse')}"
    producer = raw_client(broker)
    producer.connect(heart_beat="0,0")
    commit_frames(producer, queue, 6)
    error = producer.expect_error_and_close()
    assert error.headers["receipt-id"] == "c" and "full" in error.headers["message"]
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    consumer.send(queue, b"marker")
    consumer.wait_messages(1)
    consumer.barrier()
    assert consumer.bodies == [b"marker"]  # nothing of the refused transaction


def test_a_commit_into_a_full_queue_holds_its_producer_like_a_send(broker_factory, raw_client, stomp_client):
    broker = broker_factory(broker={"queue_high_water": 10})
    queue = f"/queue/{unique('full')}"
    producer = raw_client(broker)
    producer.connect(heart_beat="0,0")
    commit_frames(producer, queue, 12)
    producer.receipt("c")
    producer.send_frame("SEND", {"destination": queue, "receipt": "after"}, b"after")
    assert broker.call(lambda: broker.running.broker.stats.producer_holds) == 1
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    consumer.wait_messages(13)
    assert consumer.bodies == [f"m{i}".encode() for i in range(12)] + [b"after"]
    producer.receipt("after")  # read once the queue drained
