"""Spark batch-write benchmark: a DataFrame written as messages through the
gateway data source (one STOMP transaction per partition, at these sizes).

    .venv/bin/python benchmarks/spark_write.py [--rows N] [--partitions 1,2] [--master local[2]] [--repeat R]
        [--destinations /queue/bench.write,/topic/bench.write]

Starts a broker (``gateway serve`` on free loopback ports, a temporary data
folder, ``queue_high_water = 0`` so flow control never holds the writer, and
/topic/bench.> archived so what a topic got can be counted), then for each
destination and partition count P writes N rows of a 128-byte binary ``body``
with ``mode("append")``, R times, and checks that the queue (or the topic's
archive) grew by N each time (through the admin API).  Reports, per
destination and P, the median over the R runs of rows/s (wall time of
``save()``) of the broker's CPU seconds per row (its utime + stime over the run, from
/proc) and of Spark's (the JVM and its Python workers), and the broker's RSS.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from benchmarks.harness.broker import cpu_seconds, free_port, loadavg, memory_kb, proc_tree  # noqa: E402
from spark_read import spark_session  # noqa: E402

from gateway.auth import hash_password  # noqa: E402

QUEUE = "/queue/bench.write"
TOPIC = "/topic/bench.write"
ADMIN = ("bench", "bench")


def _get(admin_port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=10)
    token = base64.b64encode(f"{ADMIN[0]}:{ADMIN[1]}".encode()).decode()
    try:
        conn.request("GET", path, headers={"Authorization": f"Basic {token}"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _count(admin_port: int, destination: str) -> int:
    """Messages in a queue, or in a topic's archive."""
    if destination.startswith("/topic/"):
        status, body = _get(admin_port, "/api/v1/archive/" + destination.removeprefix("/topic/"))
        return 0 if status == 404 else json.loads(body)["messages"]
    status, body = _get(admin_port, "/api/v1/destinations/" + destination.removeprefix("/").replace("/", "%2F"))
    return 0 if status == 404 else json.loads(body)["depth"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--partitions", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--destinations", type=lambda s: s.split(","), default=[QUEUE, TOPIC])
    args = parser.parse_args(argv)
    print(f"gateway spark-write benchmark: {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, {args.rows:,} rows x 128 B, master {args.master}, load average {loadavg()}")
    stomp_port, mqtt_port, admin_port = free_port(), free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="gateway-spark-write-") as tmp:
        config = Path(tmp) / "gateway.toml"
        config.write_text(
            f'[admin]\nusers = [{{name = "{ADMIN[0]}", password_hash = "{hash_password(ADMIN[1], iterations=1000)}", role = "read"}}]\n'
            '[broker]\nqueue_high_water = 0\n[[broker.policies]]\ndestination = "/topic/bench.>"\narchive = true\n'
        )
        gateway = Path(sys.executable).parent / "gateway"
        broker = subprocess.Popen(
            [str(gateway), "serve", "--config", str(config), "--stomp-port", str(stomp_port), "--mqtt-port", str(mqtt_port),
             "--admin-port", str(admin_port), "--data-dir", str(Path(tmp) / "data"), "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(500):  # bounded wait for the admin port
                try:
                    _count(admin_port, QUEUE)
                    break
                except OSError:
                    time.sleep(0.02)
            spark = spark_session(args.master)
            jvm = spark.sparkContext._gateway.proc.pid  # the JVM pyspark launched; its Python workers are its children
            try:
                # Warm up: the first write of a session starts the Python workers.
                spark.range(1000, numPartitions=max(args.partitions)).selectExpr("cast(id as string) as body").write.format(
                    "gateway").mode("append").option("stomp", f"127.0.0.1:{stomp_port}").option("destination", "/queue/warm.up").save()
                total = 0
                for destination in args.destinations:
                    expected = _count(admin_port, destination)
                    for p in args.partitions:
                        df = spark.range(args.rows, numPartitions=p).selectExpr("cast(repeat('x', 128) as binary) as body")
                        rates, cpu_us, spark_us = [], [], []
                        for _ in range(args.repeat):
                            s0 = sum(cpu_seconds(pid) for pid in proc_tree(jvm))
                            c0, t0 = cpu_seconds(broker.pid), time.monotonic()
                            (df.write.format("gateway").mode("append").option("stomp", f"127.0.0.1:{stomp_port}")
                             .option("destination", destination).save())
                            elapsed, cpu = time.monotonic() - t0, cpu_seconds(broker.pid) - c0
                            spark_us.append((sum(cpu_seconds(pid) for pid in proc_tree(jvm)) - s0) / args.rows * 1e6)
                            expected += args.rows
                            got = _count(admin_port, destination)
                            if got != expected:
                                print(f"   FAILED: {destination} holds {got:,}, expected {expected:,}")
                                return 1
                            rates.append(args.rows / elapsed)
                            cpu_us.append(cpu / args.rows * 1e6)
                        total += args.rows * args.repeat
                        print(f"   {destination}, {p} partition(s): median {statistics.median(rates):,.0f} rows/s "
                              f"(runs {', '.join(f'{r:,.0f}' for r in rates)}); broker CPU median "
                              f"{statistics.median(cpu_us):.1f} us/row (runs {', '.join(f'{c:.1f}' for c in cpu_us)}); "
                              f"Spark (JVM + Python workers) CPU median {statistics.median(spark_us):.1f} us/row")
                print(f"   broker RSS {memory_kb(broker.pid)['VmRSS'] / 1024:.0f} MiB after {total:,} messages; "
                      f"load average {loadavg()}")
            finally:
                spark.stop()
        finally:
            broker.terminate()
            broker.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
