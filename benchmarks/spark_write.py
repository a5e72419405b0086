"""Spark batch-write benchmark: a DataFrame written as messages through the
gateway data source (one STOMP transaction per partition).

    .venv/bin/python benchmarks/spark_write.py [--rows N] [--partitions 1,2] [--master local[2]] [--repeat R]

Starts a broker (``gateway serve`` on free loopback ports, a temporary data
folder), then for each partition count P writes N rows of a 128-byte binary
``body`` to ``/queue/bench.write`` with ``mode("append")``, R times (the best
is reported), and checks that the queue grew by N each time (through the
admin API).  Reports rows/s per P and the broker's RSS.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from broker_process import free_port, memory_kb  # noqa: E402
from spark_read import spark_session  # noqa: E402

from gateway.auth import hash_password  # noqa: E402

QUEUE = "/queue/bench.write"
ADMIN = ("bench", "bench")


def _depth(admin_port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=10)
    token = base64.b64encode(f"{ADMIN[0]}:{ADMIN[1]}".encode()).decode()
    try:
        conn.request("GET", "/api/v1/destinations/queue/bench.write", headers={"Authorization": f"Basic {token}"})
        response = conn.getresponse()
        body = response.read()
        return 0 if response.status == 404 else json.loads(body)["depth"]
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--partitions", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"gateway spark-write benchmark: {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, {args.rows:,} rows x 128 B, master {args.master}")
    stomp_port, mqtt_port, admin_port = free_port(), free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="gateway-spark-write-") as tmp:
        config = Path(tmp) / "gateway.toml"
        config.write_text(
            f'[admin]\nusers = [{{name = "{ADMIN[0]}", password_hash = "{hash_password(ADMIN[1], iterations=1000)}", role = "read"}}]\n'
            "[broker]\nqueue_high_water = 0\n"
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
                    _depth(admin_port)
                    break
                except OSError:
                    time.sleep(0.02)
            spark = spark_session(args.master)
            try:
                expected = _depth(admin_port)
                for p in args.partitions:
                    df = spark.range(args.rows, numPartitions=p).selectExpr("cast(repeat('x', 128) as binary) as body")
                    best = None
                    for _ in range(args.repeat):
                        t0 = time.monotonic()
                        (df.write.format("gateway").mode("append").option("stomp", f"127.0.0.1:{stomp_port}")
                         .option("destination", QUEUE).save())
                        elapsed = time.monotonic() - t0
                        expected += args.rows
                        depth = _depth(admin_port)
                        if depth != expected:
                            print(f"   FAILED: the queue holds {depth:,}, expected {expected:,}")
                            return 1
                        best = elapsed if best is None else min(best, elapsed)
                    assert best is not None
                    print(f"   {p} partition(s): {args.rows / best:,.0f} rows/s written and committed (best of {args.repeat})")
                print(f"   broker RSS {memory_kb(broker.pid)['VmRSS'] / 1024:.0f} MiB holding {expected:,} messages")
            finally:
                spark.stop()
        finally:
            broker.terminate()
            broker.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
