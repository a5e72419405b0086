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
import os
import platform
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the checkout, for benchmarks.harness, .load and .scenarios

from benchmarks.harness.broker import default_broker_cmd, loadavg, on_sigterm  # noqa: E402
from benchmarks.harness.report import print_scenario, print_summary  # noqa: E402
from benchmarks.scenarios.persistence import run_scenario  # noqa: E402

SCENARIOS = ("persistent", "restart")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=(*SCENARIOS, "all"), default="all")
    parser.add_argument("--messages", type=int, metavar="N", help="messages for restart (default 1000000)")
    parser.add_argument("--seconds", type=float, default=10.0, metavar="S", help="persistent run length (default 10)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--broker-cmd", default=default_broker_cmd(json_log=True), metavar="CMD",
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
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    names = SCENARIOS if args.scenario == "all" else (args.scenario,)
    print(f"gateway persistence benchmark: {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load average {loadavg()}")
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
