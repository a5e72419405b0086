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
    .venv/bin/python benchmarks/run.py --scenario failover [...]
        (high availability: a real ZooKeeper and 3 [ha] nodes, the primary
        SIGKILLed round after round under receipted load: runs
        benchmarks/failover.py with the same arguments; see its --help)

Each scenario starts a fresh broker (``gateway serve``) on a free 127.0.0.1 port
with a temporary data dir, runs the load generator (``load/loadgen.py``) in separate
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
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the checkout, for benchmarks.harness, .load and .scenarios

from benchmarks.harness.broker import default_broker_cmd, loadavg, on_sigterm  # noqa: E402
from benchmarks.harness.report import print_scenario, print_summary  # noqa: E402
from benchmarks.scenarios.throughput import Scenario  # noqa: E402

SCENARIOS = ("queue", "topic", "latency")
PERSISTENCE_SCENARIOS = ("persistent", "restart")  # in persistent.py, not part of "all"
ARCHIVE_SCENARIOS = ("archive-read", "archive-publish")  # in archive.py, not part of "all"
SPARK_SCENARIOS = ("spark-read",)  # in spark_read.py, not part of "all"
MQTT_SCENARIOS = ("mqtt-qos0", "mqtt-qos1", "mqtt-fanout", "mqtt-latency", "mqtt-idle", "mqtt-all")  # in mqtt.py, not part of "all"
TRANSPORT_SCENARIOS = ("transports",)  # in transports.py (TCP vs WebSocket), not part of "all"
FAILOVER_SCENARIOS = ("failover",)  # in failover.py (ZooKeeper + 3 HA nodes, SIGKILLed primaries), not part of "all"
# Scenario -> the module of benchmarks/ that runs it.
DELEGATES = {
    **dict.fromkeys(PERSISTENCE_SCENARIOS, "persistent"),
    **dict.fromkeys(ARCHIVE_SCENARIOS, "archive"),
    **dict.fromkeys(SPARK_SCENARIOS, "spark_read"),
    **dict.fromkeys(MQTT_SCENARIOS, "mqtt"),
    **dict.fromkeys(TRANSPORT_SCENARIOS, "transports"),
    **dict.fromkeys(FAILOVER_SCENARIOS, "failover"),
}


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
    parser.add_argument("--broker-cmd", default=default_broker_cmd(), metavar="CMD",
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--scenario")
    delegate = DELEGATES.get(pre.parse_known_args(argv)[0].scenario)
    if delegate is not None:  # a scenario another module of benchmarks/ runs with these arguments
        sys.path.insert(0, str(HERE))
        return importlib.import_module(delegate).main(argv)
    args = _parse(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    names = SCENARIOS if args.scenario == "all" else (args.scenario,)
    print(f"gateway benchmark: {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load average {loadavg()}")
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
