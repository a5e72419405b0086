"""The Kafka source's and sink's options a Spark user reaches for, with
Kafka's names and meaning: subscribe / subscribePattern, timestamps,
minPartitions, includeHeaders, minOffsetsPerTrigger / maxTriggerDelay,
per-row routing on write, TLS; and the Kafka options that mean nothing here,
refused with the reason."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.transports.tls import TlsSettings
from tests.support.helpers import unique, wait_for
from tests.support.spark_helpers import USER, archived, read, stream, url


def publish(producer, topic: str, bodies: list[str]) -> None:
    for i, body in enumerate(bodies):
        producer.send(f"/topic/{topic}", body.encode(), receipt=(i == len(bodies) - 1))


def bodies(df) -> list[str]:
    return sorted(bytes(r.body).decode() for r in df.select("body").collect())


def test_subscribe_takes_a_comma_list_and_subscribe_pattern_a_regular_expression(spark, spark_broker, stomp_client):
    broker = spark_broker()
    producer = stomp_client(broker)
    for topic in ("plant.1.temp", "plant.2.temp", "plant.2.humidity", "plant.10.temp"):
        publish(producer, topic, [topic])
    def listed():  # a new reader each time: DataFrameReader.option changes the reader it is called on
        return spark.read.format("gateway").option("url", url(broker)).option("user", USER[0]).option("password", USER[1])

    assert bodies(listed().option("subscribe", "plant.1.temp, plant/2/+").load()) == ["plant.1.temp", "plant.2.humidity", "plant.2.temp"]
    # Matched whole against core names, as Kafka matches topic names.
    assert bodies(listed().option("subscribePattern", r"plant\.\d\.temp").load()) == ["plant.1.temp", "plant.2.temp"]
    with pytest.raises(Exception, match="give only one of the options topic, subscribe and subscribePattern"):
        listed().option("topic", "plant.>").option("subscribe", "plant.1.temp").load().collect()
    with pytest.raises(Exception, match="is not a regular expression"):
        listed().option("subscribePattern", "plant.(").load().collect()
    with pytest.raises(Exception, match=r"no archived topic matches subscribePattern 'other\\\\..\*'"):
        listed().option("subscribePattern", r"other\..*").load().collect()


def test_kafka_options_that_mean_nothing_here_are_refused_with_the_reason(spark, spark_broker):
    broker = spark_broker()
    with pytest.raises(Exception, match="assign: the archive has no partitions"):
        read(spark, broker, "plant.>", assign='{"plant.1.temp": [0]}').collect()
    with pytest.raises(Exception, match="kafka.bootstrap.servers: the broker is reached with url"):
        read(spark, broker, "plant.>", **{"kafka.bootstrap.servers": "127.0.0.1:9092"}).collect()
    with pytest.raises(Exception, match="topic: a sink's target is destination"):
        (spark.createDataFrame([(b"x",)], "body binary").write.format("gateway").mode("append")
         .option("stomp", f"127.0.0.1:{broker.stomp_port}").option("topic", "plant.1.cmd").save())


def test_starting_and_ending_timestamps_pick_offsets_by_time(spark, spark_broker, stomp_client):
    broker = spark_broker()
    producer = stomp_client(broker)
    publish(producer, "plant.t.temp", [f"early{i}" for i in range(5)])
    time.sleep(0.05)  # three lots with timestamps apart
    first_mark = int(time.time() * 1000)
    time.sleep(0.05)
    publish(producer, "plant.t.temp", [f"mid{i}" for i in range(5)])
    time.sleep(0.05)
    second_mark = int(time.time() * 1000)
    time.sleep(0.05)
    publish(producer, "plant.t.temp", [f"late{i}" for i in range(5)])

    assert bodies(read(spark, broker, "plant.t.temp", startingTimestamp=first_mark)) == sorted(
        [f"mid{i}" for i in range(5)] + [f"late{i}" for i in range(5)])
    assert bodies(read(spark, broker, "plant.t.temp", startingTimestamp=first_mark, endingTimestamp=second_mark)) == [
        f"mid{i}" for i in range(5)]
    assert bodies(read(spark, broker, "plant.t.temp", startingOffsetsByTimestamp=f'{{"plant/t/temp": {second_mark}}}')) == [
        f"late{i}" for i in range(5)]
    future = second_mark + 3_600_000
    with pytest.raises(Exception, match="no message of plant.t.temp was archived at or after"):
        read(spark, broker, "plant.t.temp", startingTimestamp=future).collect()
    assert read(spark, broker, "plant.t.temp", startingTimestamp=future, startingOffsetsByTimestampStrategy="latest").count() == 0
    with pytest.raises(Exception, match="maps to partitions"):
        read(spark, broker, "plant.t.temp", startingOffsetsByTimestamp='{"plant.t.temp": {"0": 5}}').collect()


def test_min_partitions_splits_the_read_and_include_headers_is_accepted(spark, spark_broker, stomp_client):
    broker = spark_broker()
    producer = stomp_client(broker)
    publish(producer, "plant.p.temp", [f"p{i}" for i in range(40)])
    df = read(spark, broker, "plant.p.temp", minPartitions=8, includeHeaders="true")
    assert df.rdd.getNumPartitions() == 8
    assert bodies(df) == sorted(f"p{i}" for i in range(40))
    assert "headers" in read(spark, broker, "plant.p.temp", includeHeaders="false").columns  # always there: a map column


def test_min_offsets_per_trigger_waits_for_enough_rows_or_for_max_trigger_delay(spark, spark_broker, stomp_client):
    broker = spark_broker()
    producer = stomp_client(broker)
    publish(producer, "plant.m.temp", ["m0"])  # the topic exists before the query starts
    query = (
        stream(spark, broker, "plant.m.temp", startingOffsets="earliest", minOffsetsPerTrigger=5, maxTriggerDelay="1h")
        .writeStream.format("memory").queryName("at_least_five").start()
    )
    try:
        query.processAllAvailable()
        publish(producer, "plant.m.temp", ["m1", "m2"])
        query.processAllAvailable()
        assert spark.sql("select count(*) from at_least_five").first()[0] == 0, "a batch ran below minOffsetsPerTrigger"
        publish(producer, "plant.m.temp", ["m3", "m4"])
        wait_for(lambda: spark.sql("select count(*) from at_least_five").first()[0] == 5, timeout=60, what="one batch of 5")
    finally:
        query.stop()
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [5]
    # With a short maxTriggerDelay, fewer rows go once the delay has passed.
    query = (
        stream(spark, broker, "plant.m.temp", startingOffsets="earliest", minOffsetsPerTrigger=100, maxTriggerDelay="1s")
        .writeStream.format("memory").queryName("delayed").start()
    )
    try:
        wait_for(lambda: spark.sql("select count(*) from delayed").first()[0] == 5, timeout=60, what="the delayed batch")
    finally:
        query.stop()


def test_each_row_goes_to_its_topic_or_destination_column(spark, spark_broker, stomp_client):
    broker = spark_broker()
    queue = f"/queue/{unique('routed')}"
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    df = spark.createDataFrame([("plant/1/cmd", "on"), ("/topic/plant.2.cmd", "off"), ("plant.3.cmd", "idle")], "topic string, body string")
    df.write.format("gateway").mode("append").option("stomp", f"127.0.0.1:{broker.stomp_port}").save()
    wait_for(lambda: archived(broker, "plant.*.cmd") == 3, what="3 routed messages archived")
    assert sorted((r.topic, bytes(r.body)) for r in read(spark, broker, "plant.*.cmd").collect()) == [
        ("plant.1.cmd", b"on"), ("plant.2.cmd", b"off"), ("plant.3.cmd", b"idle")]
    routed = spark.createDataFrame([(queue, "q1"), ("/topic/plant.4.cmd", "t1")], "destination string, body string")
    routed.write.format("gateway").mode("append").option("stomp", f"127.0.0.1:{broker.stomp_port}").save()
    assert [m.body for m in consumer.wait_messages(1)] == [b"q1"]
    # The destination option, when set, wins over the column (as Kafka's topic option does).
    routed.write.format("gateway").mode("append").option("stomp", f"127.0.0.1:{broker.stomp_port}").option("destination", queue).save()
    consumer.wait_messages(3)
    with pytest.raises(Exception, match="names no single topic"):
        spark.createDataFrame([("plant/+/cmd", "x")], "topic string, body string").write.format("gateway").mode(
            "append").option("stomp", f"127.0.0.1:{broker.stomp_port}").save()
    with pytest.raises(Exception, match="option destination is required"):
        spark.createDataFrame([("x",)], "body string").write.format("gateway").mode("append").option(
            "stomp", f"127.0.0.1:{broker.stomp_port}").save()


def test_a_broker_listening_only_with_tls_is_read_over_https_and_written_over_stomp_tls(spark, spark_broker, stomp_client, pki, tmp_path: Path):
    broker = spark_broker(tls=TlsSettings(cert=pki["server"], key=pki["server"]), stomp_tls_port=0, admin_tls_port=0, mqtt_tls_port=0)
    admin = f"https://127.0.0.1:{broker.running.ports['admin-tls']}"
    stomp = f"ssl://127.0.0.1:{broker.running.ports['stomp-tls']}"
    df = spark.createDataFrame([(f"s{i}",) for i in range(10)], "body string")
    (df.write.format("gateway").mode("append").option("stomp", stomp).option("ssl.ca.location", pki["ca"])
     .option("user", USER[0]).option("password", USER[1]).option("destination", "/topic/plant.tls").save())
    wait_for(lambda: archived(broker, "plant.tls") == 10, what="10 archived")
    secure = (spark.read.format("gateway").option("url", admin).option("ssl.ca.location", pki["ca"])
              .option("user", USER[0]).option("password", USER[1]).option("topic", "plant.tls").load())
    assert bodies(secure) == sorted(f"s{i}" for i in range(10))
    # Without the CA the certificate is not trusted, and the error says so.
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        spark.read.format("gateway").option("url", admin).option("user", USER[0]).option("password", USER[1]).option(
            "topic", "plant.tls").load().collect()
    with pytest.raises(Exception, match="ssl.ca.location: no such file"):
        read(spark, broker, "plant.tls", **{"ssl.ca.location": str(tmp_path / "missing.pem")}).collect()
