"""examples/hourly_temperature.py end to end, run as the README says: MQTT
devices publish on plant/<device>/temp, the job writes hourly averages per
device to Parquet, and the Parquet holds the right numbers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from tests.support.helpers import wait_for
from tests.support.spark_helpers import USER, archived, read, url

ROOT = Path(__file__).resolve().parents[2]
READINGS = {"1": [20.0, 21.0, 22.5], "2": [18.25, 17.75]}


def test_hourly_temperature_example_writes_averages_per_device(spark, spark_broker, paho, tmp_path):
    broker = spark_broker()
    for device, temps in READINGS.items():
        client = paho(broker, f"sensor-{device}")
        for temp in temps:
            client.publish(f"plant/{device}/temp", str(temp).encode(), qos=1)
        client.publish(f"plant/{device}/temp", b"sensor fault", qos=1)  # not a number: left out
    wait_for(lambda: archived(broker, "plant.*.temp") == 7, timeout=10, what="7 archived readings")
    assert read(spark, broker, "plant.*.temp").count() == 7

    output = tmp_path / "hourly"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, "examples/hourly_temperature.py", "--master", "local[2]", "--url", url(broker),
         "--user", USER[0], "--password", USER[1], "--output", str(output)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]

    table = pq.read_table(output).to_pylist()
    assert {row["device"] for row in table} == set(READINGS)
    assert all(row["hour"].minute == 0 and row["hour"].second == 0 for row in table)
    for device, temps in READINGS.items():
        rows = [row for row in table if row["device"] == device]
        # Usually one hour; two if the test straddles an hour boundary.
        assert sum(row["readings"] for row in rows) == len(temps)
        weighted = sum(row["avg_temp"] * row["readings"] for row in rows) / len(temps)
        assert abs(weighted - sum(temps) / len(temps)) < 1e-9
