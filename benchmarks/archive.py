"""Topic archive benchmarks against a real broker process.

    .venv/bin/python benchmarks/archive.py [--scenario archive-read|archive-publish|all]
        [--messages N] [--seconds S] [--json FILE] [--timeout S]

(also reachable as ``benchmarks/run.py --scenario archive-read|archive-publish``)

archive-read     fill the archived topic /topic/bench.a with N persistent 128-byte
                 messages (default 1,000,000; pipelined, a receipt every 1000th
                 SEND), then read offsets 0..N over HTTP
                 (GET /api/v1/archive/bench.a/messages) and decode the Arrow IPC
                 stream batch by batch with pyarrow as it arrives.  Reports rows/s
                 and MiB/s of the read, the broker's RSS before and after and its
                 peak, and this reader's peak RSS.  Every offset must come back
                 once, in order, with its 128-byte body.
archive-publish  8 producers x 32 receipted persistent SENDs in flight (the
                 persistent benchmark's producers) for S seconds (default 10)
                 each to: a topic nobody keeps (plain: a receipt comes at once);
                 an archived topic (a journal record per message, the receipt
                 after the batch's fdatasync); a topic with a durable
                 subscriber that ACKs everything (stored, fdatasync); and an
                 archived topic with such a subscriber.  The last two give the
                 cost of archiving on the persistent path.  Reports receipted
                 msgs/s and receipt latency of each.

Each scenario starts its own broker (``gateway serve`` with a config that
archives /topic/bench.a.> and a browse user for the admin API: reading an archive is reading messages), stops it with
SIGTERM, and is bounded by --timeout.
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.client
import io
import json
import os
import platform
import resource
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from benchmarks.harness.broker import (  # noqa: E402
    Broker, ScenarioFailed, default_broker_cmd, free_port, loadavg, on_sigterm)
from benchmarks.load import persistent_load  # noqa: E402  (the producers, the durable subscriber, the fill)
from benchmarks.harness.report import fmt  # noqa: E402

SCENARIOS = ("archive-read", "archive-publish")
ARCHIVED = "/topic/bench.a"
PLAIN = "/topic/bench.plain"
USER = ("bench", "bench")
CONFIG = """
[[broker.policies]]
destination = "/topic/bench.a.>"
archive = true

[admin]
users = [{{ name = "{name}", password_hash = "{hash}", role = "browse" }}]
"""


def _config(tmp: Path) -> Path:
    from gateway.auth import hash_password

    path = tmp / "gateway.toml"
    path.write_text(CONFIG.format(name=USER[0], hash=hash_password(USER[1], iterations=1000)))
    return path


def _broker(args: argparse.Namespace, tmp: Path) -> tuple[Broker, int]:
    admin = free_port()
    template = args.broker_cmd.replace("--admin-port 0", f"--admin-port {admin}") + f" --config {_config(tmp)}"
    return Broker(template), admin


def _read(admin_port: int, topic: str, n: int, deadline: float) -> dict:
    import pyarrow as pa

    conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=max(1.0, deadline - time.monotonic()))
    token = base64.b64encode(f"{USER[0]}:{USER[1]}".encode()).decode()
    t0 = time.monotonic()
    conn.request("GET", f"/api/v1/archive/{topic}/messages?from=0&to={n}", headers={"Authorization": "Basic " + token})
    response = conn.getresponse()
    if response.status != 200:
        raise ScenarioFailed(f"read: HTTP {response.status}: {response.read()[:300]!r}")
    # Buffered: pyarrow reads a message as several small reads; http.client
    # pays per read call when it decodes the chunked encoding.
    reader = pa.ipc.open_stream(io.BufferedReader(response, 1 << 20))  # type: ignore[arg-type]
    rows = 0
    batches = 0
    body_bytes = 0
    expected = 0
    for batch in reader:
        offsets = batch.column("offset")
        if offsets[0].as_py() != expected or offsets[-1].as_py() != expected + batch.num_rows - 1:
            raise ScenarioFailed(f"read: batch {batches} starts at {offsets[0]}, expected {expected}")
        expected += batch.num_rows
        rows += batch.num_rows
        batches += 1
        body_bytes += batch.column("body").nbytes
        if time.monotonic() > deadline:
            raise ScenarioFailed(f"read: timed out after {rows:,} rows")
    elapsed = time.monotonic() - t0
    conn.close()
    if rows != n:
        raise ScenarioFailed(f"read: {rows:,} rows of {n:,}")
    return {"rows": rows, "batches": batches, "read_s": elapsed, "rows_per_s": rows / elapsed,
            "arrow_mib": body_bytes / 2**20, "mib_per_s": body_bytes / 2**20 / elapsed}


def scenario_read(args: argparse.Namespace, broker: Broker, admin: int, r: dict, deadline: float) -> None:
    n = args.messages or 1_000_000
    broker.start(min(deadline, time.monotonic() + 30))
    r.update({"messages": n, "body_bytes": persistent_load.BODY_SIZE})
    r.update(persistent_load.fill(broker.port, ARCHIVED, n, deadline - 60))
    r["broker_before_read"] = broker.memory_mib()
    r.update(_read(admin, ARCHIVED.removeprefix("/topic/"), n, deadline - 10))
    r["broker_after_read"] = broker.memory_mib()
    r["reader_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _publish(args: argparse.Namespace, broker: Broker, dest: str, deadline: float, *, durable: bool) -> dict:
    """The persistent benchmark's producers to ``dest``; with ``durable`` a
    durable subscriber consumes (and ACKs) everything, so each message is stored."""
    children = []
    try:
        if durable:
            cons, cons_pipe = persistent_load.spawn(
                functools.partial(persistent_load.consumer_main, durable=True), broker.port, dest, deadline, 15.0
            )
            children.append(cons)
            persistent_load.expect(cons_pipe, "READY", time.monotonic() + 30, broker, "consumer")
        prod, pipe = persistent_load.spawn(persistent_load.producers_main, broker.port, dest, args.seconds, deadline)
        children.append(prod)
        persistent_load.expect(pipe, "READY", time.monotonic() + 30, broker, "producers")
        pipe.send("GO")
        p = persistent_load.expect(pipe, "RESULT", deadline + 5, broker, "producers")
        if p.get("error"):
            raise ScenarioFailed(f"producers to {dest}: {p['error']}")
        if durable:
            cons_pipe.send(p["receipted"])
            c = persistent_load.expect(cons_pipe, "RESULT", deadline + 10, broker, "consumer")
            if c.get("error") or c["received"] != p["receipted"]:
                raise ScenarioFailed(f"durable subscriber of {dest}: {c.get('error')} ({c['received']:,} received)")
    finally:
        for child in children:
            child.join(2)
            if child.is_alive():
                child.kill()
                child.join(2)
    elapsed = (p["t_last_receipt_ns"] - p["t_first_send_ns"]) / 1e9
    return {"receipted": p["receipted"], "receipted_per_s": p["receipted"] / elapsed, "latency_ms": p["latency_ms"]}


PUBLISH_RUNS = (
    # label, destination, a durable subscriber (so every message is stored)
    ("plain", PLAIN, False),
    ("archived", ARCHIVED, False),
    ("durable", "/topic/bench.d", True),
    ("durable+archived", ARCHIVED + ".d", True),
)


def scenario_publish(args: argparse.Namespace, broker: Broker, admin: int, r: dict, deadline: float) -> None:
    broker.start(min(deadline, time.monotonic() + 30))
    for i, (label, dest, durable) in enumerate(PUBLISH_RUNS):
        left = len(PUBLISH_RUNS) - i
        r[label] = _publish(args, broker, dest, deadline - 30 * left, durable=durable)
    r["broker"] = broker.memory_mib()


def run_scenario(name: str, args: argparse.Namespace, body: Callable[..., None] | None = None) -> dict:
    """Run ``body`` (by default the archive scenario ``name``) against a fresh
    archiving broker, and report what it recorded, or what went wrong."""
    if body is None:
        body = scenario_read if name == "archive-read" else scenario_publish
    r: dict = {"scenario": name, "ok": False, "problems": [], "loadavg_before": loadavg()}
    start = time.monotonic()
    deadline = start + args.timeout
    with tempfile.TemporaryDirectory(prefix="gateway-archive-bench-") as tmp:
        broker, admin = _broker(args, Path(tmp))
        try:
            body(args, broker, admin, r, deadline)
        except ScenarioFailed as exc:
            r["problems"].append(str(exc))
        except Exception as exc:  # a bug in the runner: still clean up and report
            r["problems"].append(f"runner error: {type(exc).__name__}: {exc}")
        finally:
            broker.stop(wait=min(30.0, max(3.0, deadline - time.monotonic())))
            if r["problems"]:
                r["log_tail"] = broker.log_tail()
            broker.cleanup()
    r["ok"] = not r["problems"]
    r["wall_s"] = time.monotonic() - start
    return r


def print_scenario(r: dict) -> None:
    f = fmt
    print(f"\n== {r['scenario']}: {'OK' if r['ok'] else 'FAILED'} ({r['wall_s']:.1f} s)")
    for problem in r["problems"]:
        print(f"   problem: {problem}")
    if r["scenario"] == "archive-read" and "rows_per_s" in r:
        print(f"   fill: {r['messages']:,} x {r['body_bytes']} B persistent SENDs to {ARCHIVED} at "
              f"{f(r['fill_msgs_per_s'])} msgs/s")
        print(f"   read: {r['rows']:,} rows in {r['batches']} batches, {r['read_s']:.2f} s: "
              f"{f(r['rows_per_s'])} rows/s, {r['mib_per_s']:.0f} MiB/s of bodies")
        print(f"   broker RSS: {r['broker_before_read']['rss_mib']:.0f} MiB before the read, "
              f"{r['broker_after_read']['rss_mib']:.0f} MiB after, peak {r['broker_after_read']['peak_rss_mib']:.0f} MiB; "
              f"reader peak RSS {r['reader_peak_rss_mib']:.0f} MiB")
    if r["scenario"] == "archive-publish" and "durable+archived" in r:
        for label, dest, _ in PUBLISH_RUNS:
            x = r[label]
            print(f"   {label:<16} {dest:<18} {f(x['receipted_per_s'])} receipted msgs/s "
                  f"(receipt p50 {x['latency_ms']['p50_ms']:.1f} ms, p99 {x['latency_ms']['p99_ms']:.1f} ms)")
        print(f"   durable+archived / durable: {r['durable+archived']['receipted_per_s'] / r['durable']['receipted_per_s']:.2f}; "
              f"broker RSS {r['broker']['rss_mib']:.0f} MiB")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=(*SCENARIOS, "all"), default="all")
    parser.add_argument("--messages", type=int, metavar="N", help="archive-read: messages (default 1000000)")
    parser.add_argument("--seconds", type=float, default=10.0, metavar="S", help="archive-publish: seconds per run")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--broker-cmd", default=default_broker_cmd(json_log=True), metavar="CMD",
                        help="broker command; {port} and {data_dir} are substituted (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S", help="hard limit per scenario (default 600)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    names = SCENARIOS if args.scenario == "all" else (args.scenario,)
    print(f"gateway archive benchmark: {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load average {loadavg()}")
    results = []
    for name in names:
        results.append(run_scenario(name, args))
        print_scenario(results[-1])
        sys.stdout.flush()
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results}, indent=2, default=str) + "\n")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
