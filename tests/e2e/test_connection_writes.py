"""How a connection's output reaches the socket, through real sockets: what a
pass produces is written at its end (straight to the socket when it takes it
whole, else by the connection's writer task), so these pin what a client
relies on whichever way the bytes go: a flood on one connection does not
starve another, a message larger than the socket takes at once arrives whole
and in order, and a durability promise still waits for the store."""

from __future__ import annotations

import socket
import threading
import time

import trio

from gateway.mqtt.codec import packets as p
from tests.support.helpers import TIMEOUT, encode_frame, unique
from tests.support.mqtt_helpers import RawMqtt


def test_a_flooding_producer_does_not_starve_another_clients_round_trip(broker, raw_client):
    flooder = raw_client(broker)
    flooder.connect(heart_beat="0,0")
    # To a topic nobody subscribes to: nothing holds the producer back, so
    # the broker always finds a full read waiting on its socket.
    blob = encode_frame("SEND", {"destination": f"/topic/{unique('void')}"}, b"x" * 100) * 2000
    flooding, stop = threading.Event(), threading.Event()

    def flood() -> None:
        give_up = time.monotonic() + 6 * TIMEOUT  # bounded even if the broker starved everyone
        while not stop.is_set() and time.monotonic() < give_up:
            flooder.send(blob)
            flooding.set()

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    try:
        assert flooding.wait(TIMEOUT)
        other = raw_client(broker)
        other.connect(heart_beat="0,0")
        queue = f"/queue/{unique('beside')}"
        other.send_frame("SUBSCRIBE", {"destination": queue, "id": "1", "receipt": "s"})
        other.receipt("s")
        other.send_frame("SEND", {"destination": queue, "receipt": "r"}, b"hello")
        got = sorted((other.next_frame(), other.next_frame()), key=lambda f: f.command)
        assert [f.command for f in got] == ["MESSAGE", "RECEIPT"]
        assert got[0].body == b"hello" and got[1].headers["receipt-id"] == "r"
        assert thread.is_alive(), "the flood ended before the other client was served"
    finally:
        stop.set()
        thread.join(TIMEOUT)


def test_a_message_larger_than_the_socket_takes_at_once_arrives_whole_and_in_order(broker, raw_client):
    queue = f"/queue/{unique('big')}"
    consumer = raw_client(broker, rcvbuf=4096)  # a small window: the broker's send cannot finish at once
    consumer.connect(heart_beat="0,0")
    consumer.send_frame("SUBSCRIBE", {"destination": queue, "id": "1", "receipt": "s"})
    consumer.receipt("s")
    producer = raw_client(broker)
    producer.connect(heart_beat="0,0")
    big = bytes(range(256)) * (3 * 4096 + 7)  # about 3 MiB, no byte pattern aligned to a send
    bodies = [b"before", big, b"after-1", b"after-2"]
    for i, body in enumerate(bodies):
        producer.send_frame("SEND", {"destination": queue, "receipt": f"r{i}", "content-length": str(len(body))}, body)
    for i in range(len(bodies)):
        producer.receipt(f"r{i}")  # all routed while the consumer has read nothing
    received = [consumer.expect("MESSAGE").body for _ in bodies]
    assert [len(b) for b in received] == [len(b) for b in bodies]
    assert received == bodies


class HeldStore:
    """The store's writes held in their worker thread until released."""

    def __init__(self, broker, monkeypatch) -> None:
        self.broker = broker
        self.release = threading.Event()
        write_batch = broker.running.store.write_batch
        run_sync = trio.to_thread.run_sync

        def held_write(batch) -> None:
            assert self.release.wait(6 * TIMEOUT), "the test never released the store"
            write_batch(batch)

        async def to_thread(fn, *args, **kwargs):
            # The committer hands store.write_batch to a worker thread
            # (gateway/tasks.py): held there, as a slow disk would. Patched
            # at that call, not on the store: a compiled Store (make fast)
            # has no instance attributes to replace.
            return await run_sync(held_write if fn == write_batch else fn, *args, **kwargs)

        monkeypatch.setattr(trio.to_thread, "run_sync", to_thread)

    def pending(self) -> bool:
        store = self.broker.running.store
        return self.broker.call(lambda: store.appended_lsn > store.durable_lsn)


def test_a_receipt_and_what_follows_it_wait_for_the_store(broker, raw_client, monkeypatch):
    held = HeldStore(broker, monkeypatch)
    queue = f"/queue/{unique('kept')}"
    producer = raw_client(broker)
    producer.connect(heart_beat="0,0")
    try:
        producer.send_frame("SEND", {"destination": queue, "persistent": "true", "receipt": "stored"}, b"kept")
        producer.send_frame("SEND", {"destination": f"/topic/{unique('void')}", "receipt": "after"}, b"x")
        assert producer.quiet_for(0.5) == []  # neither the promise nor the receipt queued behind it
        assert held.pending()
    finally:
        held.release.set()
    assert [producer.expect("RECEIPT").headers["receipt-id"] for _ in range(2)] == ["stored", "after"]
    assert not held.pending()


def test_a_receipt_held_for_the_store_still_reaches_a_client_that_closed_its_sending_side(broker, raw_client, monkeypatch):
    # SEND, DISCONNECT, then EOF from the client (it only reads from now on):
    # the session is closed and the reader has ended while the receipt still
    # waits for the store; the connection must stay until it is written.
    held = HeldStore(broker, monkeypatch)
    producer = raw_client(broker)
    producer.connect(heart_beat="0,0")
    try:
        producer.send_frame("SEND", {"destination": f"/queue/{unique('kept')}", "persistent": "true", "receipt": "stored"}, b"kept")
        producer.send_frame("DISCONNECT", {"receipt": "bye"})
        producer.sock.shutdown(socket.SHUT_WR)
        assert producer.quiet_for(0.5) == []
        assert held.pending()
    finally:
        held.release.set()
    assert [producer.expect("RECEIPT").headers["receipt-id"] for _ in range(2)] == ["stored", "bye"]


def test_a_qos1_puback_waits_for_the_store(broker, monkeypatch):
    topic = unique("kept")
    subscriber = RawMqtt(broker.mqtt_port)  # a persistent session away: the message is stored for it
    subscriber.send(p.Connect("away", clean_session=False))
    assert subscriber.next() == p.ConnAck(False, 0)
    subscriber.send(p.Subscribe(1, [(topic, 1)]))
    assert subscriber.next() == p.SubAck(1, [1])
    subscriber.close()
    held = HeldStore(broker, monkeypatch)
    publisher = RawMqtt(broker.mqtt_port)
    try:
        publisher.send(p.Connect("writer"))
        assert publisher.next() == p.ConnAck(False, 0)
        publisher.send(p.Publish(topic, b"kept", qos=1, packet_id=7))
        publisher.pump(0.5)
        assert publisher.packets == []
        assert held.pending()
    finally:
        held.release.set()
    assert publisher.next() == p.PubAck(7)
    publisher.close()
