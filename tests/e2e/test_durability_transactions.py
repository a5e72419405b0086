"""Crash tests for transactions: producers commit transactions of 1-8
persistent SENDs while the real broker process is killed with SIGKILL; after
each restart every transaction is there whole or not at all, and every
receipted COMMIT is there.

Black-box: raw STOMP 1.2 sockets against ``gateway serve --stomp-port P
--data-dir D`` on a free loopback port; the promises checked and
``DURABILITY_SEED`` are described in tests/support/durability_helpers.py.  Every loop
and wait is bounded.  ``-s`` shows each test's ledger summary.
"""

from __future__ import annotations

import collections
import itertools
import random
import threading
import time
from collections.abc import Iterator

from gateway.stomp import frames
from tests.support.durability_helpers import PREFETCH, Peer, join_all, seeded
from tests.support.helpers import unique


TX_ROUNDS = 8


class TxProducer(threading.Thread):
    """BEGIN, 1-8 persistent SENDs, COMMIT with a receipt; up to 4 transactions
    in flight; until the connection dies."""

    def __init__(self, name: str, port: int, queue: str, rng: random.Random, txs: dict[str, list[str]],
                 committed: set[str], counter: Iterator[int], deadline: float) -> None:
        super().__init__(name=f"tx producer {name}", daemon=True)
        self.peer = Peer(port)
        self.producer = name
        self.queue = queue
        self.rng = rng
        self.txs = txs
        self.committed = committed
        self.counter = counter
        self.deadline = deadline
        self.errors: list[frames.Frame] = []

    def run(self) -> None:
        peer, in_flight = self.peer, set()
        while not peer.dead and time.monotonic() < self.deadline:
            while len(in_flight) < 4 and not peer.dead:
                tx = f"{self.producer}.{next(self.counter)}"
                bodies = [f"{tx}-{i}" for i in range(self.rng.randint(1, 8))]
                self.txs[tx] = bodies
                ok = peer.send("BEGIN", {"transaction": tx})
                for body in bodies:
                    ok = ok and peer.send("SEND", {"destination": self.queue, "transaction": tx, "persistent": "true",
                                                   "content-length": str(len(body))}, body.encode())
                if ok and peer.send("COMMIT", {"transaction": tx, "receipt": "c:" + tx}):
                    in_flight.add(tx)
            for frame in peer.poll(0.05):
                if frame.command == "RECEIPT":
                    tx = frame.headers["receipt-id"].removeprefix("c:")
                    in_flight.discard(tx)
                    self.committed.add(tx)
                elif frame.command == "ERROR":
                    self.errors.append(frame)
        peer.close()


def test_a_transaction_is_all_or_nothing_across_sigkill(broker_process):
    rng = seeded("transaction crash")
    broker = broker_process()
    queue = f"/queue/{unique('txcrash')}"
    txs: dict[str, list[str]] = {}
    committed: set[str] = set()
    seen: collections.Counter[str] = collections.Counter()
    counters = {name: itertools.count() for name in ("x0", "x1", "x2")}
    broker.start()
    for round_ in range(1, TX_ROUNDS + 1):
        deadline = time.monotonic() + 30
        threads = [TxProducer(name, broker.port, queue, random.Random(rng.random()), txs, committed,
                              counters[name], deadline) for name in counters]
        for thread in threads:
            thread.start()
        time.sleep(rng.uniform(0.05, 0.6))
        broker.kill()
        join_all(threads)
        for thread in threads:
            assert not thread.errors, thread.errors
        # Back: drain the queue (every message acked with a receipt) and look
        # at each transaction as a whole.
        broker.start()
        owed = {body for tx in committed for body in txs[tx]} - set(seen)
        peer = Peer(broker.port)
        peer.request("SUBSCRIBE", {"id": "c", "destination": queue, "ack": "client-individual",
                                   "activemq.prefetchSize": PREFETCH})
        now: collections.Counter[str] = collections.Counter()
        acks: set[str] = set()
        end = time.monotonic() + 20
        quiet_since = time.monotonic()
        while time.monotonic() < end:
            got = peer.poll(0.05)
            for frame in got:
                if frame.command == "MESSAGE":
                    body = frame.body.decode()
                    now[body] += 1
                    acks.add(body)
                    peer.send("ACK", {"id": frame.headers["ack"], "receipt": "a:" + body})
                elif frame.command == "RECEIPT":
                    acks.discard(frame.headers["receipt-id"].removeprefix("a:"))
                else:
                    raise AssertionError(f"round {round_}: {frame!r}")
            if got:
                quiet_since = time.monotonic()
            # Done when everything owed came, every ACK is receipted and the
            # queue has been quiet for a moment (what was maybe-committed).
            if owed <= set(now) and not acks and time.monotonic() - quiet_since > 0.3:
                break
        else:
            raise AssertionError(f"round {round_}: {len(owed - set(now))} committed messages missing "
                                 f"(e.g. {sorted(owed - set(now))[:5]}) or {len(acks)} ACKs without receipt")
        assert all(n == 1 for n in now.values()), [b for b, n in now.items() if n > 1][:10]
        again = [b for b in now if seen[b]]
        assert not again, f"round {round_}: acked (with receipt) in an earlier round, delivered again: {again[:10]}"
        seen.update(now)
        by_tx: dict[str, set[str]] = collections.defaultdict(set)
        for body in now:
            by_tx[body.rpartition("-")[0]].add(body)
        partial = {tx: sorted(got) for tx, got in by_tx.items() if got != set(txs[tx])}
        assert not partial, f"round {round_}: transactions only partly there: {dict(list(partial.items())[:5])}"
        # Order within a transaction and between a producer's transactions.
        order = [b for b in now]  # delivery order: Counter keeps insertion order
        for name in counters:
            mine = [(int(b.split(".")[1].split("-")[0]), int(b.rpartition("-")[2])) for b in order if b.startswith(name + ".")]
            assert mine == sorted(mine), f"round {round_}: {name}'s messages out of order"
        peer.disconnect()
    assert broker.terminate() == 0
    print(f"{TX_ROUNDS} kills; {len(txs)} transactions begun, {len(committed)} COMMITs receipted, "
          f"{len({b.rpartition('-')[0] for b in seen})} transactions delivered, {len(seen)} messages")
    assert len(committed) >= 5 * TX_ROUNDS, f"only {len(committed)} of {len(txs)} COMMITs receipted: do receipts stall?"
