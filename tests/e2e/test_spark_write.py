"""Writes through Spark: one STOMP message per row, a partition in as many
transactions as the broker's limits need, each committed with a receipt; a
failed task sends nothing half; what was committed is reported as committed
even when the queue then holds the writer back; a streaming batch Spark
replays under the same batch id, or a batch job rerun with its writeId, is not
sent twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.auth import hash_password
from tests.support.helpers import unique, wait_for
from tests.support.spark_helpers import USER, depth, stream, url


def writer(df: Any, broker: Any, destination: str) -> Any:
    return (
        df.write.format("gateway").mode("append")
        .option("url", url(broker)).option("stomp", f"127.0.0.1:{broker.stomp_port}")
        .option("user", USER[0]).option("password", USER[1]).option("destination", destination)
    )


def test_every_row_becomes_one_message_with_its_headers_priority_and_persistence(spark, spark_broker, stomp_client):
    broker = spark_broker()
    queue = f"/queue/{unique('out')}"
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    rows = [(f"m{i}".encode(), {"device": str(i % 3)}, i % 10, i % 2 == 0) for i in range(40)]
    df = spark.createDataFrame(rows, "body binary, headers map<string,string>, priority int, persistent boolean").repartition(3)

    writer(df, broker, queue).save()

    got = consumer.wait_messages(40)
    assert len(got) == 40
    by_body = {m.body: m.headers for m in got}
    assert sorted(by_body) == sorted(r[0] for r in rows)
    for body, headers, priority, persistent in rows:
        received = by_body[body]
        assert received["device"] == headers["device"]
        assert received["priority"] == str(priority)
        assert received.get("persistent", "false") == ("true" if persistent else "false")
    consumer.barrier()
    assert len(consumer.messages) == 40  # and nothing more


def test_string_bodies_are_sent_as_utf8_and_stomp_alone_needs_no_url(spark, broker, stomp_client):
    queue = f"/queue/{unique('plain')}"
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    df = spark.createDataFrame([("héllo",), ("wörld",)], "body string")
    (
        df.write.format("gateway").mode("append").option("stomp", f"localhost:{broker.stomp_port}")
        .option("destination", queue).save()
    )
    assert sorted(m.body for m in consumer.wait_messages(2)) == sorted(["héllo".encode(), "wörld".encode()])


def test_a_failed_task_leaves_nothing_half_sent(spark, spark_broker, stomp_client):
    broker = spark_broker()
    queue = f"/queue/{unique('atomic')}"
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    # One partition: 30 good rows, then one the writer refuses mid-transaction.
    rows = [(f"ok{i}".encode(), 4) for i in range(30)] + [(b"bad", 12)]
    df = spark.createDataFrame(rows, "body binary, priority int").coalesce(1)
    with pytest.raises(Exception, match="priority must be 0 to 9"):
        writer(df, broker, queue).save()
    consumer.barrier()
    assert consumer.messages == []
    # The broker is fine, and the same write without the bad row goes through whole.
    writer(df.where("priority < 10"), broker, queue).save()
    assert len(consumer.wait_messages(30)) == 30


@pytest.mark.parametrize(
    ("schema", "options", "message"),
    [
        ("value string", {}, "needs a body column"),
        ("body binary, colour string", {}, "column 'colour' cannot be written"),
        ("body binary, priority string", {}, "column 'priority' has type string"),
        ("body binary", {"destination": "/queue/a.*"}, "is a pattern"),
        ("body binary", {"destination": "orders"}, "destination must start with"),
        ("body binary", {"stomp": "nohost"}, "option stomp must be host:port"),
        ("body binary", {"topic": "x"}, "unknown option"),
    ],
)
def test_a_dataframe_or_options_the_sink_cannot_take_fail_before_any_task(spark, spark_broker, schema, options, message):
    broker = spark_broker()
    df = spark.createDataFrame([], schema)
    w = writer(df, broker, "/queue/never")
    for key, value in options.items():
        w = w.option(key, value)
    with pytest.raises(Exception, match=message):
        w.save()


def test_overwrite_is_refused_since_a_destination_cannot_be_overwritten(spark, spark_broker):
    broker = spark_broker()
    df = spark.createDataFrame([(b"x",)], "body binary")
    with pytest.raises(Exception, match="cannot be overwritten"):
        writer(df, broker, "/queue/never").mode("overwrite").save()


def test_a_replayed_micro_batch_is_not_sent_twice(spark, spark_broker, stomp_client, tmp_path: Path):
    broker = spark_broker()
    queue = f"/queue/{unique('stream-out')}"
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    producer = stomp_client(broker)
    for i in range(6):
        producer.send("/topic/plant.w.temp", f"r{i}".encode(), receipt=(i == 5))
    checkpoint = tmp_path / "checkpoint"

    def run() -> None:
        df = stream(spark, broker, "plant.w.temp", startingOffsets="earliest", maxOffsetsPerTrigger=3).select("body")
        query = (
            df.writeStream.format("gateway").option("checkpointLocation", str(checkpoint))
            .option("stomp", f"127.0.0.1:{broker.stomp_port}").option("user", USER[0]).option("password", USER[1])
            .option("destination", queue).start()
        )
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    run()
    assert sorted(m.body for m in consumer.wait_messages(6)) == [f"r{i}".encode() for i in range(6)]
    # As if Spark died after sending batch 1 but before recording it as done:
    # the restarted query runs batch 1 again, with the same batch id.
    for name in ("1", ".1.crc"):  # the commit record and Hadoop's checksum of it
        (checkpoint / "commits" / name).unlink(missing_ok=name.startswith("."))
    run()
    producer.send("/topic/plant.w.temp", b"r6")
    run()
    consumer.wait_messages(7)
    consumer.barrier()
    assert sorted(m.body for m in consumer.messages) == [f"r{i}".encode() for i in range(7)]


@pytest.mark.parametrize("body_bytes", [8, 40_000], ids=["refused-at-commit", "refused-mid-stream"])
def test_a_partition_the_broker_refuses_fails_with_the_brokers_reason_and_sends_nothing(spark, spark_broker, stomp_client, body_bytes):
    broker = spark_broker(broker={"max_transaction_messages": 10})
    queue = f"/queue/{unique('too-big')}"
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    # 30 rows, 10 allowed: with large bodies the writer is still streaming when the ERROR comes.
    df = spark.createDataFrame([(f"b{i}".encode().ljust(body_bytes, b"."),) for i in range(30)], "body binary").coalesce(1)
    with pytest.raises(Exception, match="too many frames"):
        writer(df, broker, queue).save()
    consumer.barrier()
    assert consumer.messages == []


def test_a_write_that_fills_an_idle_queue_past_its_high_water_mark_is_reported_as_committed(spark, spark_broker):
    # The case, scaled down: two partitions, each one transaction that
    # takes a queue nobody consumes past queue_high_water.  Each COMMIT's
    # receipt makes its task succeed; the DISCONNECT after it is answered
    # although the broker now holds the writer back.
    broker = spark_broker(broker={"queue_high_water": 1000})
    queue = f"/queue/{unique('idle')}"
    df = spark.range(2400, numPartitions=2).selectExpr("cast(id as string) as body")
    writer(df, broker, queue).option("timeout", "5").save()
    assert depth(broker, queue) == 2400
    wait_for(lambda: broker.call(lambda: len(broker.running.server.connections)) == 0, what="the writers' connections closed")


def test_a_partition_larger_than_a_transaction_is_sent_in_several_each_once(spark, spark_broker, stomp_client):
    broker = spark_broker(broker={"max_transaction_messages": 100})
    queue = f"/queue/{unique('split')}"
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    df = spark.range(250, numPartitions=1).selectExpr("cast(id as string) as body")
    writer(df, broker, queue).option("transactionRows", "100").save()
    consumer.wait_messages(250)
    # The same by bytes: 50 rows of 1,000 bytes in transactions of at most 10,000.
    wide = spark.range(250, 300, numPartitions=1).selectExpr("rpad(cast(id as string), 1000, '.') as body")
    writer(wide, broker, queue).option("transactionBytes", "10000").save()
    consumer.wait_messages(300)
    consumer.barrier()
    assert sorted(int(m.body.rstrip(b".")) for m in consumer.messages) == list(range(300))


def test_a_writer_held_by_a_full_idle_queue_names_the_queue_and_its_limit_and_a_rerun_with_its_write_id_lands_once(spark, spark_broker, stomp_client):
    broker = spark_broker(broker={"queue_high_water": 100})
    queue = f"/queue/{unique('held')}"
    df = spark.range(300, numPartitions=1).selectExpr("cast(id as string) as body")
    job = writer(df, broker, queue).option("transactionRows", "100").option("timeout", "3").option("writeId", "nightly-2026-11-27")
    # The first transaction fills the queue (nobody consumes): the writer is
    # held, and says by which queue, at which limit, and what stays sent.
    with pytest.raises(Exception, match=rf"{queue} \(high-water mark 100 messages\)") as failed:
        job.save()
    assert "100 rows in 1 transaction(s) were committed" in str(failed.value)
    assert "the transaction in flight may still be committed" in str(failed.value)
    assert depth(broker, queue) == 100
    # A consumer drains it, and the job is run again as it was: the committed
    # transaction is dropped as a duplicate, the rest is sent.
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    job.save()
    consumer.wait_messages(300)
    consumer.barrier()
    assert sorted(int(m.body) for m in consumer.messages) == list(range(300))


def test_a_batch_job_rerun_with_the_same_write_id_lands_once(spark, spark_broker, stomp_client, tmp_path: Path):
    broker = spark_broker()
    queue = f"/queue/{unique('rerun')}"
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    df = spark.range(500, numPartitions=3).selectExpr("cast(id as string) as body")
    writer(df, broker, queue).option("writeId", "job-7").save()
    writer(df, broker, queue).option("writeId", "job-7").save()  # as a user rerunning a job that "failed"
    consumer.wait_messages(500)
    consumer.barrier()
    assert sorted(int(m.body) for m in consumer.messages) == list(range(500))
    # Without a writeId each save() is a new job: the same rows are sent again.
    writer(df, broker, queue).save()
    consumer.wait_messages(1000)
    query = stream(spark, broker, "plant.x.temp").select("body").writeStream.format("gateway").option(
        "stomp", f"127.0.0.1:{broker.stomp_port}").option("destination", queue).option("writeId", "w").option(
        "checkpointLocation", str(tmp_path / "checkpoint")).start()
    try:
        with pytest.raises(Exception, match="writeId is for batch writes"):
            query.processAllAvailable()
    finally:
        query.stop()


def test_a_writer_held_by_a_full_queue_waits_while_a_consumer_drains_it_and_completes(spark, spark_broker, stomp_client):
    import threading

    broker = spark_broker(broker={"queue_high_water": 100})
    queue = f"/queue/{unique('drained')}"
    consumer = stomp_client(broker)
    held: list[int] = []

    def drain_once_held() -> None:
        # Only once the writer is held at the high-water mark does a consumer come.
        wait_for(lambda: depth(broker, queue) >= 100, timeout=60, what="the queue filled")
        held.append(depth(broker, queue))
        consumer.subscribe(queue)

    drainer = threading.Thread(target=drain_once_held)
    drainer.start()
    try:
        # Spark's own thread: a data source is found through the session of the calling thread.
        df = spark.range(500, numPartitions=1).selectExpr("cast(id as string) as body")
        writer(df, broker, queue).option("transactionRows", "100").option("timeout", "20").save()
    finally:
        drainer.join(60)
    assert held and held[0] <= 200  # it waited at the mark (one transaction may land past it)
    consumer.wait_messages(500)
    consumer.barrier()
    assert sorted(int(m.body) for m in consumer.messages) == list(range(500))


def test_a_partition_past_the_brokers_default_transaction_limit_is_written_whole(spark, spark_broker):
    # The case with the defaults: 120,000 rows in one partition, where
    # one transaction may hold 100,000 (max_transaction_messages).
    broker = spark_broker(broker={"queue_high_water": 0})  # no flow control: count in the queue
    queue = f"/queue/{unique('big')}"
    df = spark.range(120_000, numPartitions=1).selectExpr("cast(id as string) as body")
    writer(df, broker, queue).save()
    assert depth(broker, queue) == 120_000


def test_a_wrong_stomp_password_says_so(spark, spark_broker):
    broker = spark_broker(auth={"users": [{"name": "writer", "password_hash": hash_password("right", iterations=1000)}]})
    df = spark.createDataFrame([(b"x",)], "body binary")
    with pytest.raises(Exception, match="refused user 'writer': wrong user or password"):
        (df.write.format("gateway").mode("append").option("stomp", f"127.0.0.1:{broker.stomp_port}")
         .option("user", "writer").option("password", "wrong").option("destination", "/queue/x").save())
