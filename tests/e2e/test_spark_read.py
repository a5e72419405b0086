"""Batch reads through Spark: publish over STOMP and MQTT, then
``spark.read.format("gateway")`` gives exactly those messages with the right
columns, split into partitions by offset range."""

from __future__ import annotations

import datetime
import json

import pytest

from tests.support.helpers import unique, wait_for
from tests.support.spark_helpers import archived, read


def test_stomp_and_mqtt_messages_come_back_as_rows_with_every_column(spark, spark_broker, stomp_client, paho):
    broker = spark_broker()
    before = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=1)
    producer = stomp_client(broker)
    producer.send("/topic/plant.1.temp", b"21.5", unit="C", priority="7", persistent="true")
    device = paho(broker, "dev-2")
    device.publish("plant/2/temp", b"\x00\xff19", qos=1)
    producer.send("/topic/plant.1.temp", b"22.0", receipt=True)
    producer.send("/topic/plant.1.humidity", b"40", receipt=True)  # archived, but not matched

    df = read(spark, broker, "plant.*.temp")
    assert df.columns == ["topic", "offset", "message_id", "timestamp", "priority", "headers", "body"]
    assert [f.dataType.simpleString() for f in df.schema.fields] == [
        "string", "bigint", "string", "timestamp", "int", "map<string,string>", "binary"
    ]
    rows = sorted(df.collect(), key=lambda r: (r.topic, r.offset))
    assert [(r.topic, r.offset, bytes(r.body)) for r in rows] == [
        ("plant.1.temp", 0, b"21.5"),
        ("plant.1.temp", 1, b"22.0"),
        ("plant.2.temp", 0, b"\x00\xff19"),
    ]
    first = rows[0]
    assert first.priority == 7 and first.headers == {"unit": "C"}
    assert first.message_id and len({r.message_id for r in rows}) == 3
    after = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=1)
    for row in rows:
        stamp = row.timestamp.astimezone(datetime.timezone.utc) if row.timestamp.tzinfo else row.timestamp.replace(tzinfo=datetime.timezone.utc)
        assert before <= stamp <= after
    assert rows[2].priority == 4 and rows[2].headers == {"mqtt-qos": "1"}  # MQTT's flags, see below


def test_an_mqtt_messages_row_carries_its_qos_retain_flag_and_mqtt5_properties(spark, spark_broker, paho):
    from tests.support.mqtt5_helpers import Paho5, props

    broker = spark_broker()
    paho(broker, "dev-311").publish("plant/1/state", b"on", qos=1, retain=True)
    v5 = Paho5(broker.mqtt_port, "dev-5")
    try:
        v5.publish("plant/2/state", b'{"on": true}', qos=1, properties=props(
            ContentType="application/json", ResponseTopic="plant/2/reply", CorrelationData=b"req-17",
            PayloadFormatIndicator=1, UserProperty=[("site", "north"), ("line", "3")]))
        v5.publish("plant/3/state", b"x", qos=0, properties=props(CorrelationData=b"\x00\xff"))
    finally:
        v5.close()
    wait_for(lambda: archived(broker, "plant.*.state") == 3, what="3 archived")  # the QoS 0 one has no ack
    rows = {r.topic: r.headers for r in read(spark, broker, "plant/+/state").collect()}
    assert rows["plant.1.state"] == {"mqtt-qos": "1", "mqtt-retain": "true"}
    assert rows["plant.2.state"] == {
        "mqtt-qos": "1", "content-type": "application/json", "reply-to": "/topic/plant.2.reply",
        "correlation-id": "req-17", "mqtt-payload-format": "utf-8", "site": "north", "line": "3",
    }
    assert rows["plant.3.state"] == {"mqtt-qos": "0", "mqtt-correlation-data": "AP8="}  # binary: base64


@pytest.mark.parametrize("topic", ["plant/+/temp", "/topic/plant.*.temp", "plant.>"])
def test_the_topic_option_takes_mqtt_stomp_and_core_patterns(spark, spark_broker, stomp_client, topic):
    broker = spark_broker()
    producer = stomp_client(broker)
    for i in range(3):
        producer.send(f"/topic/plant.{i}.temp", f"t{i}".encode(), receipt=True)
    got = sorted(bytes(r.body) for r in read(spark, broker, topic).select("body").collect())
    assert got == [b"t0", b"t1", b"t2"]


def test_offsets_and_partition_size_cut_the_range_into_parallel_partitions(spark, spark_broker, stomp_client):
    broker = spark_broker()
    producer = stomp_client(broker)
    for i in range(50):
        producer.send("/topic/plant.a.temp", f"a{i}".encode())
    for i in range(20):
        producer.send("/topic/plant.b.temp", f"b{i}".encode(), receipt=(i == 19))

    df = read(spark, broker, "plant.*.temp", partitionSize=7)
    assert df.rdd.getNumPartitions() == 8 + 3  # ceil(50/7) + ceil(20/7)
    assert df.count() == 70
    per_partition = df.rdd.glom().map(lambda rows: sorted((r.topic, r.offset) for r in rows)).collect()
    assert all(len(p) <= 7 and len({t for t, _ in p}) == 1 for p in per_partition)

    ranged = read(
        spark, broker, "plant.*.temp",
        startingOffsets=json.dumps({"plant.a.temp": 45, "plant.b.temp": -2}),
        endingOffsets=json.dumps({"plant.b.temp": 3}),
    )
    assert sorted((r.topic, r.offset) for r in ranged.select("topic", "offset").collect()) == [
        ("plant.a.temp", o) for o in range(45, 50)
    ] + [("plant.b.temp", o) for o in range(3)]
    assert read(spark, broker, "plant.*.temp", startingOffsets="latest").count() == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"colour": "blue"}, "unknown option(s) for a gateway source: colour"),
        ({"partitionSize": "0"}, "partitionSize must be a positive integer"),
        ({"startingOffsets": "soon"}, "startingOffsets must be earliest, latest or JSON"),
        ({"endingOffsets": "earliest"}, "endingOffsets cannot be earliest"),
        ({"startingOffsets": '{"other.topic": 3}'}, "does not match"),
        ({"failOnDataLoss": "maybe"}, "failOnDataLoss must be true or false"),
    ],
)
def test_bad_options_fail_at_plan_time_with_a_clear_error(spark, spark_broker, options, message):
    broker = spark_broker()
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)")):
        read(spark, broker, "plant.*.temp", **options).collect()


def test_a_bad_topic_or_an_unreachable_broker_is_a_clear_error(spark, spark_broker):
    broker = spark_broker()
    with pytest.raises(Exception, match="not a valid MQTT topic filter"):
        read(spark, broker, "plant/#/temp").collect()
    with pytest.raises(Exception, match="cannot reach the broker's admin API"):
        spark.read.format("gateway").option("url", "http://127.0.0.1:9").option("topic", unique("t")).load().collect()
    with pytest.raises(Exception, match="refused user 'spark': wrong user or password"):
        spark.read.format("gateway").option("url", f"http://127.0.0.1:{broker.admin_port}").option("topic", "plant.>").option("user", "spark").option("password", "wrong").load().collect()
    with pytest.raises(Exception, match="needs a user: set the user and password options"):
        spark.read.format("gateway").option("url", f"http://127.0.0.1:{broker.admin_port}").option("topic", "plant.>").load().collect()


def test_a_topic_or_pattern_with_no_archive_says_so_and_which_policy_archives_it(spark, spark_broker, stomp_client):
    broker = spark_broker()
    stomp_client(broker).send("/topic/other.1", b"not archived", receipt=True)
    for topic in ("other.1", "plant/+/nothing"):
        with pytest.raises(Exception, match=r"no archived topic matches .*archive = true"):
            read(spark, broker, topic).collect()


def test_offset_timestamp_and_topic_filters_are_pushed_down_to_the_archive_read(spark, spark_broker, stomp_client):
    import time

    broker = spark_broker()
    producer = stomp_client(broker)
    for i in range(50):
        producer.send("/topic/plant.a.temp", f"a{i}".encode(), receipt=(i == 49))
    time.sleep(0.05)  # the two lots get timestamps apart
    mark = datetime.datetime.now(datetime.timezone.utc)
    time.sleep(0.05)
    for i in range(50, 80):
        producer.send("/topic/plant.a.temp", f"a{i}".encode())
    for i in range(20):
        producer.send("/topic/plant.b.temp", f"b{i}".encode(), receipt=(i == 19))
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        df = read(spark, broker, "plant.*.temp", partitionSize=10, pushFilters="true")
        # Pushed down: the partitions cover only the offsets asked for.
        by_offset = df.where("offset >= 45 and offset < 65 and topic = 'plant.a.temp'")
        assert by_offset.rdd.getNumPartitions() == 2
        assert sorted(r.offset for r in by_offset.select("offset").collect()) == list(range(45, 65))
        by_time = df.where(df.timestamp >= mark).where("topic = 'plant.a.temp'")
        assert by_time.rdd.getNumPartitions() == 3  # offsets 50..79, found by bisection
        assert sorted(r.offset for r in by_time.select("offset").collect()) == list(range(50, 80))
        before = df.where(df.timestamp < mark)
        assert sorted((r.topic, r.offset) for r in before.select("topic", "offset").collect()) == [("plant.a.temp", o) for o in range(50)]
        assert before.rdd.getNumPartitions() == 5
        # Filters it cannot use are Spark's, as without pushdown.
        assert df.where("offset % 2 = 0 and body = 'a4'").count() == 1
    finally:
        spark.conf.unset("spark.sql.python.filterPushdown.enabled")
    # Without the session setting Spark refuses a reader that takes filters, and says so.
    with pytest.raises(Exception, match="spark.sql.python.filterPushdown.enabled"):
        read(spark, broker, "plant.*.temp", pushFilters="true").collect()
