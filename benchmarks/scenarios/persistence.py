"""The persistent and restart scenarios of persistent.py: each runs against a
fresh broker within its deadline, and whatever happens the broker is stopped
and what was measured, or what went wrong, is reported."""

from __future__ import annotations

import argparse
import signal
import subprocess
import time

from benchmarks.harness.broker import Broker, ScenarioFailed, fsyncs, loadavg, stats_lines
from benchmarks.load.persistent_load import PRODUCERS, WINDOW, consumer_main, expect, fill, first_message, producers_main, spawn


def scenario_persistent(args: argparse.Namespace, broker: Broker, r: dict, deadline: float) -> None:
    dest = "/queue/bench.p"
    r.update({"producers": PRODUCERS, "window": WINDOW, "seconds": args.seconds, "destination": dest})
    broker.start(min(deadline, time.monotonic() + 30))
    r["broker_rss_idle_mib"] = broker.memory_mib()["rss_mib"]
    work_deadline = deadline - 20
    cons, cons_pipe = spawn(consumer_main, broker.port, dest, work_deadline, args.idle)
    prod, prod_pipe = spawn(producers_main, broker.port, dest, args.seconds, work_deadline)
    try:
        expect(cons_pipe, "READY", time.monotonic() + 30, broker, "consumer")
        expect(prod_pipe, "READY", time.monotonic() + 30, broker, "producers")
        cpu0 = broker.cpu()
        stats_before = len(stats_lines(broker))
        t0 = time.monotonic()
        prod_pipe.send("GO")
        peak = {"rss_mib": 0.0, "peak_rss_mib": 0.0}
        p = None
        while p is None:
            if time.monotonic() > work_deadline + 5:
                raise ScenarioFailed("producers did not report in time")
            if prod_pipe.poll(0.25):
                _, p = prod_pipe.recv()
            if broker.alive:
                peak = broker.memory_mib()
            elif p is None:
                raise ScenarioFailed(f"broker died (exit code {broker.proc.returncode}): {broker.log_tail()}")
        t_load = time.monotonic() - t0
        r["load_s"] = t_load
        r["producer"] = p
        cons_pipe.send(p.get("receipted", 0))
        c = expect(cons_pipe, "RESULT", work_deadline + 10, broker, "consumer")
        r["consumer"] = c
        r["broker"] = {"cpu_s": broker.cpu() - cpu0, **broker.memory_mib()}
        r["broker"]["peak_rss_mib"] = max(r["broker"]["peak_rss_mib"], peak.get("peak_rss_mib", 0))
        if p.get("error"):
            raise ScenarioFailed(f"producers: {p['error']}")
        if c.get("error"):
            raise ScenarioFailed(f"consumer: {c['error']}")
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
            raise ScenarioFailed(f"consumer got {c['received']:,} of {p['receipted']:,} receipted messages")
        # fsyncs: the store logs its totals every few seconds.  Wait (bounded)
        # for the first line written after the load, and subtract the last
        # line before it (or 0: a fresh store has synced next to nothing).
        load_end_wall = time.time()
        lines_at_end = len(stats_lines(broker))
        wait_until = min(work_deadline, time.monotonic() + args.stats_wait)
        lines = stats_lines(broker)
        while time.monotonic() < wait_until and len(lines) <= lines_at_end and broker.alive:
            time.sleep(0.25)
            lines = stats_lines(broker)
        base = fsyncs(lines[stats_before - 1]) if stats_before else 0
        total = fsyncs(lines[lines_at_end]) if len(lines) > lines_at_end else None
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
        out["first_message_s"], seq = first_message(broker.port, dest, t_exec, min(deadline, t_exec + wait_s))
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
    r.update(fill(broker.port, dest, n, deadline - 30))
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
        raise ScenarioFailed("broker did not exit on SIGTERM in time") from None
    r["sigterm_shutdown_s"] = time.monotonic() - t0
    r["sigterm_exit_code"] = broker.proc.returncode
    _restart_and_measure(broker, dest, n, deadline, "SIGTERM", args.restart_wait, r["restarts"])
    for x in r["restarts"]:
        if x.get("problem"):
            raise ScenarioFailed(f"after {x['after']}: {x['problem']}")
    if r["sigterm_exit_code"] != 0:
        raise ScenarioFailed(f"broker exited with code {r['sigterm_exit_code']} on SIGTERM")


def run_scenario(name: str, args: argparse.Namespace) -> dict:
    r: dict = {"scenario": name, "ok": False, "problems": [], "loadavg_before": loadavg()}
    start = time.monotonic()
    deadline = start + args.timeout
    broker = Broker(args.broker_cmd)
    try:
        (scenario_persistent if name == "persistent" else scenario_restart)(args, broker, r, deadline)
    except ScenarioFailed as exc:
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
