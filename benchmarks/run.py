"""Throughput and latency benchmarks against a real broker process (stdlib only).

    .venv/bin/python benchmarks/run.py [--scenario queue|topic|latency|all]
        [--messages N] [--seconds S] [--rate R] [--json FILE] [--broker-cmd CMD]
    .venv/bin/python benchmarks/run.py --scenario persistent|restart [...]
        (persistent messages and restarts: runs benchmarks/persistent.py with
        the same arguments; see its --help)
    .venv/bin/python benchmarks/run.py --scenario mqtt-qos0|mqtt-qos1|mqtt-fanout|mqtt-latency|mqtt-idle|mqtt-all [...]
        (MQTT over raw sockets: runs benchmarks/mqtt.py with the same
        arguments; see its --help)
    .venv/bin/python benchmarks/run.py --scenario transports [...]
        (STOMP and MQTT over plain TCP next to WebSocket: runs
        benchmarks/transports.py with the same arguments; see its --help)
    .venv/bin/python benchmarks/run.py --scenario archive-read|archive-publish [...]
        (topic archives: runs benchmarks/archive.py with the same arguments;
        see its --help)
    .venv/bin/python benchmarks/run.py --scenario spark-read [...]
        (a Spark count over the gateway data source: runs
        benchmarks/spark_read.py with the same arguments; see its --help)

Each scenario starts a fresh broker (``gateway serve``) on a free 127.0.0.1 port
with a temporary data dir, runs the load generator (``loadgen.py``) in separate
processes that speak STOMP 1.2 over raw sockets with pre-encoded frames, then
stops the broker with SIGTERM.  Every wait is bounded: a scenario ends within
about ``--timeout`` seconds (default 120) even if the broker stalls, and no
process it started is left behind, whatever happens.

Scenarios (128-byte bodies, ack auto, no receipts on SEND, heart-beat 0,0):

queue    one producer -> /queue/bench.q -> one consumer; N messages (default
         200,000) sent in batches of 1,000 frames per sendall.  Throughput =
         delivered / (last receive - first send); every message must arrive,
         in order.
topic    one producer -> /topic/bench.t -> 16 subscriber sockets spread over 2
         consumer processes; N messages (default 50,000).  Delivered msgs/s =
         N x 16 / (last receive - first send); publish msgs/s = N / (time the
         broker had taken every SEND - first send).  Every subscriber must get
         all N.
latency  a producer paced at R msgs/s (default 5,000) for S seconds (default 10)
         in 1 ms ticks, each body carrying time.monotonic_ns() at send; the
         consumer records receive - send (CLOCK_MONOTONIC is system-wide).
         Reports p50/p90/p99/p99.9/max and the rates achieved.

For each: the broker's CPU seconds (/proc/PID/stat, from the start signal to the
end), its current and peak RSS (VmRSS, VmHWM), and the producer's and
consumers' CPU seconds, so one can see whether the generator kept up.  The
publish time comes from a DISCONNECT with a receipt the producer sends after its
last SEND (the only receipt used).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import queue
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LOADGEN = HERE / "loadgen.py"
HOST = "127.0.0.1"
CLK_TCK = os.sysconf("SC_CLK_TCK")
DEFAULT_MESSAGES = {"queue": 200_000, "topic": 50_000}
SCENARIOS = ("queue", "topic", "latency")
PERSISTENCE_SCENARIOS = ("persistent", "restart")  # in persistent.py, not part of "all"
ARCHIVE_SCENARIOS = ("archive-read", "archive-publish")  # in archive.py, not part of "all"
SPARK_SCENARIOS = ("spark-read",)  # in spark_read.py, not part of "all"
MQTT_SCENARIOS = ("mqtt-qos0", "mqtt-qos1", "mqtt-fanout", "mqtt-latency", "mqtt-idle", "mqtt-all")  # in mqtt.py, not part of "all"
TRANSPORT_SCENARIOS = ("transports",)  # in transports.py (TCP vs WebSocket), not part of "all"
# Scenario -> the module of benchmarks/ that runs it.
DELEGATES = {
    **dict.fromkeys(PERSISTENCE_SCENARIOS, "persistent"),
    **dict.fromkeys(ARCHIVE_SCENARIOS, "archive"),
    **dict.fromkeys(SPARK_SCENARIOS, "spark_read"),
    **dict.fromkeys(MQTT_SCENARIOS, "mqtt"),
    **dict.fromkeys(TRANSPORT_SCENARIOS, "transports"),
}


class ScenarioFailed(Exception):
    pass


# -- processes ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _proc_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a wrapper script may fork the real broker)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, ()))
    return tree


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def _memory_kb(pid: int) -> dict[str, int]:
    out = {"VmRSS": 0, "VmHWM": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in out:
                    out[key] = int(value.split()[0])
    except (OSError, ValueError):
        pass
    return out


# Started through this shim so the broker gets SIGKILL if the runner itself is
# killed outright (PR_SET_PDEATHSIG survives exec; the pid stays the same).
_EXEC_SHIM = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]): os._exit(3)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


class Broker:
    def __init__(self, template: str) -> None:
        self.template = template
        self.tmp = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
        self.data_dir = self.tmp / "data"
        self.log_path = self.tmp / "broker.log"
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self.shutdown_s: float | None = None
        self.killed = False

    def start(self, deadline: float) -> None:
        self.port = _free_port()
        cmd = shlex.split(self.template.format(port=self.port, data_dir=shlex.quote(str(self.data_dir))))
        self.command = cmd
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _EXEC_SHIM, str(os.getpid()), *cmd],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            )
        while True:
            if self.proc.poll() is not None:
                raise ScenarioFailed(f"broker exited with code {self.proc.returncode} at startup: {self.log_tail()}")
            try:
                with socket.create_connection((HOST, self.port), timeout=0.5):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"broker did not accept connections on {HOST}:{self.port} in time")
            time.sleep(0.05)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu(self) -> float:
        if not self.alive:
            return float("nan")
        return sum(_cpu_seconds(p) for p in _proc_tree(self.proc.pid))

    def memory_mib(self) -> dict[str, float]:
        if not self.alive:
            return {"rss_mib": float("nan"), "peak_rss_mib": float("nan")}
        rss = hwm = 0
        for p in _proc_tree(self.proc.pid):
            m = _memory_kb(p)
            rss += m["VmRSS"]
            hwm += m["VmHWM"]
        return {"rss_mib": rss / 1024, "peak_rss_mib": hwm / 1024}

    def stop(self, wait: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``wait`` seconds; never raises."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            t0 = time.monotonic()
            tree = _proc_tree(proc.pid)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(wait)
                self.shutdown_s = time.monotonic() - t0
            except subprocess.TimeoutExpired:
                self.killed = True
                for p in tree:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except OSError:
                        pass
                proc.wait(5)
            for p in tree[1:]:  # a wrapper's children, if any outlived it
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
        self.exit_code = proc.returncode

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip()
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def cleanup(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


class Worker:
    """One load-generator process; its stdout lines arrive on a shared queue."""

    def __init__(self, name: str, params: dict, events: queue.Queue) -> None:
        self.name = name
        self.ready: dict | None = None
        self.result: dict | None = None
        self.stderr = tempfile.TemporaryFile()
        params = {**params, "parent": os.getpid()}
        self.proc = subprocess.Popen(
            [sys.executable, str(LOADGEN), json.dumps(params)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, cwd=HERE,
            text=True, bufsize=1,
        )
        self.thread = threading.Thread(target=self._read, args=(events,), daemon=True)
        self.thread.start()

    def _read(self, events: queue.Queue) -> None:
        for line in self.proc.stdout:
            kind, _, payload = line.strip().partition(" ")
            try:
                events.put((self, kind, json.loads(payload) if payload else {}))
            except ValueError:
                events.put((self, "NOISE", {"line": line}))
        events.put((self, "EXIT", {}))

    def tell(self, command: str) -> None:
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass

    def error_output(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace").strip()[-2000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self.stderr.close()


def _await(workers: list[Worker], kind: str, events: queue.Queue, deadline: float, broker: Broker, tick=None) -> None:
    """Until every worker has reported ``kind`` (READY or RESULT), or the deadline;
    ``tick`` is called between events."""
    def pending() -> list[Worker]:
        return [w for w in workers if (w.ready if kind == "READY" else w.result) is None]

    while pending():
        if tick is not None:
            tick()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ScenarioFailed(f"timed out waiting for {kind} from {', '.join(w.name for w in pending())}")
        try:
            worker, what, payload = events.get(timeout=min(0.25, remaining))
        except queue.Empty:
            if kind == "READY" and not broker.alive:
                raise ScenarioFailed(f"broker exited with code {broker.proc.returncode}: {broker.log_tail()}")
            continue
        if what == "READY":
            worker.ready = payload
        elif what == "RESULT":
            worker.result = payload
            if kind == "READY" and worker.ready is None:
                raise ScenarioFailed(f"{worker.name} failed before it was ready: {payload.get('error')}")
        elif what == "EXIT" and (worker.result is None):
            raise ScenarioFailed(
                f"{worker.name} exited with code {worker.proc.wait()} without a result: {worker.error_output()}"
            )


# -- scenarios ----------------------------------------------------------------


class Scenario:
    """Owns a broker and workers; always cleans them up."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name = name
        self.args = args
        self.start = time.monotonic()
        self.deadline = self.start + args.timeout
        self.events: queue.Queue = queue.Queue()
        self.workers: list[Worker] = []
        self.broker = Broker(args.broker_cmd)
        self.result: dict = {"scenario": name, "ok": False, "problems": []}
        self.result.update(self._plan())
        self.sample: dict = {}
        self.sampled_at = 0.0
        self.died = False

    def _plan(self) -> dict:
        args = self.args
        if self.name == "queue":
            return {"messages": args.messages or DEFAULT_MESSAGES["queue"], "destination": "/queue/bench.q",
                    "subscribers": 1, "consumer_processes": 1}
        if self.name == "topic":
            return {"messages": args.messages or DEFAULT_MESSAGES["topic"], "destination": "/topic/bench.t",
                    "subscribers": args.subscribers,
                    "consumer_processes": max(1, min(args.consumer_procs, args.subscribers))}
        return {"messages": int(args.rate * args.seconds), "destination": "/queue/bench.latency",
                "subscribers": 1, "consumer_processes": 1, "rate": args.rate, "seconds": args.seconds}

    def _sample_broker(self, force: bool = False) -> None:
        """Keep the broker's latest CPU and memory figures (it may die later)."""
        now = time.monotonic()
        if (force or now - self.sampled_at >= 0.25) and self.broker.alive:
            cpu, mem = self.broker.cpu(), self.broker.memory_mib()
            if self.broker.alive and mem["rss_mib"]:
                self.sample = {"cpu_s": cpu, **mem}
                self.sampled_at = now

    def problem(self, text: str) -> None:
        self.result["problems"].append(text)

    def worker(self, name: str, params: dict) -> Worker:
        # Workers stop on their own well before the scenario deadline so that
        # they still report what they measured and the broker can be stopped.
        params = {**params, "port": self.broker.port, "deadline": self.deadline - 15}
        w = Worker(name, params, self.events)
        self.workers.append(w)
        return w

    def run(self) -> dict:
        r = self.result
        r["loadavg_before"] = _loadavg()
        try:
            self.broker.start(min(self.deadline, time.monotonic() + 20))
            r["broker_rss_idle_mib"] = self.broker.memory_mib()["rss_mib"]
            getattr(self, "_" + self.name)()
        except ScenarioFailed as exc:
            self.problem(str(exc))
            if self.broker.proc is not None and not self.broker.alive:
                self.died = True  # already said; not again from _finish
        except Exception as exc:  # a bug in the runner: still clean up and report
            self.problem(f"runner error: {type(exc).__name__}: {exc}")
        finally:
            self._finish()
        r["ok"] = not r["problems"]
        r["wall_s"] = time.monotonic() - self.start
        return r

    def _launch_and_measure(self, producer: Worker, consumers: list[Worker]) -> None:
        """READY from all, GO to the producer, collect results, sample the broker."""
        ready_deadline = min(self.deadline - 10, time.monotonic() + 30)
        _await(self.workers, "READY", self.events, ready_deadline, self.broker)
        self._sample_broker(force=True)
        cpu0 = self.sample.get("cpu_s", float("nan"))
        producer.tell("GO")
        consumers_done: list[float] = []

        def tick() -> None:
            self._sample_broker()
            # Consumers give up after --idle seconds without data; a producer
            # still blocked in send then means the broker stopped reading.
            if producer.result is None and all(c.result is not None for c in consumers):
                if not consumers_done:
                    consumers_done.append(time.monotonic())
                elif time.monotonic() - consumers_done[0] > 2 and len(consumers_done) == 1:
                    consumers_done.append(time.monotonic())
                    producer.tell("STOP")

        try:
            _await(self.workers, "RESULT", self.events, self.deadline - 12, self.broker, tick)
        except ScenarioFailed as exc:
            self.problem(str(exc))
            for w in self.workers:  # ask for what they have
                if w.result is None:
                    w.tell("STOP")
            try:
                _await(self.workers, "RESULT", self.events, time.monotonic() + 3, self.broker)
            except ScenarioFailed:
                pass
        broker = self.broker
        self._sample_broker(force=True)
        self.result["broker"] = {**self.sample, "cpu_s": self.sample.get("cpu_s", float("nan")) - cpu0}
        if not broker.alive:
            self.died = True
            self.problem(f"broker died during the run (exit code {broker.proc.returncode}); its CPU and RSS "
                         f"are the last sample before that" + (f"; log: {broker.log_tail()}" if broker.log_tail() else ""))
        self.result["producer"] = producer.result or {"error": "no result"}
        self.result["consumers"] = [c.result or {"error": "no result"} for c in consumers]

    def _finish(self) -> None:
        for w in self.workers:
            if w.proc.poll() is None and w.result is not None:
                try:
                    w.proc.wait(2)
                except subprocess.TimeoutExpired:
                    pass
            w.kill()
        self.broker.stop(wait=min(10.0, max(3.0, self.deadline - time.monotonic())))
        b = self.result.setdefault("broker", {})
        b["exit_code"] = self.broker.exit_code
        b["shutdown_s"] = self.broker.shutdown_s
        if self.broker.killed:
            self.problem("broker did not exit on SIGTERM in time and was killed (SIGKILL)")
        elif self.broker.exit_code not in (0, None) and not self.died:
            self.problem(f"broker exited with code {self.broker.exit_code}")
        tail = self.broker.log_tail()
        if tail:
            b["log_tail"] = tail
        self.broker.cleanup()

    # Each scenario fills self.result with its figures.

    def _queue(self) -> None:
        n, dest = self.result["messages"], self.result["destination"]
        consumer = self.worker("consumer", {"role": "consumer", "destination": dest, "sockets": 1,
                                            "messages": n, "idle_s": self.args.idle})
        producer = self.worker("producer", {"role": "producer", "destination": dest, "messages": n,
                                            "batch": self.args.batch})
        self._launch_and_measure(producer, [consumer])
        self._throughput(n, 1)

    def _topic(self) -> None:
        n, dest = self.result["messages"], self.result["destination"]
        subs, procs = self.result["subscribers"], self.result["consumer_processes"]
        consumers = []
        for i in range(procs):
            share = subs // procs + (1 if i < subs % procs else 0)
            consumers.append(self.worker(f"consumer{i + 1}", {"role": "consumer", "name": str(i), "destination": dest,
                                                             "sockets": share, "messages": n, "idle_s": self.args.idle}))
        producer = self.worker("producer", {"role": "producer", "destination": dest, "messages": n,
                                            "batch": self.args.batch})
        self._launch_and_measure(producer, consumers)
        self._throughput(n, subs)

    def _latency(self) -> None:
        n, dest, rate = self.result["messages"], self.result["destination"], self.result["rate"]
        consumer = self.worker("consumer", {"role": "consumer", "destination": dest, "sockets": 1, "messages": n,
                                            "idle_s": self.args.idle, "timed": True})
        producer = self.worker("producer", {"role": "producer", "destination": dest, "messages": n, "rate": rate})
        self._launch_and_measure(producer, [consumer])
        self._throughput(n, 1)
        c = self.result["consumers"][0]
        self.result["latency_ms"] = c.get("latency", {})
        p = self.result["producer"]
        self.result["send_rate"] = p.get("send_rate")
        streams = c.get("streams") or []
        if streams and streams[0]["count"] > 1 and streams[0]["last_ns"] > streams[0]["first_ns"]:
            s = streams[0]
            self.result["receive_rate"] = (s["count"] - 1) / ((s["last_ns"] - s["first_ns"]) / 1e9)

    def _throughput(self, n: int, subscribers: int) -> None:
        """Delivery check and rates from the workers' timestamps."""
        r = self.result
        p = r["producer"]
        if p.get("error"):
            self.problem(f"producer: {p['error']}" + (f" [broker said: {p['broker_said']}]" if p.get("broker_said") else ""))
        streams = []
        for c in r["consumers"]:
            if c.get("error"):
                self.problem(f"consumer: {c['error']}")
            streams.extend(c.get("streams") or [])
        expected = n * subscribers
        delivered = sum(s["count"] for s in streams)
        r["expected"] = expected
        r["delivered"] = delivered
        r["missing"] = sum(max(0, n - (s["count"] - s["out_of_order"])) for s in streams) + n * (subscribers - len(streams))
        r["gaps"] = sum(s["gaps"] for s in streams)
        r["out_of_order"] = sum(s["out_of_order"] for s in streams)
        r["per_subscriber"] = [s["count"] for s in streams]
        short = [(i, s) for i, s in enumerate(streams) if s["count"] != n or s["gaps"] or s["out_of_order"] or s["error"]]
        if len(short) > 3:
            counts = [s["count"] for _, s in short]
            self.problem(f"{len(short)} of {len(streams)} subscribers incomplete: each got {min(counts):,} to "
                         f"{max(counts):,} of {n:,} (first one below; all in the --json output)")
            short = short[:1]
        for i, s in short:
            what = f"subscriber {i + 1}: got {s['count']:,} of {n:,}"
            if s["gaps"]:
                ranges = ", ".join(f"{a:,}-{b:,}" if a != b else f"{a:,}" for a, b in s.get("gap_ranges", []))
                what += f", {s['gaps']:,} missing in the middle (first ranges: {ranges})"
            if s.get("next_seq", n) < n:
                what += f", nothing after #{s['next_seq'] - 1:,}"
            if s["out_of_order"]:
                what += f", {s['out_of_order']:,} out of order or duplicated"
            if s["error"]:
                what += f" ({s['error']})"
            self.problem(what)
        if short:
            reasons = {c.get("stop_reason") for c in r["consumers"] if c.get("stop_reason")}
            if reasons - {"all messages received"}:
                self.problem("consumers stopped: " + "; ".join(sorted(reasons)))
        t0 = p.get("t_first_send")
        last = max((s["last_ns"] for s in streams if s["count"]), default=0)
        if t0 and last > t0:
            r["elapsed_s"] = (last - t0) / 1e9
            r["msgs_per_s"] = delivered / r["elapsed_s"]
        if t0 and p.get("t_accepted"):
            r["publish_s"] = (p["t_accepted"] - t0) / 1e9
            r["publish_msgs_per_s"] = n / r["publish_s"]
        if t0 and p.get("t_last_send"):
            r["send_s"] = (p["t_last_send"] - t0) / 1e9


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


# -- report -------------------------------------------------------------------


def _f(value, spec: str = ",.0f", missing: str = "-") -> str:
    if value is None or value != value:  # None or NaN
        return missing
    return format(value, spec)


def _pct(cpu, wall) -> str:
    if cpu is None or not wall:
        return ""
    return f" ({100 * cpu / wall:.0f}% of a core)"


def print_scenario(r: dict) -> None:
    name = r["scenario"]
    n = r.get("messages")
    headline = {
        "queue": f"1 producer -> {r.get('destination')} -> 1 consumer, {_f(n)} x 128 B",
        "topic": f"1 producer -> {r.get('destination')} -> {r.get('subscribers')} subscribers "
                 f"in {r.get('consumer_processes')} processes, {_f(n)} x 128 B",
        "latency": f"{_f(r.get('rate'))} msgs/s for {r.get('seconds')} s -> {r.get('destination')} -> 1 consumer, 128 B",
    }[name]
    print(f"\n== {name}: {headline}; STOMP 1.2, ack auto, no receipts")
    if r["ok"]:
        each = " each" if r.get("subscribers", 1) > 1 else ""
        print(f"  result        OK: {_f(r.get('delivered'))} of {_f(r.get('expected'))} delivered"
              f"{' (' + _f(n) + each + ')' if each else ''}, none lost, in order")
    else:
        print(f"  result        FAILED: {_f(r.get('delivered'))} of {_f(r.get('expected'))} delivered"
              + (f", {_f(r.get('missing'))} missing" if r.get("missing") else ""))
        for text in r["problems"]:
            print(f"    ! {text}")
    wall = r.get("elapsed_s")
    if name == "latency":
        lat = r.get("latency_ms") or {}
        print(f"  rate          asked {_f(r.get('rate'))} msgs/s; producer sent {_f(r.get('send_rate'))} msgs/s, "
              f"consumer received {_f(r.get('receive_rate'))} msgs/s")
        p = r.get("producer", {})
        if "late_ticks" in p:
            print(f"  pacing        {p['late_ticks']} ticks behind schedule (max lag {p['max_schedule_lag_ms']:.2f} ms)")
        print(f"  latency ms    p50 {_f(lat.get('p50_ms'), '.3f')}  p90 {_f(lat.get('p90_ms'), '.3f')}  "
              f"p99 {_f(lat.get('p99_ms'), '.3f')}  p99.9 {_f(lat.get('p999_ms'), '.3f')}  "
              f"max {_f(lat.get('max_ms'), '.3f')}  (mean {_f(lat.get('mean_ms'), '.3f')}, n={_f(lat.get('count'))})")
    else:
        label = "delivered" if name == "topic" else "throughput"
        print(f"  {label:<13} {_f(r.get('msgs_per_s'))} msgs/s   = {_f(r.get('delivered'))} delivered / "
              f"{_f(wall, '.3f')} s (first send -> last receive)")
        if r.get("publish_s"):
            print(f"  publish       {_f(r.get('publish_msgs_per_s'))} msgs/s   = {_f(n)} SENDs taken by the broker in "
                  f"{_f(r.get('publish_s'), '.3f')} s (producer's socket writes done after {_f(r.get('send_s'), '.3f')} s)")
        else:
            print("  publish       -   (the broker never confirmed taking every SEND)")
    b = r.get("broker", {})
    print(f"  broker        CPU {_f(b.get('cpu_s'), '.2f')} s{_pct(b.get('cpu_s'), wall)};  "
          f"RSS {_f(b.get('rss_mib'), '.1f')} MiB at end, peak {_f(b.get('peak_rss_mib'), '.1f')} MiB "
          f"(idle at start {_f(r.get('broker_rss_idle_mib'), '.1f')} MiB)")
    p = r.get("producer", {})
    print(f"  producer      CPU {_f(p.get('cpu_s'), '.2f')} s{_pct(p.get('cpu_s'), wall)}")
    for i, c in enumerate(r.get("consumers", [])):
        label = "consumer" if len(r["consumers"]) == 1 else f"consumer {i + 1}"
        socks = len(c.get("streams") or [])
        print(f"  {label:<13} CPU {_f(c.get('cpu_s'), '.2f')} s{_pct(c.get('cpu_s'), wall)}"
              + (f" for {socks} sockets" if socks > 1 else ""))
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
    head = (f"{'scenario':<9} {'result':<7} {'msgs/s':>9} {'publish/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
            f"{'p99.9 ms':>8} {'max ms':>7} {'RSS MiB':>8} {'peak MiB':>8} {'broker s':>8} {'prod s':>6} {'cons s':>6}")
    print(head)
    print("-" * len(head))
    for r in results:
        lat = r.get("latency_ms") or {}
        b = r.get("broker", {})
        cons = sum(c.get("cpu_s") or 0 for c in r.get("consumers", [])) if r.get("consumers") else None
        rate = r.get("msgs_per_s") if r["scenario"] != "latency" else r.get("receive_rate")
        print(f"{r['scenario']:<9} {'OK' if r['ok'] else 'FAILED':<7} {_f(rate):>9} {_f(r.get('publish_msgs_per_s')):>9} "
              f"{_f(lat.get('p50_ms'), '.2f'):>7} {_f(lat.get('p99_ms'), '.2f'):>7} {_f(lat.get('p999_ms'), '.2f'):>8} "
              f"{_f(lat.get('max_ms'), '.2f'):>7} {_f(b.get('rss_mib'), '.1f'):>8} {_f(b.get('peak_rss_mib'), '.1f'):>8} "
              f"{_f(b.get('cpu_s'), '.2f'):>8} {_f(r.get('producer', {}).get('cpu_s'), '.2f'):>6} {_f(cons, '.2f'):>6}")


# -- main ---------------------------------------------------------------------


def _default_broker_cmd() -> str:
    gateway = ROOT / ".venv" / "bin" / "gateway"
    base = shlex.quote(str(gateway)) if gateway.exists() else f"{shlex.quote(sys.executable)} -m gateway"
    return base + " serve --stomp-port {port} --mqtt-port 0 --admin-port 0 --data-dir {data_dir} --log-level warning"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=(*SCENARIOS, *DELEGATES, "all"), default="all",
                        help="persistent and restart are benchmarks/persistent.py's, mqtt-* benchmarks/mqtt.py's "
                             "(see their --help)")
    parser.add_argument("--messages", type=int, metavar="N",
                        help="messages for queue (default 200000) and topic (default 50000)")
    parser.add_argument("--seconds", type=float, default=10.0, metavar="S", help="latency run length (default 10)")
    parser.add_argument("--rate", type=int, default=5000, metavar="R", help="latency send rate, msgs/s (default 5000)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--broker-cmd", default=_default_broker_cmd(), metavar="CMD",
                        help="broker command; {port} and {data_dir} are substituted; without {port}, "
                             "'--stomp-port {port} --data-dir {data_dir}' is appended (default: %(default)s)")
    parser.add_argument("--subscribers", type=int, default=16, help="topic subscribers (default 16)")
    parser.add_argument("--consumer-procs", type=int, default=2, help="processes the topic subscribers are spread over (default 2)")
    parser.add_argument("--batch", type=int, default=1000, help="frames per sendall for the flood producer (default 1000)")
    parser.add_argument("--idle", type=float, default=8.0, metavar="S",
                        help="a consumer gives up after S seconds without data (default 8)")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S", help="hard limit per scenario (default 120)")
    args = parser.parse_args(argv)
    if "{port}" not in args.broker_cmd:
        args.broker_cmd += " --stomp-port {port} --data-dir {data_dir}"
    for name in ("messages", "seconds", "rate", "subscribers", "consumer_procs", "batch", "idle"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.timeout < 30:
        parser.error("--timeout must be at least 30 s")
    return args


def _on_sigterm(signum, frame):  # noqa: ARG001
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--scenario")
    delegate = DELEGATES.get(pre.parse_known_args(argv)[0].scenario)
    if delegate is not None:  # a scenario another module of benchmarks/ runs with these arguments
        sys.path.insert(0, str(HERE))
        return importlib.import_module(delegate).main(argv)
    args = _parse(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    names = SCENARIOS if args.scenario == "all" else (args.scenario,)
    print(f"gateway benchmark: {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load average {_loadavg()}")
    print(f"broker: {args.broker_cmd}")
    results = []
    try:
        for name in names:
            result = Scenario(name, args).run()
            results.append(result)
            print_scenario(result)
            sys.stdout.flush()
    except (KeyboardInterrupt, SystemExit) as exc:
        # Scenario.run's finally has already stopped the broker and workers.
        code = 130 if isinstance(exc, KeyboardInterrupt) else exc.code
        print("\ninterrupted (signal); every process this run started has been stopped", file=sys.stderr)
        if results:
            print_summary(results)
        return code if isinstance(code, int) else 1
    print_summary(results)
    if args.json:
        doc = {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "broker_cmd": args.broker_cmd,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "results": results,
        }
        Path(args.json).write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"\nresults written to {args.json}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
