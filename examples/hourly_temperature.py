"""Hourly average temperature per device, from what MQTT devices published on
``plant/<device>/temp`` (a number per message), written to Parquet.

    python examples/hourly_temperature.py --master 'local[2]' --url http://127.0.0.1:8161 \\
        --user viewer --password look --output /tmp/hourly

The broker must archive the topics (a ``[[broker.policies]]`` entry with
``archive = true`` for ``/topic/plant.>``); see README, "Spark".  The output
has one row per device and hour: ``device``, ``hour`` (the hour's start, UTC),
``avg_temp`` and ``readings``.  Bodies that are not numbers are left out.
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gateway.spark import GatewayDataSource


def hourly_averages(readings: DataFrame) -> DataFrame:
    """``readings`` has the gateway source's columns; the result one row per device and hour."""
    parsed = readings.select(
        # plant.<device>.temp: the core name of MQTT's plant/<device>/temp
        F.split("topic", r"\.").getItem(1).alias("device"),
        F.col("timestamp"),
        F.expr("try_cast(cast(body AS string) AS double)").alias("temp"),
    ).where(F.col("temp").isNotNull())
    return (
        parsed.groupBy("device", F.window("timestamp", "1 hour").alias("window"))
        .agg(F.avg("temp").alias("avg_temp"), F.count("temp").alias("readings"))
        .select("device", F.col("window.start").alias("hour"), "avg_temp", "readings")
        .orderBy("device", "hour")
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the broker's admin HTTP base URL, e.g. http://127.0.0.1:8161")
    parser.add_argument("--user", help="an admin user with the browse role (message contents)")
    parser.add_argument("--password", default=os.environ.get("GATEWAY_PASSWORD"), help="default: $GATEWAY_PASSWORD")
    parser.add_argument("--topic", default="plant/+/temp", help="MQTT topic filter (default plant/+/temp)")
    parser.add_argument("--output", required=True, help="Parquet output directory (replaced)")
    parser.add_argument("--master", help="Spark master, e.g. local[2]; leave out under spark-submit")
    parser.add_argument("--partition-size", type=int, default=100_000, help="max messages per Spark partition")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # Spark's Python workers must run this interpreter (it has gateway, pyarrow, pandas).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("hourly-temperature")
    if args.master:
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    try:
        spark.dataSource.register(GatewayDataSource)
        reader = spark.read.format("gateway").option("url", args.url).option("topic", args.topic)
        if args.user is not None:
            reader = reader.option("user", args.user).option("password", args.password or "")
        readings = reader.option("partitionSize", str(args.partition_size)).load()
        hourly_averages(readings).write.mode("overwrite").parquet(args.output)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
