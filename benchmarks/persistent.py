"""Persistence benchmarks against a real broker process (stdlib only).

    .venv/bin/python benchmarks/persistent.py [--scenario persistent|restart|all]
        [--messages N] [--seconds S] [--json FILE] [--broker-cmd CMD] [--timeout S]

(also reachable as ``benchmarks/run.py --scenario persistent|restart``)

persistent  8 producer sockets -> /queue/bench.p -> 1 consumer.  Each producer
            keeps 32 persistent SENDs (128-byte bodies) in flight, each with a
            receipt: a new SEND goes out whenever a receipt comes back (sliding
            window), for S seconds (default 10).  The consumer uses
            ack:client-individual and ACKs every message (no receipts on ACK).
            Reports receipted msgs/s (producer side) and acked msgs/s
            (consumer side), receipt latency p50/p99 (SEND written -> RECEIPT
            read), fsyncs per second (from the broker's periodic INFO
            ``store_stats`` log line, field ``fsyncs``; n/a if it logs none),
            and the broker's CPU and RSS.  Default store settings (sync policy
            "always": a receipt waits for fdatasync).
restart     fill /queue/bench.r with N persistent 128-byte messages (default
            1,000,000; pipelined, a receipt on every 1000th SEND, at most 8 of
            those outstanding), then SIGKILL the broker, restart it on the same
            data folder, and measure the time from exec to the port accepting
            and to a consumer getting the first message, and the RSS then;
            then SIGTERM it (shutdown time), restart again and measure the same.
            The first message must be message 0 and, if the broker logs
            ``store_recovered`` with ``messages``, that must be N.

Every wait is bounded by --timeout (default 300 s per scenario); every process
started is stopped whatever happens (the broker also dies with this runner).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import re
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402  (the Broker process wrapper, /proc readers, formatting)
import stompwire  # noqa: E402

HOST = "127.0.0.1"
BODY_SIZE = stompwire.BODY_SIZE
PRODUCERS = 8
WINDOW = 32
FILL_RECEIPT_EVERY = 1000
FILL_OUTSTANDING = 8
SCENARIOS = ("persistent", "restart")

RECEIPT_RE = re.compile(rb"RECEIPT\nreceipt-id:(\d+)\n")
ACK_RE = re.compile(rb"\nack:([^\n]+)\n")
ERROR_MARK = b"ERROR\n"


class Failed(Exception):
    pass


# -- broker ------------------------------------------------------------------


class Broker(bench.Broker):
    """run.Broker that can be restarted on the same data folder and killed,
    and whose log (JSON lines at INFO) is kept across lifetimes."""

    def start(self, deadline: float, *, keep_port: bool = False) -> float:
        """Start; return seconds from exec to the port accepting connections."""
        if not keep_port or not self.port:
            self.port = bench._free_port()
        cmd = shlex.split(self.template.format(port=self.port, data_dir=shlex.quote(str(self.data_dir))))
        self.command = cmd
        self.exit_code = None
        self.shutdown_s = None
        with open(self.log_path, "ab") as log:
            log.write(b'{"event": "bench_broker_exec"}\n')
            log.flush()
            t0 = time.monotonic()
            self.proc = subprocess.Popen(
                [sys.executable, "-c", bench._EXEC_SHIM, str(os.getpid()), *cmd],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=bench.ROOT,
            )
        while True:
            if self.proc.poll() is not None:
                raise Failed(f"broker exited with code {self.proc.returncode} at startup: {self.log_tail()}")
            try:
                with socket.create_connection((HOST, self.port), timeout=0.5):
                    return time.monotonic() - t0
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise Failed(f"broker did not accept connections on {HOST}:{self.port} in time")
            time.sleep(0.002)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        if self.proc is not None:
            self.exit_code = self.proc.returncode

    def records(self) -> list[dict]:
        """The broker's JSON log lines (others ignored), all lifetimes."""
        out = []
        try:
            with open(self.log_path, "rb") as f:
                for line in f:
                    if line.startswith(b"{"):
                        try:
                            out.append(json.loads(line))
                        except ValueError:
                            pass
        except OSError:
            pass
        return out


def _fsyncs(record: dict) -> int | None:
    for key in ("fsyncs", "fsync_count", "syncs"):
        if isinstance(record.get(key), int):
            return record[key]
    return None


def _stats_lines(broker: Broker) -> list[dict]:
    return [r for r in broker.records() if r.get("event") == "store_stats"]


# -- load generators (child processes) ----------------------------------------


def _connect(port: int, deadline: float) -> socket.socket:
    sock, reader = stompwire.connect(port, deadline)
    if reader.rest:
        raise Failed(f"unexpected bytes after CONNECTED: {reader.rest[:80]!r}")
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
                    raise Failed("broker closed a producer connection")
                buf = state["rest"] + data
                cut = buf.rfind(b"\x00") + 1
                state["rest"] = buf[cut:]
                chunk = buf[:cut]
                if ERROR_MARK in chunk:
                    raise Failed("broker sent ERROR: " + chunk[chunk.find(ERROR_MARK):][:300].decode("utf-8", "replace"))
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
                raise Failed("broker closed the consumer connection")
            last_data = time.monotonic()
            buf = rest + data
            cut = buf.rfind(b"\x00") + 1
            rest = buf[cut:]
            chunk = buf[:cut]
            if ERROR_MARK in chunk:
                raise Failed("broker sent ERROR: " + chunk[chunk.find(ERROR_MARK):][:300].decode("utf-8", "replace"))
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


def _child(target, *args) -> tuple[multiprocessing.Process, object]:
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(*args, child), daemon=True)
    proc.start()
    return proc, parent


def _expect(conn, kind: str, deadline: float, broker: Broker, name: str) -> dict:
    while time.monotonic() < deadline:
        if conn.poll(0.25):
            what, payload = conn.recv()
            if what == kind:
                return payload
            if what == "RESULT":
                raise Failed(f"{name} failed before it was ready: {payload.get('error')}")
        if not broker.alive:
            raise Failed(f"broker exited with code {broker.proc.returncode}: {broker.log_tail()}")
    raise Failed(f"timed out waiting for {kind} from {name}")


# -- scenarios ------------------------------------------------------------------


def scenario_persistent(args: argparse.Namespace, broker: Broker, r: dict, deadline: float) -> None:
    dest = "/queue/bench.p"
    r.update({"producers": PRODUCERS, "window": WINDOW, "seconds": args.seconds, "destination": dest})
    broker.start(min(deadline, time.monotonic() + 30))
    r["broker_rss_idle_mib"] = broker.memory_mib()["rss_mib"]
    work_deadline = deadline - 20
    cons, cons_pipe = _child(consumer_main, broker.port, dest, work_deadline, args.idle)
    prod, prod_pipe = _child(producers_main, broker.port, dest, args.seconds, work_deadline)
    try:
        _expect(cons_pipe, "READY", time.monotonic() + 30, broker, "consumer")
        _expect(prod_pipe, "READY", time.monotonic() + 30, broker, "producers")
        cpu0 = broker.cpu()
        stats_before = len(_stats_lines(broker))
        t0 = time.monotonic()
        prod_pipe.send("GO")
        peak = {"rss_mib": 0.0, "peak_rss_mib": 0.0}
        p = None
        while p is None:
            if time.monotonic() > work_deadline + 5:
                raise Failed("producers did not report in time")
            if prod_pipe.poll(0.25):
                _, p = prod_pipe.recv()
            if broker.alive:
                peak = broker.memory_mib()
            elif p is None:
                raise Failed(f"broker died (exit code {broker.proc.returncode}): {broker.log_tail()}")
        t_load = time.monotonic() - t0
        r["load_s"] = t_load
        r["producer"] = p
        cons_pipe.send(p.get("receipted", 0))
        c = _expect(cons_pipe, "RESULT", work_deadline + 10, broker, "consumer")
        r["consumer"] = c
        r["broker"] = {"cpu_s": broker.cpu() - cpu0, **broker.memory_mib()}
        r["broker"]["peak_rss_mib"] = max(r["broker"]["peak_rss_mib"], peak.get("peak_rss_mib", 0))
        if p.get("error"):
            raise Failed(f"producers: {p['error']}")
        if c.get("error"):
            raise Failed(f"consumer: {c['error']}")
        t_first, t_last = p["t_first_send_ns"], p["t_last_receipt_ns"]
        r["elapsed_s"] = (t_last - t_first) / 1e9
        r["receipted"] = p["receipted"]
        r["receipted_per_s"] = p["receipted"] / r["elapsed_s"]
        r["latency_ms"] = p["latency_ms"]
        r["received"] = c["received"]
        if c.get("t_first_ns") and c.get("t_last_ns", 0) > t_first:
            r["consumer_elapsed_s"] = (c["t_last_ns"] - t_first) / 1e9
            r["acked_per_s"] = c["received"] / r["consumer_elapsed_s"]
        if c["received"] != p["receipted"]:
            raise Failed(f"consumer got {c['received']:,} of {p['receipted']:,} receipted messages")
        # fsyncs: the store logs its totals every few seconds.  Wait (bounded)
        # for the first line written after the load, and subtract the last
        # line before it (or 0: a fresh store has synced next to nothing).
        load_end_wall = time.time()
        lines_at_end = len(_stats_lines(broker))
        wait_until = min(work_deadline, time.monotonic() + args.stats_wait)
        lines = _stats_lines(broker)
        while time.monotonic() < wait_until and len(lines) <= lines_at_end and broker.alive:
            time.sleep(0.25)
            lines = _stats_lines(broker)
        base = _fsyncs(lines[stats_before - 1]) if stats_before else 0
        total = _fsyncs(lines[lines_at_end]) if len(lines) > lines_at_end else None
        if total is not None and base is not None:
            # Counted from before the load until the line after it; the quiet
            # seconds after the load add (next to) nothing, so per load second.
            r["fsyncs"] = total - base
            r["fsyncs_per_s"] = r["fsyncs"] / max(t_load, 1e-9)
            r["fsyncs_per_receipt"] = r["fsyncs"] / max(1, p["receipted"])
        else:
            r["fsyncs_note"] = "n/a (no store_stats line with an fsyncs field in the broker log)"
        r["stats_waited_s"] = round(time.time() - load_end_wall, 1)
    finally:
        for proc in (prod, cons):
            proc.join(2)
            if proc.is_alive():
                proc.kill()
                proc.join(2)


def _fill(port: int, dest: str, n: int, deadline: float) -> dict:
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
                raise Failed(f"fill: timed out with {done:,} of {n:,} receipted") from None
            return
        if not data:
            raise Failed(f"fill: broker closed the connection after {done:,} receipted")
        buf = rest + data
        cut = buf.rfind(b"\x00") + 1
        rest = buf[cut:]
        if ERROR_MARK in buf[:cut]:
            raise Failed("fill: broker sent ERROR: " + buf[buf.find(ERROR_MARK):][:300].decode("utf-8", "replace"))
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
            raise Failed(f"fill: timed out after {seq:,} of {n:,} sent")
    while outstanding:
        read(True)
    elapsed = time.monotonic() - t0
    sock.close()
    return {"fill_s": elapsed, "fill_msgs_per_s": n / elapsed}


def _first_message(port: int, dest: str, t_exec: float, deadline: float) -> tuple[float, int]:
    """Subscribe as soon as possible; seconds from exec to the first MESSAGE, its seq."""
    sock = _connect(port, deadline)
    sock.sendall(f"SUBSCRIBE\nid:1\ndestination:{dest}\nack:client-individual\nactivemq.prefetchSize:1\n\n\x00".encode())
    buf = b""
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            raise Failed("no message after the restart in time") from None
        if not data:
            raise Failed("broker closed the consumer connection after the restart")
        buf += data
        if ERROR_MARK in buf:
            raise Failed("broker sent ERROR: " + buf[buf.find(ERROR_MARK):][:300].decode("utf-8", "replace"))
        m = stompwire.SEQ_RE.search(buf)
        if m and b"\x00" in buf[m.end():]:
            t = time.monotonic() - t_exec
            sock.close()
            return t, int(m.group(1))


def _restart_and_measure(broker: Broker, dest: str, n: int, deadline: float, label: str, wait_s: float,
                         into: list[dict]) -> None:
    """Restart on the same data folder; the figures go into ``into`` as they
    are taken (so a failure still shows how far it got)."""
    out: dict = {"after": label}
    into.append(out)
    records_before = len(broker.records())
    t_exec = time.monotonic()
    out["accept_s"] = broker.start(deadline, keep_port=True)
    try:
        out["first_message_s"], seq = _first_message(broker.port, dest, t_exec, min(deadline, t_exec + wait_s))
    finally:
        out.update(broker.memory_mib())
        recovered = [x for x in broker.records()[records_before:] if x.get("event") == "store_recovered"]
        if recovered:
            out["recovered"] = {k: v for k, v in recovered[-1].items() if k not in ("event", "level", "timestamp")}
    if seq != 0:
        out["problem"] = f"first message after restart was #{seq:,}, not #0"
    elif recovered and isinstance(recovered[-1].get("messages"), int) and recovered[-1]["messages"] != n:
        out["problem"] = f"store_recovered says {recovered[-1]['messages']:,} messages, not {n:,}"


def scenario_restart(args: argparse.Namespace, broker: Broker, r: dict, deadline: float) -> None:
    dest = "/queue/bench.r"
    n = args.messages or 1_000_000
    r.update({"messages": n, "destination": dest})
    broker.start(min(deadline, time.monotonic() + 30))
    r["broker_rss_idle_mib"] = broker.memory_mib()["rss_mib"]
    r.update(_fill(broker.port, dest, n, deadline - 30))
    r["rss_filled_mib"] = broker.memory_mib()["rss_mib"]
    r["restarts"] = []
    broker.kill()
    _restart_and_measure(broker, dest, n, deadline, "SIGKILL", args.restart_wait, r["restarts"])
    t0 = time.monotonic()
    broker.proc.send_signal(signal.SIGTERM)
    try:
        broker.proc.wait(max(1.0, min(60.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        broker.kill()
        raise Failed("broker did not exit on SIGTERM in time") from None
    r["sigterm_shutdown_s"] = time.monotonic() - t0
    r["sigterm_exit_code"] = broker.proc.returncode
    _restart_and_measure(broker, dest, n, deadline, "SIGTERM", args.restart_wait, r["restarts"])
    for x in r["restarts"]:
        if x.get("problem"):
            raise Failed(f"after {x['after']}: {x['problem']}")
    if r["sigterm_exit_code"] != 0:
        raise Failed(f"broker exited with code {r['sigterm_exit_code']} on SIGTERM")


def run_scenario(name: str, args: argparse.Namespace) -> dict:
    r: dict = {"scenario": name, "ok": False, "problems": [], "loadavg_before": bench._loadavg()}
    start = time.monotonic()
    deadline = start + args.timeout
    broker = Broker(args.broker_cmd)
    try:
        (scenario_persistent if name == "persistent" else scenario_restart)(args, broker, r, deadline)
    except Failed as exc:
        r["problems"].append(str(exc))
    except Exception as exc:  # a bug in the runner: still clean up and report
        r["problems"].append(f"runner error: {type(exc).__name__}: {exc}")
    finally:
        broker.stop(wait=min(30.0, max(3.0, deadline - time.monotonic())))
        try:
            r["data_dir_mib"] = sum(f.stat().st_size for f in broker.data_dir.rglob("*") if f.is_file()) / 2**20
        except OSError:
            pass
        b = r.setdefault("broker", {})
        b["exit_code"], b["shutdown_s"] = broker.exit_code, broker.shutdown_s
        if broker.killed:
            r["problems"].append("broker did not exit on SIGTERM in time and was killed (SIGKILL)")
        if r["problems"]:
            b["log_tail"] = broker.log_tail()
        broker.cleanup()
    r["ok"] = not r["problems"]
    r["wall_s"] = time.monotonic() - start
    return r


# -- report -------------------------------------------------------------------

_f = bench._f


def print_scenario(r: dict) -> None:
    name = r["scenario"]
    if name == "persistent":
        print(f"\n== persistent: {r.get('producers')} producers x {r.get('window')} receipted SENDs in flight -> "
              f"{r.get('destination')} -> 1 consumer (client-individual, ACK each), 128 B, {r.get('seconds')} s")
    else:
        print(f"\n== restart: {_f(r.get('messages'))} persistent x 128 B in {r.get('destination')}, "
              f"then SIGKILL / SIGTERM and restart")
    if r["ok"]:
        print("  result        OK" + (f": {_f(r.get('received'))} of {_f(r.get('receipted'))} receipted messages "
                                     f"received and acked" if name == "persistent" else ""))
    else:
        print("  result        FAILED")
        for text in r["problems"]:
            print(f"    ! {text}")
    b = r.get("broker", {})
    if name == "persistent":
        lat = r.get("latency_ms") or {}
        print(f"  receipted     {_f(r.get('receipted_per_s'))} msgs/s   = {_f(r.get('receipted'))} receipts / "
              f"{_f(r.get('elapsed_s'), '.3f')} s (first send -> last receipt)")
        print(f"  consumed      {_f(r.get('acked_per_s'))} msgs/s   = {_f(r.get('received'))} received and acked / "
              f"{_f(r.get('consumer_elapsed_s'), '.3f')} s (first send -> last receive)")
        print(f"  receipt ms    p50 {_f(lat.get('p50_ms'), '.3f')}  p99 {_f(lat.get('p99_ms'), '.3f')}  "
              f"max {_f(lat.get('max_ms'), '.3f')}  (n={_f(lat.get('count'))})")
        if "fsyncs" in r:
            print(f"  fsyncs        {_f(r.get('fsyncs_per_s'))} /s   = {_f(r.get('fsyncs'))} fsyncs (store_stats) / "
                  f"{_f(r.get('load_s'), '.1f')} s load; {_f(r.get('fsyncs_per_receipt'), '.3f')} per receipt")
        else:
            print(f"  fsyncs        {r.get('fsyncs_note', 'n/a')}")
        print(f"  broker        CPU {_f(b.get('cpu_s'), '.2f')} s{bench._pct(b.get('cpu_s'), r.get('elapsed_s'))};  "
              f"RSS {_f(b.get('rss_mib'), '.1f')} MiB at end, peak {_f(b.get('peak_rss_mib'), '.1f')} MiB "
              f"(idle at start {_f(r.get('broker_rss_idle_mib'), '.1f')} MiB)")
        p, c = r.get("producer", {}), r.get("consumer", {})
        print(f"  producers     CPU {_f(p.get('cpu_s'), '.2f')} s;  consumer CPU {_f(c.get('cpu_s'), '.2f')} s")
    else:
        print(f"  fill          {_f(r.get('fill_msgs_per_s'))} msgs/s   = {_f(r.get('messages'))} in "
              f"{_f(r.get('fill_s'), '.1f')} s; RSS {_f(r.get('rss_filled_mib'), '.1f')} MiB filled "
              f"(idle {_f(r.get('broker_rss_idle_mib'), '.1f')} MiB); data dir {_f(r.get('data_dir_mib'), '.1f')} MiB")
        for x in r.get("restarts", []):
            rec = x.get("recovered") or {}
            extra = (f"; store_recovered: {_f(rec.get('messages'))} messages in {_f(rec.get('seconds'), '.2f')} s"
                     if rec else "")
            print(f"  {'after ' + x['after']:<13} port accepting {_f(x.get('accept_s'), '.2f')} s, first message "
                  f"{_f(x.get('first_message_s'), '.2f')} s after exec; RSS {_f(x.get('rss_mib'), '.1f')} MiB "
                  f"(peak {_f(x.get('peak_rss_mib'), '.1f')}){extra}")
        if "sigterm_shutdown_s" in r:
            print(f"  SIGTERM       exit code {r.get('sigterm_exit_code')} in {_f(r.get('sigterm_shutdown_s'), '.2f')} s "
                  f"with {_f(r.get('messages'))} messages stored")
    shutdown = b.get("shutdown_s")
    how = (f"SIGTERM -> exit code {b.get('exit_code')} in {_f(shutdown, '.2f')} s" if shutdown is not None
           else f"exit code {b.get('exit_code')}")
    print(f"  shutdown      {how}; load average before {r.get('loadavg_before')}")
    if b.get("log_tail") and not r["ok"]:
        print("  broker log (tail):")
        for line in b["log_tail"].splitlines():
            print(f"    | {line}")


def print_summary(results: list[dict]) -> None:
    print("\n== summary")
    head = (f"{'scenario':<10} {'result':<7} {'rcpt/s':>9} {'acked/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'fsync/s':>8} "
            f"{'RSS MiB':>8} {'kill->1st':>9} {'term->1st':>9} {'RSS kill':>8}")
    print(head)
    print("-" * len(head))
    for r in results:
        lat = r.get("latency_ms") or {}
        rs = {x["after"]: x for x in r.get("restarts", [])}
        rss = r.get("broker", {}).get("rss_mib") if r["scenario"] == "persistent" else rs.get("SIGTERM", {}).get("rss_mib")
        print(f"{r['scenario']:<10} {'OK' if r['ok'] else 'FAILED':<7} {_f(r.get('receipted_per_s')):>9} "
              f"{_f(r.get('acked_per_s')):>9} {_f(lat.get('p50_ms'), '.2f'):>7} {_f(lat.get('p99_ms'), '.2f'):>7} "
              f"{_f(r.get('fsyncs_per_s')):>8} {_f(rss, '.1f'):>8} "
              f"{_f(rs.get('SIGKILL', {}).get('first_message_s'), '.2f'):>9} "
              f"{_f(rs.get('SIGTERM', {}).get('first_message_s'), '.2f'):>9} "
              f"{_f(rs.get('SIGKILL', {}).get('rss_mib'), '.1f'):>8}")


# -- main ---------------------------------------------------------------------


def _default_broker_cmd() -> str:
    gateway = bench.ROOT / ".venv" / "bin" / "gateway"
    base = shlex.quote(str(gateway)) if gateway.exists() else f"{shlex.quote(sys.executable)} -m gateway"
    # INFO and JSON: the store_stats and store_recovered lines are read back.
    return base + " serve --stomp-port {port} --mqtt-port 0 --admin-port 0 --data-dir {data_dir} --log-level info --log-format json"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=(*SCENARIOS, "all"), default="all")
    parser.add_argument("--messages", type=int, metavar="N", help="messages for restart (default 1000000)")
    parser.add_argument("--seconds", type=float, default=10.0, metavar="S", help="persistent run length (default 10)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--broker-cmd", default=_default_broker_cmd(), metavar="CMD",
                        help="broker command; {port} and {data_dir} are substituted; without {port}, "
                             "'--stomp-port {port} --data-dir {data_dir}' is appended. It should log JSON at "
                             "INFO for the fsync figures (default: %(default)s)")
    parser.add_argument("--idle", type=float, default=15.0, metavar="S",
                        help="the consumer gives up after S seconds without data (default 15)")
    parser.add_argument("--stats-wait", type=float, default=12.0, metavar="S",
                        help="wait up to S s after the load for a store_stats log line (default 12)")
    parser.add_argument("--restart-wait", type=float, default=120.0, metavar="S",
                        help="restart: give up if no message arrives S s after exec (default 120)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S", help="hard limit per scenario (default 300)")
    args = parser.parse_args(argv)
    if "{port}" not in args.broker_cmd:
        args.broker_cmd += " --stomp-port {port} --data-dir {data_dir}"
    for name in ("messages", "seconds", "idle"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name} must be positive")
    if args.timeout < 30:
        parser.error("--timeout must be at least 30 s")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, bench._on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    names = SCENARIOS if args.scenario == "all" else (args.scenario,)
    print(f"gateway persistence benchmark: {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load average {bench._loadavg()}")
    print(f"broker: {args.broker_cmd}")
    results = []
    try:
        for name in names:
            result = run_scenario(name, args)
            results.append(result)
            print_scenario(result)
            sys.stdout.flush()
    except (KeyboardInterrupt, SystemExit) as exc:
        code = 130 if isinstance(exc, KeyboardInterrupt) else exc.code
        print("\ninterrupted (signal); every process this run started has been stopped", file=sys.stderr)
        if results:
            print_summary(results)
        return code if isinstance(code, int) else 1
    print_summary(results)
    if args.json:
        doc = {"python": platform.python_version(), "cpus": os.cpu_count(), "broker_cmd": args.broker_cmd,
               "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "results": results}
        Path(args.json).write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"\nresults written to {args.json}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
