"""A clean SIGTERM in the middle of traffic keeps everything the broker had
processed, stricter than a crash: queue and durable topic messages, acks
receipted or processed before a DISCONNECT receipt, over two clean restarts.

Black-box: raw STOMP 1.2 sockets against ``gateway serve --stomp-port P
--data-dir D`` on a free loopback port; the promises checked and
``DURABILITY_SEED`` are described in tests/support/durability_helpers.py.  Every loop
and wait is bounded.  ``-s`` shows each test's ledger summary.
"""

from __future__ import annotations

import threading
import time

from tests.support.durability_helpers import (
    ACTIVEMQ,
    Ledger,
    Peer,
    Producer,
    consume,
    join_all,
    publish,
    seeded,
    wait_delivered,
)
from tests.support.helpers import unique


def test_everything_survives_a_sigterm_in_the_middle_of_traffic(broker_process):
    rng = seeded("sigterm")
    broker = broker_process()
    ledger = Ledger()
    topic_ledger = Ledger()
    queue = f"/queue/{unique('term')}"
    topic = f"/topic/{unique('term')}"
    client = {"client-id": unique("term-app")}
    broker.start()
    ledger.new_session()
    topic_ledger.new_session()
    sub = Peer(broker.port, **client)
    sub.request("SUBSCRIBE", {"id": "d", "destination": topic, "ack": "client-individual", **ACTIVEMQ})
    sub.disconnect()

    # A quiet phase whose outcome is exact: 300 receipted messages each to the
    # queue and the topic; of the queue's, 100 acked with a receipt each, 50
    # more acked without one before a DISCONNECT receipt.
    seqs = {"q": 0, "t": 0}
    for name, dest, book in (("q", queue, ledger), ("t", topic, topic_ledger)):
        bodies = [f"{name}-{seq:07d}" for seq in range(300)]
        seqs[name] = 300
        for body in bodies:
            book.note_sent(body)
        publish(broker.port, dest, bodies)
        for body in bodies:
            book.note_receipted(body)
    consumer = Peer(broker.port)
    got = consumer.request("SUBSCRIBE", {"id": "c", "destination": queue, "ack": "client-individual",
                                         "activemq.prefetchSize": "150"}, keep=False)
    deadline = time.monotonic() + 10
    while len(got) < 150 and time.monotonic() < deadline:
        got += consumer.poll(0.05)
    assert len(got) == 150 and all(f.command == "MESSAGE" for f in got), got[-1:]
    for i, frame in enumerate(got):
        body = frame.body.decode()
        ledger.delivered(body, False)
        if i < 100:
            consumer.request("ACK", {"id": frame.headers["ack"]})
            ledger.note_acked(body)
        else:
            consumer.send("ACK", {"id": frame.headers["ack"]})
    consumer.disconnect()
    # Processed before the DISCONNECT receipt, and a clean stop loses nothing
    # it had processed: stricter than after a crash.
    ledger.acked.update(f.body.decode() for f in got)

    # Then traffic, and SIGTERM lands in the middle of it.
    stop = threading.Event()
    deadline = time.monotonic() + 30
    threads = [Producer("q", broker.port, queue, ledger, seqs, 16, stop, deadline),
               Producer("t", broker.port, topic, topic_ledger, seqs, 16, stop, deadline)]
    for thread in threads:
        thread.start()
    time.sleep(rng.uniform(0.1, 0.5))
    assert broker.terminate() == 0, broker.log_tail()
    join_all(threads)
    for book in (ledger, topic_ledger):  # being told of the shutdown is fine
        book.errors = [e for e in book.errors if "shut" not in e]

    for restart in range(2):  # a second clean restart changes nothing
        broker.start()
        for book, dest, extra in ((ledger, queue, {}), (topic_ledger, topic, {"id": "d", **ACTIVEMQ})):
            book.new_session()
            required = book.required()
            c = consume(broker.port, dest, book, rng, time.monotonic() + 30, connect=client if extra else None,
                        subscribe=extra, ack_p=0.0)
            wait_delivered(book, required, broker, 20.0, f"after SIGTERM #{restart + 1} ({dest})")
            c.stop.set()
            join_all([c])
            c.peer.disconnect()
            book.check()
        assert broker.terminate() == 0, broker.log_tail()
    print(f"queue: {ledger.summary()}; topic: {topic_ledger.summary()}")
