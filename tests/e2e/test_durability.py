"""Crash tests: the real broker process is killed with SIGKILL at random
moments while producers and consumers are busy, restarted on the same data
folder, and what clients get afterwards is checked against a ledger of what
the broker promised (ActiveMQ-compatible STOMP semantics):

* a RECEIPT for a persistent SEND means the message is on disk: until an ACK
  for it is sent it comes back after every crash, exactly once per consumer
  session (each restart starts one), in order per producer;
* a RECEIPT for an ACK means the message never comes back; an ACK without one
  (yet) may or may not have reached the disk;
* anything not receipted may or may not be there, but never twice;
* a RECEIPT for a COMMIT means all of the transaction's messages are there, and
  without it either all or none are.

Everything is black-box: raw STOMP 1.2 sockets against ``gateway serve
--stomp-port P --data-dir D`` on a free loopback port.  Randomness (kill times,
which messages are acked, transaction sizes) comes from one seed printed at the
start of each test; set ``DURABILITY_SEED`` to replay the same decisions
(thread timing still varies from run to run).  Every loop and wait is bounded;
the whole file takes about a minute.  ``-s`` shows each test's ledger summary.
"""

from __future__ import annotations

import collections
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.stomp import frames
from tests.helpers import RawClient, unique, wait_for

GATEWAY = str(Path(sys.executable).parent / "gateway")
HOST = "127.0.0.1"
STARTUP_TIMEOUT = 30.0  # recovery of a store included
PREFETCH = "1000000"  # a consumer that leaves messages unacked must not run out of credit


def seeded(name: str) -> random.Random:
    env = os.environ.get("DURABILITY_SEED")
    seed = int(env) if env else random.SystemRandom().randrange(2**32)
    print(f"\n{name}: DURABILITY_SEED={seed}")
    return random.Random(seed)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def accepting(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.2):
            return True
    except OSError:
        return False


# -- the broker process --------------------------------------------------------


class BrokerProcess:
    """``gateway serve`` on one data folder, started and stopped many times.

    The output of every lifetime goes to one log file (a pipe could fill up
    and stall the broker); :meth:`log_tail` shows it in failure messages.
    """

    def __init__(self, tmp_path: Path, *extra: str) -> None:
        self.data_dir = tmp_path / "data"
        self.log_path = tmp_path / "broker.log"
        self.extra = list(extra)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.lifetimes = 0

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        for attempt in range(3):
            self.lifetimes += 1
            with open(self.log_path, "ab") as log:
                log.write(f"\n==== lifetime {self.lifetimes} (port {self.port}) ====\n".encode())
                log.flush()
                self.proc = subprocess.Popen(
                    [GATEWAY, "serve", "--bind", HOST, "--stomp-port", str(self.port), "--mqtt-port", "0",
                     "--admin-port", "0", "--data-dir", str(self.data_dir), "--log-level", "info", *self.extra],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.data_dir.parent,
                )
            deadline = time.monotonic() + STARTUP_TIMEOUT
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                if accepting(self.port):
                    return
                time.sleep(0.01)
            else:
                self.kill()
                raise AssertionError(f"broker not listening after {STARTUP_TIMEOUT} s:\n{self.log_tail()}")
            # Exited: if someone took the port meanwhile, try another one.
            if "startup_failed" in self.log_tail(5) and attempt < 2:
                self.port = free_port()
                continue
            raise AssertionError(f"broker exited with {self.proc.returncode} at startup:\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: no chance to flush anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait for the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"broker did not exit within {timeout} s of SIGTERM:\n{self.log_tail()}") from None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@pytest.fixture
def broker_process(tmp_path: Path):
    made: list[BrokerProcess] = []

    def make(*extra: str) -> BrokerProcess:
        process = BrokerProcess(tmp_path, *extra)
        made.append(process)
        return process

    yield make
    for process in made:
        process.kill()
    for peer in Peer.made:  # also those of a failed test (threads end at EOF)
        peer.raw.close()
    Peer.made.clear()


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
                raw._pump(timeout)
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


# -- (a) queues: SIGKILL at random moments --------------------------------------

QUEUE_ROUNDS = 24


def test_receipted_queue_messages_survive_sigkill_at_random_moments(broker_process):
    queue_crash_rounds(broker_process(), seeded("queue crash"), QUEUE_ROUNDS)


SMALL_SEGMENTS = """
[store]
segment_bytes = 65536
maintenance_interval_s = 0.05
"""


def test_queue_crashes_while_segments_roll_and_are_compacted(broker_process, tmp_path):
    """The same with tiny segments and maintenance (checkpoints, deleting and
    compacting segments) running all the time, so kills land in the middle of it."""
    config = tmp_path / "gateway.toml"
    config.write_text(SMALL_SEGMENTS)
    queue_crash_rounds(broker_process("--config", str(config)), seeded("queue crash, small segments"), 12)


def queue_crash_rounds(broker: BrokerProcess, rng: random.Random, rounds_wanted: int) -> None:
    """Bounded by its count of rounds and each round's own deadlines, never by
    a budget for all of them: a slow machine runs the same rounds, slower."""
    ledger = Ledger()
    queue = f"/queue/{unique('crash')}"
    producers = [f"p{i}" for i in range(4)]
    seqs = dict.fromkeys(producers, 0)
    started = time.monotonic()
    in_flight_at_kill = []
    rounds = 0
    while rounds < rounds_wanted:
        rounds += 1
        required = ledger.required()
        broker.start()
        ledger.new_session()
        deadline = time.monotonic() + 30
        consumer = consume(broker.port, queue, ledger, random.Random(rng.random()), deadline)
        # Some kills land while the backlog is being redelivered and acked; the
        # others only after everything owed has come back (checked here).
        early = rng.random() < 0.2
        if not early:
            wait_delivered(ledger, required, broker, 20.0, f"round {rounds}")
            ledger.check()
        stop = threading.Event()
        threads = [Producer(name, broker.port, queue, ledger, seqs, rng.choice((1, 8, 32)), stop, deadline)
                   for name in producers]
        for thread in threads:
            thread.start()
        time.sleep(rng.uniform(0.0, 0.3) if early else rng.uniform(0.05, 0.8))
        broker.kill()
        join_all([*threads, consumer])
        in_flight_at_kill.append(sum(len(t.in_flight) for t in threads))
        ledger.check()

    # One last restart, without a kill: everything owed is there, then a clean stop.
    required = ledger.required()
    broker.start()
    ledger.new_session()
    consumer = consume(broker.port, queue, ledger, rng, time.monotonic() + 30, ack_p=0.0)
    wait_delivered(ledger, required, broker, 20.0, "final restart")
    consumer.stop.set()
    join_all([consumer])
    consumer.peer.disconnect()
    assert broker.terminate() == 0
    ledger.check()
    print(f"{rounds} kills in {time.monotonic() - started:.1f} s; {ledger.summary()}; "
          f"SENDs in flight at each kill: {in_flight_at_kill}")
    # The kills were mid-load, and the test did something.
    assert sum(1 for n in in_flight_at_kill if n) >= rounds // 2, f"kills not mid-load: {in_flight_at_kill}"
    assert len(ledger.receipted) >= 20 * rounds, (
        f"only {len(ledger.receipted)} of {len(ledger.sent)} SENDs receipted in {rounds} rounds: do receipts stall?")
    assert ledger.acked and ledger.required(), f"nothing acked or nothing left owed: {ledger.summary()}"


# -- (b) a durable topic subscriber across crashes -----------------------------

TOPIC_ROUNDS = 10

ACTIVEMQ = {"activemq.subscriptionName": "S"}


def test_durable_topic_subscriber_gets_everything_in_order_across_sigkills(broker_process):
    rng = seeded("durable topic crash")
    broker = broker_process()
    ledger = Ledger()
    topic = f"/topic/{unique('crash')}"
    client = {"client-id": unique("durable-app")}
    producers = ["t0", "t1"]
    seqs = dict.fromkeys(producers, 0)
    started = time.monotonic()

    broker.start()
    ledger.new_session()
    first = Peer(broker.port, **client)
    first.request("SUBSCRIBE", {"id": "d", "destination": topic, "ack": "client-individual", **ACTIVEMQ})
    first.disconnect()  # offline from here on
    for round_ in range(1, TOPIC_ROUNDS + 1):
        # Publish while the subscriber is away (or, some rounds, while it is
        # there and acking), then kill the broker mid-load.
        online = rng.random() < 0.4
        deadline = time.monotonic() + 30
        consumer = None
        if online:
            ledger.new_session()
            consumer = consume(broker.port, topic, ledger, random.Random(rng.random()), deadline, connect=client,
                               subscribe={"id": "d", **ACTIVEMQ})
        stop = threading.Event()
        threads = [Producer(name, broker.port, topic, ledger, seqs, rng.choice((1, 16)), stop, deadline)
                   for name in producers]
        for thread in threads:
            thread.start()
        time.sleep(rng.uniform(0.05, 0.6))
        broker.kill()
        join_all([*threads, *([consumer] if consumer else [])])
        ledger.check()
        # Back: the subscriber gets every receipted message it had not acked,
        # in order, acks some of them, and leaves again.
        required = ledger.required()
        broker.start()
        ledger.new_session()
        consumer = consume(broker.port, topic, ledger, random.Random(rng.random()), time.monotonic() + 30,
                           connect=client, subscribe={"id": "d", **ACTIVEMQ}, ack_p=0.5, receipt_p=1.0)
        wait_delivered(ledger, required, broker, 20.0, f"round {round_}")
        consumer.stop.set()
        join_all([consumer])
        drain_receipts(consumer.peer, ledger)
        consumer.peer.disconnect()
        ledger.check()
    assert broker.terminate() == 0
    print(f"{TOPIC_ROUNDS} kills in {time.monotonic() - started:.1f} s; {ledger.summary()}")
    assert len(ledger.receipted) >= 10 * TOPIC_ROUNDS, (
        f"only {len(ledger.receipted)} of {len(ledger.sent)} SENDs receipted: do receipts stall?")


def drain_receipts(peer: Peer, ledger: Ledger) -> None:
    """Wait (bounded) for the receipts of the ACKs a stopped Consumer sent."""
    for frame in peer.request("SEND", {"destination": f"/topic/{unique('barrier')}"}, keep=False):
        if frame.command == "RECEIPT" and frame.headers["receipt-id"].startswith("a:"):
            ledger.note_acked(frame.headers["receipt-id"].removeprefix("a:"))
        elif frame.command == "MESSAGE":
            ledger.delivered(frame.body.decode(), frame.headers.get("redelivered") == "true")


# -- (c) transactions: all or nothing across a kill -------------------------------

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


# -- (d) a clean SIGTERM keeps everything -----------------------------------------


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


# -- (e) removing a durable subscription is durable too -----------------------------


def test_unsubscribe_with_the_subscription_name_removes_it_for_good(broker_process):
    broker = broker_process()
    topic = f"/topic/{unique('gone')}"
    client = {"client-id": unique("app")}
    broker.start()
    for name in ("removed", "kept"):  # "kept" proves the test could see held messages
        peer = Peer(broker.port, **client)
        peer.request("SUBSCRIBE", {"id": name, "destination": topic, "ack": "client-individual",
                                   "activemq.subscriptionName": name})
        peer.disconnect()
    publish(broker.port, topic, [f"before-{i}" for i in range(5)])
    broker.kill()
    broker.start()
    remover = Peer(broker.port, **client)
    remover.request("UNSUBSCRIBE", {"id": "whatever", "activemq.subscriptionName": "removed"})
    remover.disconnect()
    publish(broker.port, topic, [f"after-{i}" for i in range(5)])
    broker.kill()
    broker.start()
    bodies = {}
    for name in ("removed", "kept"):
        peer = Peer(broker.port, **client)
        peer.request("SUBSCRIBE", {"id": name, "destination": topic, "ack": "client-individual",
                                   "activemq.subscriptionName": name})
        publish(broker.port, topic, [f"{name}-marker"])
        bodies[name] = receive_until(peer, f"{name}-marker")
        peer.disconnect()
    # ("kept" was away when the marker for the other one was published.)
    assert bodies["kept"] == [*(f"before-{i}" for i in range(5)), *(f"after-{i}" for i in range(5)),
                              "removed-marker", "kept-marker"]
    # A new subscription of that name: nothing from before it existed...
    assert bodies["removed"] == ["removed-marker"]
    assert broker.terminate() == 0


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


# -- (f) the Artemis and RabbitMQ durable dialects -----------------------------------

DIALECTS = {
    "activemq": ({"client-id": "dialect-app"}, {"activemq.subscriptionName": "prices"}),
    "artemis": ({"client-id": "dialect-app"}, {"durable-subscription-name": "prices"}),
    "rabbitmq": ({}, {"durable": "true", "auto-delete": "false"}),
}


@pytest.mark.parametrize("away", ["disconnect", "abort", "sigkill"])
@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_durable_subscription_dialects_keep_messages_while_away(broker_process, dialect, away):
    connect, durable = DIALECTS[dialect]
    sub_id = unique("prices-")  # RabbitMQ names the subscription by its id
    broker = broker_process()
    topic = f"/topic/{unique('dialect')}"
    broker.start()
    peer = Peer(broker.port, **connect)
    peer.request("SUBSCRIBE", {"id": sub_id, "destination": topic, "ack": "client-individual", **durable})
    publish(broker.port, topic, ["live"])
    assert receive_until(peer, "live") == ["live"]
    if away == "disconnect":
        peer.disconnect()
    else:
        peer.raw.abort()  # a TCP reset, as if the client had crashed
        if away == "sigkill":
            broker.kill()
            broker.start()
    publish(broker.port, topic, [f"away-{i}" for i in range(5)])
    if away == "sigkill":
        broker.kill()
        broker.start()
    # An aborted connection is noticed by the broker soon, not at once.
    back = wait_for(lambda: resubscribe(broker.port, connect, sub_id, topic, durable), timeout=5, interval=0.05,
                    what="the durable subscription to be free again")
    publish(broker.port, topic, ["back"])
    assert receive_until(back, "back") == [f"away-{i}" for i in range(5)] + ["back"]
    back.request("UNSUBSCRIBE", {"id": sub_id, **durable})
    back.disconnect()
    assert broker.terminate() == 0


def resubscribe(port: int, connect: dict[str, str], sub_id: str, topic: str, durable: dict[str, str]) -> Peer | None:
    """A new connection with the durable subscription, or None while the
    broker still counts the old (aborted) connection's as active."""
    peer = Peer(port, **connect)
    try:
        peer.request("SUBSCRIBE", {"id": sub_id, "destination": topic, "ack": "client-individual", **durable})
    except AssertionError as exc:
        peer.close()
        if "already active" in str(exc):
            return None
        raise
    return peer
