"""What the crash tests (tests/e2e/test_durability_*.py) share: connections
that survive their broker's death (Peer), the ledger of what the broker
promised, producer and consumer threads, and publishing on a connection of
its own.  The broker process itself is tests.support.processes.BrokerProcess.

The promises are ActiveMQ's STOMP semantics:

* a RECEIPT for a persistent SEND means the message is on disk: until an ACK
  for it is sent it comes back after every crash, exactly once per consumer
  session (each restart starts one), in order per producer;
* a RECEIPT for an ACK means the message never comes back; an ACK without one
  (yet) may or may not have reached the disk;
* anything not receipted may or may not be there, but never twice;
* a RECEIPT for a COMMIT means all of the transaction's messages are there, and
  without it either all or none are.

Randomness (kill times, which messages are acked, transaction sizes) comes
from one seed printed at the start of each test; set ``DURABILITY_SEED`` to
replay the same decisions (thread timing still varies from run to run).
"""

from __future__ import annotations

import collections
import os
import random
import threading
import time
from collections.abc import Iterable
from typing import Any

from gateway.stomp import frames
from tests.support.helpers import RawClient, unique
from tests.support.processes import HOST, BrokerProcess

PREFETCH = "1000000"  # a consumer that leaves messages unacked must not run out of credit
ACTIVEMQ = {"activemq.subscriptionName": "S"}


def seeded(name: str) -> random.Random:
    env = os.environ.get("DURABILITY_SEED")
    seed = int(env) if env else random.SystemRandom().randrange(2**32)
    print(f"\n{name}: DURABILITY_SEED={seed}")
    return random.Random(seed)


# -- connections that survive their broker's death -----------------------------


class Peer:
    """A raw STOMP 1.2 connection whose reads and writes never raise because
    the broker died: the ledger needs to know what arrived, not how it ended.
    (Frames the broker wrote before it was killed are still read.)"""

    made: list[Peer] = []  # every one made, closed by the broker_process fixture

    def __init__(self, port: int, **connect_headers: str) -> None:
        self.raw = RawClient((HOST, port), timeout=5.0)
        Peer.made.append(self)
        self.raw.connect(heart_beat="0,0", **connect_headers)
        self.dead = False
        self.errors: list[frames.Frame] = []

    def send(self, command: str, headers: dict[str, str], body: bytes = b"") -> bool:
        if self.dead:
            return False
        try:
            self.raw.send_frame(command, headers, body)
            return True
        except OSError:
            self.dead = True
            return False

    def poll(self, timeout: float) -> list[frames.Frame]:
        """What arrives within ``timeout`` (maybe nothing); ``dead`` at EOF."""
        raw = self.raw
        if not raw.frames and not raw.eof:
            try:
                raw.pump(timeout)
            except OSError:
                raw.eof = True
        got = list(raw.frames)
        raw.frames.clear()
        if raw.eof:
            self.dead = True
        self.errors.extend(f for f in got if f.command == "ERROR")
        return got

    def request(self, command: str, headers: dict[str, str], body: bytes = b"", timeout: float = 10.0,
                keep: bool = True) -> list[frames.Frame]:
        """Send with a receipt and wait for it.  Frames that came before the
        receipt are returned, or with ``keep`` left to be read (as are any
        that came with it in the same read)."""
        rid = unique("req-")
        assert self.send(command, {**headers, "receipt": rid}, body), f"{command}: connection lost"
        before: list[frames.Frame] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.poll(0.05)
            for i, frame in enumerate(got):
                if frame.command == "RECEIPT" and frame.headers.get("receipt-id") == rid:
                    rest = got[i + 1:]
                    if keep:
                        rest, before = before + rest, []
                    self.raw.frames.extendleft(reversed(rest))
                    return before
                assert frame.command != "ERROR", f"{command} answered with {frame!r}"
                before.append(frame)
            assert not self.dead, f"connection closed while waiting for the receipt of {command}"
        raise AssertionError(f"no receipt for {command} within {timeout} s")

    def disconnect(self) -> None:
        """DISCONNECT with a receipt: everything before it has been processed."""
        self.request("DISCONNECT", {})
        self.close()

    def close(self) -> None:
        self.raw.close()
        self.dead = True


# -- the ledger ----------------------------------------------------------------


def producer_of(body: str) -> tuple[str, int]:
    """Bodies are ``<producer>-<seq>``."""
    name, _, seq = body.rpartition("-")
    return name, int(seq)


class Ledger:
    """What was sent and what the broker promised, per message body, and every
    violation seen on delivery.  One lock guards it all (several threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: set[str] = set()
        self.receipted: set[str] = set()  # SEND receipted: must be there until its ACK is receipted
        self.ack_sent: set[str] = set()
        # ACK sent, no receipt (yet): may or may not come back.  Coming back
        # shows the ACK was lost; then it is owed again.
        self.ack_pending: set[str] = set()
        self.acked: set[str] = set()  # ACK receipted: must never come back
        self.deliveries: collections.Counter[str] = collections.Counter()  # over all lifetimes
        self.session = 0
        self.seen: collections.Counter[str] = collections.Counter()  # in the current session
        self.last_seq: dict[str, int] = {}  # per producer, in the current session
        self.redelivered = 0
        self.violations: list[str] = []
        self.errors: list[str] = []

    def new_session(self) -> None:
        """A consumer (re)connects: each message once per session, in producer
        order.  (A broker restart always starts a new session.)"""
        with self.lock:
            self.session += 1
            self.seen.clear()
            self.last_seq.clear()

    def required(self) -> set[str]:
        with self.lock:
            return self.receipted - self.acked - self.ack_pending

    def note_sent(self, body: str) -> None:
        with self.lock:
            self.sent.add(body)

    def note_receipted(self, body: str) -> None:
        with self.lock:
            self.receipted.add(body)

    def note_ack_sent(self, body: str) -> None:
        with self.lock:
            self.ack_sent.add(body)
            self.ack_pending.add(body)

    def note_acked(self, body: str) -> None:
        with self.lock:
            self.acked.add(body)
            self.ack_pending.discard(body)

    def note_error(self, where: str, frame: frames.Frame) -> None:
        with self.lock:
            self.errors.append(f"session {self.session}, {where}: {frame!r}")

    def delivered(self, body: str, redelivered: bool) -> None:
        with self.lock:
            where = f"session {self.session}: {body}"
            if body not in self.sent:
                self.violations.append(f"{where} was never sent")
            if body in self.acked:
                self.violations.append(f"{where} came back although its ACK was receipted")
            self.seen[body] += 1
            self.deliveries[body] += 1
            self.ack_pending.discard(body)
            if self.seen[body] > 1:
                self.violations.append(f"{where} delivered {self.seen[body]} times")
            name, seq = producer_of(body)
            last = self.last_seq.get(name, -1)
            if seq <= last:
                self.violations.append(f"{where} after {name}-{last}: out of producer order")
            self.last_seq[name] = max(seq, last)
            self.redelivered += redelivered

    def missing(self, required: Iterable[str]) -> list[str]:
        with self.lock:
            return [b for b in required if not self.seen[b]]

    def check(self) -> None:
        with self.lock:
            problems = self.violations[:20] + self.errors[:5]
            assert not problems, "\n".join(problems) + (f"\n... ({len(self.violations)} violations)" if len(self.violations) > 20 else "")

    def summary(self) -> str:
        with self.lock:
            return (f"{self.session} sessions, {len(self.sent)} sent, {len(self.receipted)} receipted, "
                    f"{len(self.ack_sent)} ACKs sent, {len(self.acked)} ACKs receipted, "
                    f"{sum(self.deliveries.values())} deliveries ({self.redelivered} marked redelivered)")


def wait_delivered(ledger: Ledger, required: set[str], broker: BrokerProcess, timeout: float, what: str) -> None:
    """After a restart: every message the broker owes has arrived in this lifetime."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not ledger.missing(required):
            return
        assert broker.proc is not None and broker.proc.poll() is None, f"broker died:\n{broker.log_tail()}"
        time.sleep(0.02)
    ledger.check()  # a violation explains more than a count
    missing = sorted(ledger.missing(required))
    raise AssertionError(
        f"{what}: {len(missing)} of {len(required)} receipted, un-acked messages did not come back "
        f"within {timeout} s, e.g. {missing[:10]}\n{ledger.summary()}\n{broker.log_tail()}"
    )


# -- client threads ----------------------------------------------------------


class Producer(threading.Thread):
    """Persistent SENDs with a receipt each, ``window`` of them in flight;
    runs until its connection dies (the broker was killed) or ``stop``."""

    def __init__(self, name: str, port: int, destination: str, ledger: Ledger, seqs: dict[str, int],
                 window: int, stop: threading.Event, deadline: float) -> None:
        super().__init__(name=f"producer {name}", daemon=True)
        self.producer = name
        self.peer = Peer(port)
        self.destination = destination
        self.ledger = ledger
        self.seqs = seqs
        self.window = window
        self.stop = stop
        self.deadline = deadline
        self.in_flight: set[str] = set()

    def run(self) -> None:
        peer, ledger = self.peer, self.ledger
        while not peer.dead and time.monotonic() < self.deadline:
            while not self.stop.is_set() and len(self.in_flight) < self.window:
                body = f"{self.producer}-{self.seqs[self.producer]:07d}"
                self.seqs[self.producer] += 1
                ledger.note_sent(body)
                headers = {"destination": self.destination, "persistent": "true", "receipt": "s:" + body,
                           "content-type": "text/plain", "content-length": str(len(body))}
                if not peer.send("SEND", headers, body.encode()):
                    break
                self.in_flight.add(body)
            if self.stop.is_set() and not self.in_flight:
                break
            for frame in peer.poll(0.05):
                if frame.command == "RECEIPT":
                    body = frame.headers["receipt-id"].removeprefix("s:")
                    self.in_flight.discard(body)
                    ledger.note_receipted(body)
                elif frame.command == "ERROR":
                    ledger.note_error(self.name, frame)
        peer.close()


class Consumer(threading.Thread):
    """Takes MESSAGEs, hands them to the ledger, and ACKs each with probability
    ``ack_p`` (with a receipt with probability ``receipt_p``)."""

    def __init__(self, peer: Peer, ledger: Ledger, rng: random.Random, deadline: float,
                 ack_p: float = 0.6, receipt_p: float = 0.8) -> None:
        super().__init__(name="consumer", daemon=True)
        self.peer = peer
        self.ledger = ledger
        self.rng = rng
        self.deadline = deadline
        self.ack_p = ack_p
        self.receipt_p = receipt_p
        self.stop = threading.Event()

    def run(self) -> None:
        peer, ledger, rng = self.peer, self.ledger, self.rng
        while not peer.dead and not self.stop.is_set() and time.monotonic() < self.deadline:
            for frame in peer.poll(0.02):
                if frame.command == "MESSAGE":
                    body = frame.body.decode()
                    ledger.delivered(body, frame.headers.get("redelivered") == "true")
                    if rng.random() < self.ack_p:
                        headers = {"id": frame.headers["ack"]}
                        if rng.random() < self.receipt_p:
                            headers["receipt"] = "a:" + body
                        ledger.note_ack_sent(body)
                        peer.send("ACK", headers)
                elif frame.command == "RECEIPT" and frame.headers["receipt-id"].startswith("a:"):
                    ledger.note_acked(frame.headers["receipt-id"].removeprefix("a:"))
                elif frame.command == "ERROR":
                    ledger.note_error("consumer", frame)


def consume(port: int, destination: str, ledger: Ledger, rng: random.Random, deadline: float,
            connect: dict[str, str] | None = None, subscribe: dict[str, str] | None = None, **kwargs: Any) -> Consumer:
    peer = Peer(port, **(connect or {}))
    peer.request("SUBSCRIBE", {"id": "c", "destination": destination, "ack": "client-individual",
                               "activemq.prefetchSize": PREFETCH, **(subscribe or {})})
    consumer = Consumer(peer, ledger, rng, deadline, **kwargs)
    consumer.start()
    return consumer


def join_all(threads: Iterable[threading.Thread], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        assert not thread.is_alive(), f"{thread.name} still running {timeout} s after the broker stopped"


# -- publishing and receiving, each on a connection of its own -----------------


def publish(port: int, destination: str, bodies: list[str], **headers: str) -> None:
    """Persistent SENDs on a new connection, pipelined, each with a receipt
    (only a receipted message is promised), then DISCONNECT."""
    peer = Peer(port)
    pending = set()
    for body in bodies:
        rid = unique("pub-")
        pending.add(rid)
        assert peer.send("SEND", {"destination": destination, "persistent": "true", "receipt": rid,
                                  "content-length": str(len(body)), **headers}, body.encode()), "connection lost"
    deadline = time.monotonic() + 10
    while pending and time.monotonic() < deadline:
        for frame in peer.poll(0.05):
            assert frame.command == "RECEIPT", frame
            pending.discard(frame.headers["receipt-id"])
        assert not peer.dead, "connection lost while publishing"
    assert not pending, f"{len(pending)} of {len(bodies)} SENDs not receipted within 10 s"
    peer.disconnect()


def receive_until(peer: Peer, last: str, timeout: float = 10.0) -> list[str]:
    """Bodies of MESSAGEs up to and including ``last``, each acked with a
    receipt (so it is gone for good); returns once every ACK is receipted."""
    bodies: list[str] = []
    acks: set[str] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for frame in peer.poll(0.05):
            if frame.command == "RECEIPT":
                acks.discard(frame.headers["receipt-id"])
                continue
            assert frame.command == "MESSAGE", frame
            bodies.append(frame.body.decode())
            rid = unique("ack-")
            acks.add(rid)
            peer.send("ACK", {"id": frame.headers["ack"], "receipt": rid})
        if bodies and bodies[-1] == last and not acks:
            return bodies
        assert not peer.dead, f"connection lost; got {bodies}"
    raise AssertionError(f"{last!r} (and receipts for every ACK) did not arrive within {timeout} s; got {bodies}")
