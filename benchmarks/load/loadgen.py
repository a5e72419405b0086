"""Load-generator worker processes, started by ``run.py`` (stdlib only).

Usage: ``python load/loadgen.py '<json parameters>'``.  A worker connects, prints
``READY {...}`` on stdout, and then:

* a producer waits for ``GO`` on stdin and sends;
* a consumer (one or more subscriber sockets) reads until every socket got the
  expected count, or nothing arrived for ``idle_s``, or ``STOP`` on stdin, or
  its deadline.

It always ends by printing one ``RESULT {...}`` line.  Every wait is bounded by
``deadline`` (a ``time.monotonic()`` value; CLOCK_MONOTONIC is system-wide on
Linux, so the runner and the workers share it, as they share the nanosecond
timestamps measured with ``time.monotonic_ns()``).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import selectors
import signal
import socket
import sys
import time
from array import array
from pathlib import Path

# Run as a script (sys.path[0] is benchmarks/load/): the checkout, for benchmarks.load.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.load import stompwire as sw  # noqa: E402

RECV_BYTES = 1 << 20  # flood consumers: as much per wake-up as the kernel has
RECV_BYTES_TIMED = 1 << 16  # latency consumer: a few frames per millisecond


def _die_with_parent(parent: int) -> None:
    """If the runner dies (even by SIGKILL), the kernel kills us too."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if parent and os.getppid() != parent:
        os._exit(3)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _emit(kind: str, payload: dict) -> None:
    sys.stdout.write(f"{kind} {json.dumps(payload)}\n")
    sys.stdout.flush()


def _read_command(deadline: float) -> str | None:
    """The next line on stdin, or None at the deadline; EOF reads as STOP."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return None
    ready, _, _ = select.select([sys.stdin], [], [], remaining)
    if not ready:
        return None
    line = sys.stdin.readline()
    return line.strip() or "STOP"


# -- producer -----------------------------------------------------------------


class Stopped(Exception):
    """The runner said STOP (its consumers are done and gave up waiting)."""


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    """sendall that gives up at the deadline or on STOP from the runner."""
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view)
        except BlockingIOError:
            sent = 0
        view = view[sent:]
        if not view:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        readable, _, _ = select.select([sys.stdin], [sock], [], remaining)
        if readable:
            raise Stopped


def produce(p: dict) -> dict:
    deadline = p["deadline"]
    result: dict = {"role": "producer", "sent": 0, "ok": False}
    sock, reader = sw.connect(p["port"], min(deadline, time.monotonic() + 15))
    head = sw.send_frame(p["destination"])
    n = p["messages"]
    paced = p.get("rate") is not None
    batches: list[bytes] = []
    if not paced:
        size = p["batch"]
        for start in range(0, n, size):
            batches.append(b"".join([head + sw.body(i) + b"\x00" for i in range(start, min(n, start + size))]))
    _emit("READY", {"pid": os.getpid()})
    command = _read_command(deadline)
    if command != "GO":
        result["error"] = f"never told to start ({command or 'deadline'})"
        return result
    cpu0 = _cpu()
    sock.setblocking(False)
    t_first = t_last = time.monotonic_ns()
    try:
        if paced:
            t_first, t_last = _paced(sock, head, n, p["rate"], deadline, result)
        else:
            for batch in batches:
                _send_all(sock, batch, deadline)
                result["sent"] = min(n, result["sent"] + size)
            t_last = time.monotonic_ns()
        result["t_first_send"] = t_first
        result["t_last_send"] = t_last
        # All SENDs precede this DISCONNECT on the wire, so its RECEIPT means
        # the broker has taken (routed) every one of them.
        _send_all(sock, sw.disconnect_frame("bench-done"), deadline)
        reader.expect("RECEIPT", deadline, header=("receipt-id", "bench-done"), stop=sys.stdin)
        result["t_accepted"] = time.monotonic_ns()
        result["ok"] = True
    except TimeoutError:
        result["error"] = f"send stalled: the broker stopped reading (deadline reached after {result['sent']:,} of {n:,} messages)"
    except Stopped:
        result["error"] = (f"send stalled: the broker was not reading when the consumers gave up "
                           f"({result['sent']:,} of {n:,} messages written)")
    except (OSError, sw.StompError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc} (after {result['sent']:,} of {n:,} messages)"
        result["broker_said"] = _drain_error(sock, reader)
    finally:
        result["cpu_s"] = _cpu() - cpu0
        result.setdefault("t_first_send", t_first)
        result["wall_s"] = (time.monotonic_ns() - t_first) / 1e9
        sock.close()
    return result


def _paced(sock: socket.socket, head: bytes, n: int, rate: int, deadline: float, result: dict) -> tuple[int, int]:
    """Send ``rate`` msgs/s in 1 ms ticks, each body carrying its send time."""
    tick = 1_000_000
    per_tick = rate / 1000
    start = time.monotonic_ns()
    t_first = t_last = 0
    sent = 0
    late_ticks = 0
    max_lag_ns = 0
    sock.setblocking(False)
    while sent < n:
        now = time.monotonic_ns()
        k = (now - start) // tick
        due = min(n, (k + 1) * rate // 1000)
        if due > sent:
            if due - sent > per_tick + 1:
                late_ticks += 1
                # How far behind its schedule the oldest message of this burst goes out.
                max_lag_ns = max(max_lag_ns, now - (start + (sent * 1000 // rate) * tick))
            ts = time.monotonic_ns()
            _send_all(sock, b"".join([head + sw.timed_body(i, ts) + b"\x00" for i in range(sent, due)]), deadline)
            if not t_first:
                t_first = ts
            t_last = ts
            sent = due
            result["sent"] = sent
        if time.monotonic() > deadline:
            raise TimeoutError
        delay = start + (k + 1) * tick - time.monotonic_ns()
        if delay > 0:
            time.sleep(delay / 1e9)
    result["late_ticks"] = late_ticks
    result["max_schedule_lag_ms"] = max_lag_ns / 1e6
    result["send_rate"] = sent / ((t_last - start) / 1e9 + 0.001)
    return t_first, t_last


def _drain_error(sock: socket.socket, reader: sw.ControlReader) -> str | None:
    """After a failed send: did the broker explain itself with an ERROR frame?"""
    data = reader.rest
    try:
        sock.settimeout(1.0)
        while len(data) < 1 << 20:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    frames, _ = sw.parse_frames(data)
    errors = [sw.describe(f) for f in frames if f[0] == "ERROR"]
    return "; ".join(errors) or None


# -- consumer -----------------------------------------------------------------


class Stream:
    """One subscriber socket's tally."""

    __slots__ = ("index", "sock", "rest", "count", "expected_seq", "gaps", "out_of_order",
                 "first_ns", "last_ns", "latencies", "error", "eof", "timed", "gap_ranges")

    def __init__(self, index: int, sock: socket.socket, rest: bytes, timed: bool) -> None:
        self.index = index
        self.sock = sock
        self.rest = rest
        self.count = 0
        self.expected_seq = 0
        self.gaps = 0  # sequence numbers skipped (lost or not yet seen)
        self.out_of_order = 0  # numbers seen below the next expected one (duplicate or reordered)
        self.gap_ranges: list[tuple[int, int]] = []  # the first few missing ranges, inclusive
        self.first_ns = 0
        self.last_ns = 0
        self.latencies = array("q") if timed else None
        self.error: str | None = None
        self.eof = False
        self.timed = timed

    def feed(self, data: bytes, now: int) -> None:
        buf = self.rest + data if self.rest else data
        end = buf.rfind(b"\x00") + 1
        if not end:
            self.rest = buf
            return
        self.rest = buf[end:]
        frames = buf.count(b"\x00", 0, end)
        if self.timed:
            matches = sw.SEQ_TIME_RE.findall(buf, 0, end)
            seqs = [int(s) for s, _ in matches]
            self.latencies.extend([now - int(t) for _, t in matches])
        else:
            seqs = list(map(int, sw.SEQ_RE.findall(buf, 0, end)))
        if len(seqs) != frames:
            others = [sw.describe(f) for f in sw.parse_frames(buf[:end])[0] if f[0] != "MESSAGE"]
            self.error = "; ".join(others) or f"{frames - len(seqs)} frames without a benchmark body"
        if not seqs:
            return
        if not self.first_ns:
            self.first_ns = now
        self.last_ns = now
        self.count += len(seqs)
        e = self.expected_seq
        if seqs[0] == e and seqs == list(range(e, e + len(seqs))):
            self.expected_seq = e + len(seqs)
            return
        for s in seqs:
            if s == e:
                e += 1
            elif s > e:
                self.gaps += s - e
                if len(self.gap_ranges) < 5:
                    self.gap_ranges.append((e, s - 1))
                e = s + 1
            else:
                self.out_of_order += 1
        self.expected_seq = e

    def report(self) -> dict:
        out = {
            "count": self.count,
            "first_ns": self.first_ns,
            "last_ns": self.last_ns,
            "gaps": self.gaps,
            "out_of_order": self.out_of_order,
            "eof": self.eof,
            "error": self.error,
            "gap_ranges": self.gap_ranges,
            "next_seq": self.expected_seq,
        }
        return out


def _percentiles(values: array) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    n = len(ordered)

    def pick(q: float) -> float:
        index = min(n - 1, max(0, -(-int(q * n * 1000) // 1000) - 1))  # nearest rank
        return ordered[index] / 1e6

    return {
        "count": n,
        "min_ms": ordered[0] / 1e6,
        "mean_ms": sum(ordered) / n / 1e6,
        "p50_ms": pick(0.50),
        "p90_ms": pick(0.90),
        "p99_ms": pick(0.99),
        "p999_ms": pick(0.999),
        "max_ms": ordered[-1] / 1e6,
    }


def consume(p: dict) -> dict:
    deadline = p["deadline"]
    n = p["messages"]
    timed = p.get("timed", False)
    setup_deadline = min(deadline, time.monotonic() + 20)
    streams = []
    for i in range(p["sockets"]):
        sock, reader = sw.connect(p["port"], setup_deadline)
        receipt = f"sub-{p.get('name', 'c')}-{i}"
        sock.sendall(sw.subscribe_frame(p["destination"], "0", receipt))
        reader.expect("RECEIPT", setup_deadline, header=("receipt-id", receipt))
        sock.settimeout(None)
        streams.append(Stream(i, sock, reader.rest, timed))
    _emit("READY", {"pid": os.getpid()})
    cpu0 = _cpu()
    idle_ns = int(p["idle_s"] * 1e9)
    first_wait_ns = int(p.get("first_wait_s", 30) * 1e9)
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin, selectors.EVENT_READ, None)
    for st in streams:
        if st.rest:
            st.feed(b"", time.monotonic_ns())
        sel.register(st.sock, selectors.EVENT_READ, st)
    recv_bytes = RECV_BYTES_TIMED if timed else RECV_BYTES
    active = len(streams)
    started = last_data = time.monotonic_ns()
    stop_reason = "all messages received"
    deadline_ns = int(deadline * 1e9)
    while active:
        now = time.monotonic_ns()
        quiet_until = last_data + (idle_ns if last_data != started else first_wait_ns)
        limit = min(deadline_ns, quiet_until)
        if now >= limit:
            if now >= deadline_ns:
                stop_reason = "deadline reached"
            elif last_data == started:
                stop_reason = f"no message within {first_wait_ns / 1e9:.0f} s"
            else:
                stop_reason = f"nothing received for {idle_ns / 1e9:.0f} s"
            break
        events = sel.select((limit - now) / 1e9)
        for key, _ in events:
            st = key.data
            if st is None:
                command = sys.stdin.readline().strip() or "STOP"
                if command == "STOP":
                    stop_reason = "stopped by the runner"
                    active = 0
                    break
                continue
            data = st.sock.recv(recv_bytes)
            now = time.monotonic_ns()
            if not data:
                st.eof = True
                st.error = st.error or "broker closed the connection"
                sel.unregister(st.sock)
                active -= 1
                continue
            last_data = now
            st.feed(data, now)
            if st.count >= n or st.error:
                sel.unregister(st.sock)
                active -= 1
    cpu = _cpu() - cpu0
    for st in streams:
        try:
            st.sock.setblocking(False)
            st.sock.send(sw.disconnect_frame())
        except OSError:
            pass
        st.sock.close()
    result = {
        "role": "consumer",
        "stop_reason": stop_reason,
        "cpu_s": cpu,
        "streams": [st.report() for st in streams],
    }
    if timed:
        merged = array("q")
        for st in streams:
            merged.extend(st.latencies)
        result["latency"] = _percentiles(merged)
    return result


def main() -> int:
    params = json.loads(sys.argv[1])
    _die_with_parent(params.get("parent", 0))
    role = params["role"]
    try:
        result = produce(params) if role == "producer" else consume(params)
    except Exception as exc:  # report, never hang
        result = {"role": role, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
    _emit("RESULT", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
