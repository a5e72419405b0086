"""The load the persistence benchmarks put on a broker, in child processes:
producers keeping receipted persistent SENDs in flight, a consumer that ACKs
every message, the pipelined fill, and the first message after a restart."""

from __future__ import annotations

import multiprocessing
import os
import re
import selectors
import socket
import time

from benchmarks.load import stompwire
from benchmarks.harness.broker import Broker, ScenarioFailed

BODY_SIZE = stompwire.BODY_SIZE
PRODUCERS = 8
WINDOW = 32
FILL_RECEIPT_EVERY = 1000
FILL_OUTSTANDING = 8

RECEIPT_RE = re.compile(rb"RECEIPT\nreceipt-id:(\d+)\n")
ACK_RE = re.compile(rb"\nack:([^\n]+)\n")
ERROR_MARK = b"ERROR\n"


def _connect(port: int, deadline: float) -> socket.socket:
    sock, reader = stompwire.connect(port, deadline)
    if reader.rest:
        raise ScenarioFailed(f"unexpected bytes after CONNECTED: {reader.rest[:80]!r}")
    return sock


def _percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def producers_main(port: int, destination: str, seconds: float, deadline: float, out) -> None:
    """PRODUCERS sockets, WINDOW receipted persistent SENDs in flight on each."""
    result: dict = {"receipted": 0, "sent": 0, "error": None}
    try:
        sel = selectors.DefaultSelector()
        head = (f"SEND\ndestination:{destination}\npersistent:true\ncontent-length:{BODY_SIZE}\nreceipt:").encode()
        sent_at: dict[int, int] = {}
        latencies: list[float] = []
        seq = 0
        socks = []
        for i in range(PRODUCERS):
            sock = _connect(port, deadline)
            sock.setblocking(False)
            socks.append(sock)
            sel.register(sock, selectors.EVENT_READ, {"rest": b"", "in_flight": 0})
        out.send(("READY", {}))
        if out.recv() != "GO":
            return

        def send_one(sock: socket.socket, state: dict) -> None:
            nonlocal seq
            frame = head + b"%d\n\n" % seq + stompwire.body(seq) + b"\x00"
            sent_at[seq] = time.monotonic_ns()
            seq += 1
            state["in_flight"] += 1
            sock.setblocking(True)  # small frames: sendall on a nearly empty socket buffer
            sock.sendall(frame)
            sock.setblocking(False)

        t_start = time.monotonic()
        result["t_first_send_ns"] = time.monotonic_ns()
        for key in sel.get_map().values():
            for _ in range(WINDOW):
                send_one(key.fileobj, key.data)
        stop_at = t_start + seconds
        sending = True
        while True:
            now = time.monotonic()
            if sending and now >= stop_at:
                sending = False
                result["t_stop_ns"] = time.monotonic_ns()
            in_flight = sum(k.data["in_flight"] for k in sel.get_map().values())
            if not sending and in_flight == 0:
                break
            if now > deadline or (not sending and now > stop_at + 30):
                result["error"] = f"{in_flight} receipts still missing when the time ran out"
                break
            for key, _ in sel.select(0.2):
                sock, state = key.fileobj, key.data
                data = sock.recv(262144)
                if not data:
                    raise ScenarioFailed("broker closed a producer connection")
                buf = state["rest"] + data
                cut = buf.rfind(b"\x00") + 1
                state["rest"] = buf[cut:]
                chunk = buf[:cut]
                if ERROR_MARK in chunk:
                    raise ScenarioFailed("broker sent ERROR: " + chunk[chunk.find(ERROR_MARK):][:300].decode("utf-8", "replace"))
                t = time.monotonic_ns()
                for m in RECEIPT_RE.finditer(chunk):
                    sent = sent_at.pop(int(m.group(1)))
                    latencies.append((t - sent) / 1e6)
                    state["in_flight"] -= 1
                    result["receipted"] += 1
                    if sending:
                        send_one(sock, state)
        result["t_last_receipt_ns"] = time.monotonic_ns()
        result["sent"] = seq
        result["latency_ms"] = {"p50_ms": _percentile(latencies, 50), "p99_ms": _percentile(latencies, 99),
                                "max_ms": max(latencies) if latencies else None, "count": len(latencies)}
        for sock in socks:
            sock.close()
    except Exception as exc:  # reported, not raised: the parent decides
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["cpu_s"] = sum(os.times()[:2])
    out.send(("RESULT", result))


def consumer_main(port: int, destination: str, deadline: float, idle_s: float, out, *, durable: bool = False) -> None:
    """One client-individual subscriber that ACKs every message (a durable
    topic subscriber in RabbitMQ's dialect with ``durable``)."""
    result: dict = {"received": 0, "error": None}
    try:
        sock = _connect(port, deadline)
        extra = "durable:true\nauto-delete:false\n" if durable else ""
        sock.sendall(f"SUBSCRIBE\nid:1\ndestination:{destination}\n{extra}ack:client-individual\nreceipt:sub\n\n\x00".encode())
        reader = stompwire.ControlReader(sock)
        reader.expect("RECEIPT", deadline)
        rest = reader.rest
        out.send(("READY", {}))
        target = None  # the producers' receipted count, once they are done
        last_data = time.monotonic()
        received = 0
        while True:
            if out.poll():
                target = out.recv()
            if target is not None and received >= target:
                break
            now = time.monotonic()
            if now > deadline:
                result["error"] = "deadline"
                break
            if target is not None and now - last_data > idle_s:
                result["error"] = f"nothing for {idle_s} s with {target - received} receipted messages still to come"
                break
            sock.settimeout(0.1)
            try:
                data = sock.recv(262144)
            except TimeoutError:
                continue
            if not data:
                raise ScenarioFailed("broker closed the consumer connection")
            last_data = time.monotonic()
            buf = rest + data
            cut = buf.rfind(b"\x00") + 1
            rest = buf[cut:]
            chunk = buf[:cut]
            if ERROR_MARK in chunk:
                raise ScenarioFailed("broker sent ERROR: " + chunk[chunk.find(ERROR_MARK):][:300].decode("utf-8", "replace"))
            acks = ACK_RE.findall(chunk)
            if acks:
                if not received:
                    result["t_first_ns"] = time.monotonic_ns()
                received += len(acks)
                result["t_last_ns"] = time.monotonic_ns()
                sock.settimeout(30)
                sock.sendall(b"".join(b"ACK\nid:" + a + b"\n\n\x00" for a in acks))
        result["received"] = received
        sock.close()
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["cpu_s"] = sum(os.times()[:2])
    out.send(("RESULT", result))


def spawn(target, *args) -> tuple[multiprocessing.Process, object]:
    """Fork a child running ``target(*args, pipe)``; return it and this side of the pipe."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(*args, child), daemon=True)
    proc.start()
    return proc, parent


def expect(conn, kind: str, deadline: float, broker: Broker, name: str) -> dict:
    while time.monotonic() < deadline:
        if conn.poll(0.25):
            what, payload = conn.recv()
            if what == kind:
                return payload
            if what == "RESULT":
                raise ScenarioFailed(f"{name} failed before it was ready: {payload.get('error')}")
        if not broker.alive:
            raise ScenarioFailed(f"broker exited with code {broker.proc.returncode}: {broker.log_tail()}")
    raise ScenarioFailed(f"timed out waiting for {kind} from {name}")


def fill(port: int, dest: str, n: int, deadline: float) -> dict:
    """N persistent SENDs, pipelined, a receipt every FILL_RECEIPT_EVERY."""
    sock = _connect(port, deadline)
    head = f"SEND\ndestination:{dest}\npersistent:true\ncontent-length:{BODY_SIZE}\n".encode()
    rest = b""
    outstanding: list[int] = []
    done = 0
    t0 = time.monotonic()
    batch: list[bytes] = []

    def read(block: bool) -> None:
        nonlocal rest, done
        sock.settimeout(max(0.01, deadline - time.monotonic()) if block else 0.0)
        try:
            data = sock.recv(65536)
        except (BlockingIOError, TimeoutError):
            if block:
                raise ScenarioFailed(f"fill: timed out with {done:,} of {n:,} receipted") from None
            return
        if not data:
            raise ScenarioFailed(f"fill: broker closed the connection after {done:,} receipted")
        buf = rest + data
        cut = buf.rfind(b"\x00") + 1
        rest = buf[cut:]
        if ERROR_MARK in buf[:cut]:
            raise ScenarioFailed("fill: broker sent ERROR: " + buf[buf.find(ERROR_MARK):][:300].decode("utf-8", "replace"))
        for m in RECEIPT_RE.finditer(buf[:cut]):
            outstanding.remove(int(m.group(1)))
            done = int(m.group(1)) + 1

    for seq in range(n):
        last = seq == n - 1 or (seq + 1) % FILL_RECEIPT_EVERY == 0
        if last:
            batch.append(head + b"receipt:%d\n\n" % seq + stompwire.body(seq) + b"\x00")
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            sock.sendall(b"".join(batch))
            batch.clear()
            outstanding.append(seq)
            while len(outstanding) >= FILL_OUTSTANDING:
                read(True)
            read(False)
        else:
            batch.append(head + b"\n" + stompwire.body(seq) + b"\x00")
        if time.monotonic() > deadline:
            raise ScenarioFailed(f"fill: timed out after {seq:,} of {n:,} sent")
    while outstanding:
        read(True)
    elapsed = time.monotonic() - t0
    sock.close()
    return {"fill_s": elapsed, "fill_msgs_per_s": n / elapsed}


def first_message(port: int, dest: str, t_exec: float, deadline: float) -> tuple[float, int]:
    """Subscribe as soon as possible; seconds from exec to the first MESSAGE, its seq."""
    sock = _connect(port, deadline)
    sock.sendall(f"SUBSCRIBE\nid:1\ndestination:{dest}\nack:client-individual\nactivemq.prefetchSize:1\n\n\x00".encode())
    buf = b""
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            raise ScenarioFailed("no message after the restart in time") from None
        if not data:
            raise ScenarioFailed("broker closed the consumer connection after the restart")
        buf += data
        if ERROR_MARK in buf:
            raise ScenarioFailed("broker sent ERROR: " + buf[buf.find(ERROR_MARK):][:300].decode("utf-8", "replace"))
        m = stompwire.SEQ_RE.search(buf)
        if m and b"\x00" in buf[m.end():]:
            t = time.monotonic() - t_exec
            sock.close()
            return t, int(m.group(1))
