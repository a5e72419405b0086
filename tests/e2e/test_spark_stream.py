"""Streaming reads through Spark: micro-batches whose offsets live in Spark's
checkpoint, so a query stopped and restarted from it delivers every message to
the sink exactly once; and what a read of offsets retention dropped does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from persistence.settings import StoreSettings
from tests.support.helpers import wait_for
from tests.support.spark_helpers import archived, read, stream


def run_until_idle(df: Any, sink: Path, checkpoint: Path, **writer_options: Any) -> Any:
    """One run of a query into a Parquet sink (Spark's exactly-once file sink):
    start it, let it process everything available, stop it."""
    writer = df.writeStream.format("parquet").option("path", str(sink)).option("checkpointLocation", str(checkpoint))
    query = writer.start()
    try:
        query.processAllAvailable()
        return query.recentProgress
    finally:
        query.stop()


def test_a_query_restarted_from_its_checkpoint_delivers_every_message_exactly_once(spark, spark_broker, stomp_client, paho, tmp_path):
    broker = spark_broker()
    producer = stomp_client(broker)
    device = paho(broker, "dev-s")
    for i in range(5):
        producer.send("/topic/plant.1.temp", f"a{i}".encode(), receipt=(i == 4))
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    df = stream(spark, broker, "plant/+/temp", startingOffsets="earliest").select("topic", "offset", "body")

    run_until_idle(df, sink, checkpoint)
    assert sorted(r.offset for r in spark.read.parquet(str(sink)).collect()) == [0, 1, 2, 3, 4]

    # While the query is down: more on the same topic, and a topic it has not seen.
    for i in range(5, 8):
        producer.send("/topic/plant.1.temp", f"a{i}".encode(), receipt=(i == 7))
    device.publish("plant/2/temp", b"b0", qos=1)
    wait_for(lambda: archived(broker, "plant.2.temp") == 1, timeout=10, what="plant/2/temp archived")

    run_until_idle(df, sink, checkpoint)
    rows = sorted((r.topic, r.offset, bytes(r.body)) for r in spark.read.parquet(str(sink)).collect())
    assert rows == [("plant.1.temp", i, f"a{i}".encode()) for i in range(8)] + [("plant.2.temp", 0, b"b0")]
    last = max((checkpoint / "offsets").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    offsets = json.loads(last.read_text().splitlines()[-1])
    assert offsets == {"plant.1.temp": 8, "plant.2.temp": 1}


def test_a_new_query_starts_at_latest_and_max_offsets_per_trigger_bounds_each_batch(spark, spark_broker, stomp_client, tmp_path):
    broker = spark_broker()
    producer = stomp_client(broker)
    producer.send("/topic/plant.old.temp", b"before")
    query = (
        stream(spark, broker, "plant.>", maxOffsetsPerTrigger=4)
        .writeStream.format("memory").queryName("bounded").start()
    )
    try:
        query.processAllAvailable()  # the first batch fixes where the query starts: latest
        for i in range(10):
            producer.send("/topic/plant.old.temp", f"n{i}".encode(), receipt=(i == 9))
        wait_for(lambda: spark.sql("select count(*) from bounded").first()[0] == 10, timeout=60, what="10 rows")
        query.processAllAvailable()
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert sorted(bytes(r.body) for r in spark.sql("select body from bounded").collect()) == [f"n{i}".encode() for i in range(10)]
    assert max(sizes) <= 4 and sum(sizes) == 10


def dropping_broker(spark_broker: Any) -> Any:
    policies = [{"destination": "/topic/plant.>", "archive": True, "archive_retention_bytes": 4096}]
    return spark_broker(policies, store=StoreSettings(archive_segment_bytes=1024, maintenance_interval_s=0.05))


def test_retention_drops_old_offsets_and_a_read_of_them_fails_with_the_brokers_reason(spark, spark_broker, stomp_client):
    broker = dropping_broker(spark_broker)
    producer = stomp_client(broker)
    for i in range(100):
        producer.send("/topic/plant.kept", b"x" * 100, receipt=(i == 99))
    # While retention is still trimming, a read planned from the earliest offset can find it
    # gone by the time it runs: the wait reads past that, the assertions below read after it.
    earliest = wait_for(lambda: read(spark, broker, "plant.kept", failOnDataLoss="false").agg({"offset": "min"}).first()[0] or 0,
                        timeout=10, what="retention")

    everything = read(spark, broker, "plant.kept")  # earliest: what is left
    assert sorted(r.offset for r in everything.select("offset").collect()) == list(range(earliest, 100))

    reason = f"offsets 0..{earliest - 1} of plant.kept were dropped by retention; earliest is {earliest}"
    with pytest.raises(Exception, match="410") as failed:
        read(spark, broker, "plant.kept", startingOffsets='{"plant.kept": 0}').collect()
    assert reason in str(failed.value)
    assert "set the option failOnDataLoss to false" in str(failed.value)  # as Kafka's says what to do

    skipped = read(spark, broker, "plant.kept", startingOffsets='{"plant.kept": 0}', failOnDataLoss="false", partitionSize=10)
    assert sorted(r.offset for r in skipped.select("offset").collect()) == list(range(earliest, 100))


def test_trigger_available_now_reads_what_was_there_in_bounded_batches_and_stops(spark, spark_broker, stomp_client):
    broker = spark_broker()
    producer = stomp_client(broker)
    for i in range(5):
        producer.send("/topic/plant.now.temp", f"n{i}".encode(), receipt=(i == 4))
    query = (
        stream(spark, broker, "plant.now.temp", startingOffsets="earliest", maxOffsetsPerTrigger=2)
        .writeStream.format("memory").queryName("available_now").trigger(availableNow=True).start()
    )
    assert query.awaitTermination(120), "an AvailableNow query stops by itself"
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sorted(bytes(r.body) for r in spark.sql("select body from available_now").collect()) == [f"n{i}".encode() for i in range(5)]
    assert sizes == [2, 2, 1]
