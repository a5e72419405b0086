"""The queue, topic and latency scenarios of run.py: load-generator processes
(``load/loadgen.py``) around one broker, their results collected within the
scenario's deadline, and the delivery check and rates from their timestamps.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.harness.broker import BENCHMARKS, Broker, ScenarioFailed, loadavg

LOADGEN = BENCHMARKS / "load" / "loadgen.py"
DEFAULT_MESSAGES = {"queue": 200_000, "topic": 50_000}


# -- load generators ---------------------------------------------------------


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
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, cwd=BENCHMARKS,
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
        r["loadavg_before"] = loadavg()
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
