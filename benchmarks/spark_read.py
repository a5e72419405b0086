"""Spark batch-read benchmark: the gateway data source into a Spark count.

    .venv/bin/python benchmarks/spark_read.py [--messages N] [--partitions 1,2,4]
        [--master local[4]] [--repeat R] [--json FILE] [--timeout S]

(also reachable as ``benchmarks/run.py --scenario spark-read``)

Starts a broker (``gateway serve``, the archive benchmark's config: /topic/bench.a
archived, a read user), fills /topic/bench.a with N persistent 128-byte
messages (default 1,000,000; benchmarks/persistent.py's pipelined fill), then
in a local Spark session runs

    spark.read.format("gateway").option("topic", "bench.a")
         .option("partitionSize", ceil(N / P)).load().count()

for each partition count P (default 1, 2 and 4), R times each (default 2; the
best and the median are reported, after an untimed read that starts the
Python workers), with the broker's CPU seconds per row (median), and
with ``--group-by`` also ``groupBy("topic", "priority").count()``.  Every count must equal N.  Reports rows/s per P, the broker's RSS,
and the peak RSS of the Spark JVM with its Python workers.  The bar (issue 7):
at least 200,000 rows/s on this machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import archive  # noqa: E402  (the archiving broker and its read user)
from benchmarks.harness.broker import (  # noqa: E402
    Broker, ScenarioFailed, default_broker_cmd, loadavg, memory_kb, on_sigterm, proc_tree)
from benchmarks.load.persistent_load import BODY_SIZE, fill  # noqa: E402
from benchmarks.harness.report import fmt  # noqa: E402

BAR_ROWS_PER_S = 200_000


def _tree_rss_mib(root: int) -> float:
    """RSS of a process and all its descendants (the JVM and its Python workers)."""
    return sum(memory_kb(pid)["VmRSS"] for pid in proc_tree(root)) / 1024


def spark_session(master: str):  # -> SparkSession
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from gateway.spark import GatewayDataSource

    spark = (
        SparkSession.builder.master(master).appName("gateway-spark-read-bench")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(GatewayDataSource)
    return spark


def scenario(args: argparse.Namespace, broker: Broker, admin: int, r: dict, deadline: float) -> None:
    n = args.messages
    broker.start(min(deadline, time.monotonic() + 30))
    r.update({"messages": n, "body_bytes": BODY_SIZE})
    r.update(fill(broker.port, archive.ARCHIVED, n, deadline - 120))
    spark = spark_session(args.master)
    jvm = spark.sparkContext._gateway.proc.pid  # the JVM pyspark launched
    r["master"] = args.master
    r["runs"] = {}
    r["spark_peak_rss_mib"] = 0.0
    try:
        # Warm up (not timed): the first read of a session starts the Python workers.
        (spark.read.format("gateway").option("url", f"http://127.0.0.1:{admin}").option("user", archive.USER[0])
         .option("password", archive.USER[1]).option("topic", archive.ARCHIVED.removeprefix("/topic/"))
         .option("endingOffsets", json.dumps({archive.ARCHIVED.removeprefix("/topic/"): 1000})).load().count())
        for p in args.partitions:
            df = (
                spark.read.format("gateway").option("url", f"http://127.0.0.1:{admin}")
                .option("user", archive.USER[0]).option("password", archive.USER[1])
                .option("topic", archive.ARCHIVED.removeprefix("/topic/"))
                .option("partitionSize", str(math.ceil(n / p))).load()
            )
            times, cpu_us, group_times = [], [], []
            for _ in range(args.repeat):
                if time.monotonic() > deadline - 30:
                    raise ScenarioFailed(f"timed out before the {p}-partition runs finished")
                c0, t0 = broker.cpu(), time.monotonic()
                count = df.count()
                times.append(time.monotonic() - t0)
                cpu_us.append((broker.cpu() - c0) / n * 1e6)
                r["spark_peak_rss_mib"] = max(r["spark_peak_rss_mib"], _tree_rss_mib(jvm))
                if count != n:
                    raise ScenarioFailed(f"{p} partitions: count() = {count:,}, expected {n:,}")
                if args.group_by:  # a query that reads every column Spark shuffles on: priority per topic
                    t0 = time.monotonic()
                    groups = df.groupBy("topic", "priority").count().collect()
                    group_times.append(time.monotonic() - t0)
                    if sum(row["count"] for row in groups) != n:
                        raise ScenarioFailed(f"{p} partitions: groupBy counted {sum(row['count'] for row in groups):,}, expected {n:,}")
            best = min(times)
            r["runs"][p] = {"seconds": times, "rows_per_s": n / best, "median_rows_per_s": n / statistics.median(times),
                            "broker_cpu_us_per_row": statistics.median(cpu_us)}
            if group_times:
                r["runs"][p]["group_by_median_rows_per_s"] = n / statistics.median(group_times)
        r["broker_after"] = broker.memory_mib()
    finally:
        spark.stop()


def run_scenario(args: argparse.Namespace) -> dict:
    return archive.run_scenario("spark-read", args, scenario)


def print_scenario(r: dict) -> None:
    f = fmt
    print(f"\n== spark-read: {'OK' if r['ok'] else 'FAILED'} ({r['wall_s']:.1f} s)")
    for problem in r["problems"]:
        print(f"   problem: {problem}")
    if "fill_msgs_per_s" in r:
        print(f"   fill: {r['messages']:,} x {r['body_bytes']} B persistent SENDs to {archive.ARCHIVED} at "
              f"{f(r['fill_msgs_per_s'])} msgs/s")
    for p, run in r.get("runs", {}).items():
        verdict = "meets" if run["rows_per_s"] >= BAR_ROWS_PER_S else "BELOW"
        seconds = ", ".join(f"{s:.2f}" for s in run["seconds"])
        print(f"   {p} partition(s), master {r['master']}: {f(run['rows_per_s'])} rows/s into count() "
              f"(runs {seconds} s; {verdict} the {BAR_ROWS_PER_S:,} rows/s bar)")
        if "median_rows_per_s" in run:
            group = (f"; groupBy(topic, priority).count() median {f(run['group_by_median_rows_per_s'])} rows/s"
                     if "group_by_median_rows_per_s" in run else "")
            print(f"      median {f(run['median_rows_per_s'])} rows/s; broker CPU median "
                  f"{run['broker_cpu_us_per_row']:.2f} us/row{group}")
    if "broker_after" in r:
        print(f"   broker RSS {r['broker_after']['rss_mib']:.0f} MiB (peak {r['broker_after']['peak_rss_mib']:.0f} MiB); "
              f"Spark JVM + Python workers peak RSS {r['spark_peak_rss_mib']:.0f} MiB")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=("spark-read",), default="spark-read")
    parser.add_argument("--messages", type=int, default=1_000_000, metavar="N", help="archived messages (default 1000000)")
    parser.add_argument("--partitions", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4], metavar="P,P",
                        help="partition counts to run (default 1,2,4)")
    parser.add_argument("--master", default="local[4]", help="Spark master (default local[4]: four tasks at once)")
    parser.add_argument("--repeat", type=int, default=2, metavar="R", help="counts per partition count (default 2)")
    parser.add_argument("--group-by", action="store_true", help="also time groupBy(topic, priority).count() each run")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--broker-cmd", default=default_broker_cmd(json_log=True), metavar="CMD",
                        help="broker command; {port} and {data_dir} are substituted (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=900.0, metavar="S", help="hard limit (default 900)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    print(f"gateway spark-read benchmark: {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load average {loadavg()}")
    result = run_scenario(args)
    print_scenario(result)
    if args.json:
        Path(args.json).write_text(json.dumps({"results": [result]}, indent=2, default=str) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
