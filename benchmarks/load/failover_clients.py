"""The failover benchmark's clients: producers and a consumer on raw STOMP
sockets, one thread each, that reconnect through the node list (stdlib only).

A producer sends receipted persistent SENDs with at most ``window`` receipts
outstanding; after a reconnect it sends the unreceipted ones again (at least
once, as a real client does) as new attempts.  A body names its message:
``P<producer>-<seq>-<attempt>``, so each attempt is a message of its own to
the broker and the tally can tell a producer's resend from a redelivery.

The consumer subscribes ack:client-individual and ACKs each message with a
receipt.  Its tally: every delivery of every message, which messages had an
ACK receipted (a later delivery of one of those is the must-be-zero
"acked then redelivered"), and other redeliveries.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections import Counter

from benchmarks.harness.broker import HOST

QUEUE = "/queue/failover"
BODY_SIZE = 128
BODY_RE = re.compile(rb"\n\nP(\d+)-(\d+)-(\d+);")
ACK_RE = re.compile(rb"\nack:([^\n]*)")
RECEIPT_RE = re.compile(rb"\nreceipt-id:[ra](\d+)")
CONNECT_WAIT_S = 3.0  # per node: CONNECT to CONNECTED
IO_TIMEOUT_S = 0.2  # a recv's wait, so that a stop is seen soon
# As a real client does (stomp.py's heartbeats): the broker is asked to send a
# heart-beat every second, and a link that hears nothing for 3 s is given up
# (a primary frozen by SIGSTOP keeps its sockets open but says nothing).
CONNECT = b"CONNECT\naccept-version:1.2\nhost:localhost\nheart-beat:0,1000\n\n\x00"
SILENCE_S = 3.0


def body(producer: int, seq: int, attempt: int) -> bytes:
    head = b"P%d-%d-%d;" % (producer, seq, attempt)
    return head + b"x" * (BODY_SIZE - len(head))


class Link:
    """One STOMP connection: frames in, bytes out; any failure is an OSError."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.create_connection((HOST, port), timeout=1.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rest = b""
        self.connected_at = self.heard_at = time.monotonic()
        self.first_receipt_at: float | None = None

    def handshake(self) -> None:
        self.sock.sendall(CONNECT)
        deadline = time.monotonic() + CONNECT_WAIT_S
        while time.monotonic() < deadline:
            for frame in self.read():
                if frame.startswith(b"CONNECTED"):
                    self.connected_at = time.monotonic()
                    return
                raise OSError(f"{frame[:40]!r} instead of CONNECTED")
        raise OSError("no CONNECTED in time")

    def read(self) -> list[bytes]:
        """The frames that arrive within IO_TIMEOUT_S (maybe none), each
        without its NUL.  No body here holds a NUL (ours are text, as are the
        broker's ERROR bodies), so a NUL ends a frame: no parsing on the hot path."""
        self.sock.settimeout(IO_TIMEOUT_S)
        try:
            data = self.sock.recv(1 << 18)
        except TimeoutError:
            if time.monotonic() - self.heard_at > SILENCE_S:
                raise OSError(f"no heart-beat from the broker for {SILENCE_S:g} s") from None
            return []
        if not data:
            raise OSError("connection closed by the broker")
        self.heard_at = time.monotonic()
        frames = (self.rest + data).split(b"\x00")
        self.rest = frames.pop()
        frames = [f.lstrip(b"\r\n") for f in frames]
        for frame in frames:
            if frame.startswith(b"ERROR"):
                message = re.search(rb"\nmessage:([^\n]*)", frame)
                raise OSError(f"ERROR {message[1].decode(errors='replace') if message else frame[:200]!r}")
        return frames

    def send(self, data: bytes) -> None:
        self.sock.settimeout(10.0)
        self.sock.sendall(data)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def connect_any(ports: list[int], stop: threading.Event, deadline: float) -> Link | None:
    """Try each node's STOMP port in turn until one completes CONNECT (only the
    primary listens); None on stop or at the deadline."""
    while not stop.is_set() and time.monotonic() < deadline:
        for port in ports:
            try:
                link = Link(port)
            except OSError:
                continue
            try:
                link.handshake()
                return link
            except OSError:
                link.close()
        time.sleep(0.05)
    return None


class Client(threading.Thread):
    """What producers and the consumer share: the node list, a stop, the links made."""

    def __init__(self, name: str, ports: list[int], deadline: float) -> None:
        super().__init__(name=name, daemon=True)
        self.ports = ports
        self.deadline = deadline
        self.stop = threading.Event()
        self.links: list[Link] = []
        self.errors: Counter[str] = Counter()
        self.lock = threading.Lock()

    def retarget(self, ports: list[int]) -> None:
        self.ports = ports

    def connect(self) -> Link | None:
        link = connect_any(self.ports, self.stop, self.deadline)
        if link is not None:
            with self.lock:
                self.links.append(link)
        return link

    def failed(self, exc: Exception) -> None:
        # Counted by reason: what names the connection's own receipts is cut off.
        self.errors[str(exc).split(" b'")[0].split(" (receipts ")[0][:120]] += 1


class Producer(Client):
    def __init__(self, index: int, ports: list[int], deadline: float, window: int) -> None:
        super().__init__(f"producer-{index}", ports, deadline)
        self.index = index
        self.window = window
        self.head = f"SEND\ndestination:{QUEUE}\npersistent:true\ncontent-length:{BODY_SIZE}\n".encode()
        self.next_seq = 0
        self.attempts: dict[int, int] = {}  # seq -> attempts so far
        self.outstanding: dict[int, int] = {}  # receipt number -> seq, on the current link
        self.receipts = 0
        self.unreceipted: list[int] = []  # seqs to send again
        self.receipted: set[tuple[int, int, int]] = set()  # (producer, seq, attempt)
        self.receipt_times: list[float] = []
        self.draining = threading.Event()  # send nothing new; wait for what is outstanding

    def frame(self, seq: int) -> bytes:
        attempt = self.attempts.get(seq, 0) + 1
        self.attempts[seq] = attempt
        self.receipts += 1
        self.outstanding[self.receipts] = seq
        return self.head + b"receipt:r%d\n\n" % self.receipts + body(self.index, seq, attempt) + b"\x00"

    def fill(self, link: Link) -> None:
        out = []
        while len(self.outstanding) < self.window and (self.unreceipted or not self.draining.is_set()):
            if self.unreceipted:
                seq = self.unreceipted.pop(0)
            else:
                seq, self.next_seq = self.next_seq, self.next_seq + 1
            out.append(self.frame(seq))
        if out:
            link.send(b"".join(out))

    def run(self) -> None:
        while not self.stop.is_set():
            if self.draining.is_set() and not self.outstanding and not self.unreceipted:
                return
            link = self.connect()
            if link is None:
                return
            try:
                while not self.stop.is_set():
                    self.fill(link)
                    if self.draining.is_set() and not self.outstanding:
                        return
                    for frame in link.read():
                        match = RECEIPT_RE.search(frame) if frame.startswith(b"RECEIPT") else None
                        seq = self.outstanding.pop(int(match[1]), None) if match else None
                        if seq is not None:
                            now = time.monotonic()
                            if link.first_receipt_at is None:
                                link.first_receipt_at = now
                            self.receipted.add((self.index, seq, self.attempts[seq]))
                            self.receipt_times.append(now)
            except OSError as exc:
                self.failed(exc)
            finally:
                link.close()
                # Unknown fate: sent again on the next link, as a new attempt.
                self.unreceipted[:0] = sorted(self.outstanding.values())
                self.outstanding.clear()


class Consumer(Client):
    def __init__(self, ports: list[int], deadline: float) -> None:
        super().__init__("consumer", ports, deadline)
        self.deliveries: Counter[tuple[int, int, int]] = Counter()
        self.acked: dict[tuple[int, int, int], tuple[float, int]] = {}  # ACK receipted: when, from which port
        # (message, when its ACK's receipt came and from which port, when and where delivered again)
        self.acked_then_redelivered: list[tuple[tuple[int, int, int], tuple[float, int], tuple[float, int]]] = []
        self.redelivered = 0  # deliveries again of a message whose ACK was not receipted
        self.last_delivery = time.monotonic()
        self.acks = 0

    def delivered(self, key: tuple[int, int, int], port: int) -> None:
        self.deliveries[key] += 1
        self.last_delivery = time.monotonic()
        if key in self.acked:
            self.acked_then_redelivered.append((key, self.acked[key], (self.last_delivery, port)))
        elif self.deliveries[key] > 1:
            self.redelivered += 1

    def run(self) -> None:
        while not self.stop.is_set():
            link = self.connect()
            if link is None:
                return
            pending: dict[int, tuple[int, int, int]] = {}  # ACK receipt number -> message
            try:
                link.send(f"SUBSCRIBE\nid:s\ndestination:{QUEUE}\nack:client-individual\n\n\x00".encode())
                while not self.stop.is_set():
                    acks = []
                    for frame in link.read():
                        if frame.startswith(b"MESSAGE"):
                            match, ack = BODY_RE.search(frame), ACK_RE.search(frame)
                            if match is None or ack is None:
                                self.errors[f"a message not of this benchmark: {frame[:80]!r}"] += 1
                                continue
                            key = (int(match[1]), int(match[2]), int(match[3]))
                            self.delivered(key, link.port)
                            self.acks += 1
                            pending[self.acks] = key
                            acks.append(b"ACK\nid:%s\nreceipt:a%d\n\n\x00" % (ack[1], self.acks))
                        elif frame.startswith(b"RECEIPT"):
                            receipt = RECEIPT_RE.search(frame)
                            key = pending.pop(int(receipt[1]), None) if receipt else None
                            if key is not None:
                                self.acked[key] = (time.monotonic(), link.port)
                    if acks:
                        link.send(b"".join(acks))
            except OSError as exc:
                self.failed(exc)
            finally:
                link.close()


def first_receipt_after(producers: list[Producer], moment: float) -> float | None:
    """When the first receipt came on a link made after ``moment`` (the new primary's)."""
    times = []
    for producer in producers:
        with producer.lock:
            links = list(producer.links)
        times += [link.first_receipt_at for link in links
                  if link.connected_at > moment and link.first_receipt_at is not None]
    return min(times, default=None)


def receipted_between(producers: list[Producer], start: float, end: float) -> int:
    return sum(1 for p in producers for t in list(p.receipt_times) if start <= t < end)
