"""The pure parts of gateway.spark: option parsing and offset planning."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.spark import options as opts
from gateway.spark.options import EARLIEST, LATEST, OffsetSpec, OptionError
from gateway.spark.planning import PlanError, Slice, TopicInfo, batch_ranges, initial_offsets, next_offsets, split, stream_slices

URL = {"url": "http://127.0.0.1:8161"}


@pytest.mark.parametrize(
    ("given", "core"),
    [
        ("plant.*.temp", "plant.*.temp"),
        ("/topic/plant.>", "plant.>"),
        ("plant/+/temp", "plant.*.temp"),
        ("plant/#", "plant.>"),
        ("spBv1.0/g/+", "spBv1%2E0.g.*"),  # MQTT levels keep their dots, escaped as the broker does
    ],
)
def test_topic_forms_map_to_core_names(given, core):
    assert opts.topic_name(given, pattern=True) == core


@pytest.mark.parametrize("bad", ["plant/te+mp", "plant/#/x", "/queue/orders", "a..b", ""])
def test_bad_topics_are_refused(bad):
    with pytest.raises(OptionError):
        opts.topic_name(bad, pattern=True)


def test_read_option_defaults_follow_the_kafka_source():
    batch = opts.read_options({**URL, "topic": "plant.>"}, streaming=False)
    assert batch.starting == OffsetSpec(EARLIEST) and batch.ending == OffsetSpec(LATEST)
    assert batch.fail_on_data_loss and batch.partition_size == opts.DEFAULT_PARTITION_SIZE
    stream = opts.read_options({**URL, "topic": "plant.>", "maxOffsetsPerTrigger": "9"}, streaming=True)
    assert stream.starting == OffsetSpec(LATEST) and stream.max_offsets_per_trigger == 9


def test_per_topic_offsets_accept_mqtt_names_and_the_sentinels():
    spec = opts.offset_spec('{"plant/1/temp": 5, "plant.2.temp": -2}', "startingOffsets", EARLIEST)
    assert spec.offset_for("plant.1.temp") == 5 and spec.offset_for("plant.2.temp") == EARLIEST
    assert spec.offset_for("plant.3.temp") == EARLIEST


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"topic": "x"}, "option url is required"),
        ({**URL}, "option topic is required"),
        ({**URL, "topic": "x", "url": "ftp://h"}, "http"),
        ({**URL, "topic": "x", "endingOffsets": "5"}, "JSON must be an object"),
        ({**URL, "topic": "x", "startingOffsets": '{"x": -3}'}, "integer >= 0"),
        ({**URL, "topic": "x", "timeout": "0"}, "timeout must be positive"),
        ({**URL, "topic": "x", "maxOffsetsPerTrigger": "5"}, "unknown option"),
    ],
)
def test_bad_read_options(given, message):
    with pytest.raises(OptionError, match=message):
        opts.read_options(given, streaming=False)


def test_stream_reads_have_no_ending_offsets():
    with pytest.raises(OptionError, match="unknown option.*endingoffsets"):
        opts.read_options({**URL, "topic": "x", "endingOffsets": "latest"}, streaming=True)


def test_write_options_default_the_stomp_address_to_the_url_host():
    w = opts.write_options({"url": "http://gateway.ns.svc:8161", "destination": "/queue/out"})
    assert (w.stomp_host, w.stomp_port, w.destination) == ("gateway.ns.svc", 61613, "/queue/out")
    w = opts.write_options({"stomp": "[::1]:61000", "destination": "/topic/a.b"})
    assert (w.stomp_host, w.stomp_port) == ("::1", 61000)
    with pytest.raises(OptionError, match="url is required"):
        opts.write_options({"destination": "/queue/out"})


INFOS = [TopicInfo("a", 0, 10), TopicInfo("b", 5, 8)]


def test_batch_ranges_resolve_earliest_latest_and_clamp_the_end():
    assert batch_ranges(INFOS, OffsetSpec(EARLIEST), OffsetSpec(LATEST)) == {"a": (0, 10), "b": (5, 8)}
    ranges = batch_ranges(INFOS, OffsetSpec(EARLIEST, (("a", 3),)), OffsetSpec(LATEST, (("b", 100),)))
    assert ranges == {"a": (3, 10), "b": (5, 8)}
    # Below earliest stays as asked: the broker's 410 decides (see planning's docstring).
    assert batch_ranges(INFOS, OffsetSpec(EARLIEST, (("b", 1),)), OffsetSpec(LATEST))["b"] == (1, 8)
    with pytest.raises(PlanError, match="past endingOffsets"):
        batch_ranges(INFOS, OffsetSpec(EARLIEST, (("a", 9),)), OffsetSpec(LATEST, (("a", 4),)))


def test_split_cuts_ranges_in_topic_order():
    assert split({"b": (5, 8), "a": (0, 5)}, 2, tolerate=["b"]) == [
        Slice("a", 0, 2, False), Slice("a", 2, 4, False), Slice("a", 4, 5, False),
        Slice("b", 5, 7, True), Slice("b", 7, 8, True),
    ]
    assert split({"a": (4, 4)}, 10) == []


def test_streams_start_where_asked_and_read_new_topics_from_zero_tolerating_loss():
    assert initial_offsets(INFOS, OffsetSpec(LATEST)) == {"a": 10, "b": 8}
    assert initial_offsets(INFOS, OffsetSpec(EARLIEST)) == {"a": 0, "b": 5}
    start = {"a": 4}
    end = next_offsets(start, INFOS, None)
    assert end == {"a": 10, "b": 8}
    assert stream_slices(start, end, 100, fail_on_data_loss=True) == [Slice("a", 4, 10, False), Slice("b", 0, 8, True)]
    assert stream_slices(start, end, 100, fail_on_data_loss=False)[0].tolerate_loss


def test_next_offsets_never_go_back_and_keep_topics_gone_from_the_archive():
    assert next_offsets({"a": 10, "gone": 3}, [TopicInfo("a", 0, 10)], 5) == {"a": 10, "gone": 3}


@given(
    backlog=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=5),
    limit=st.integers(1, 120),
)
def test_max_rows_is_shared_without_exceeding_or_wasting_it(backlog, limit):
    infos = [TopicInfo(f"t{i}", e, e + n) for i, (e, n, _) in enumerate(backlog)]
    start = {f"t{i}": e + min(s, n) for i, (e, n, s) in enumerate(backlog)}
    end = next_offsets(start, infos, limit)
    moved = sum(end[t] - start[t] for t in start)
    available = sum(i.latest - start[i.topic] for i in infos)
    assert all(start[i.topic] <= end[i.topic] <= i.latest for i in infos)
    assert moved == min(limit, available)


def test_topics_are_selected_by_pattern_comma_list_or_regular_expression():
    chosen = opts.read_options({**URL, "subscribe": "plant/1/temp, plant.2.*"}, streaming=False).selection
    assert chosen.patterns == ("plant.1.temp", "plant.2.*")
    assert chosen.matches("plant.2.humidity") and not chosen.matches("plant.3.temp")
    regex = opts.read_options({**URL, "subscribePattern": r"plant\.\d+\.temp"}, streaming=False).selection
    assert regex.matches("plant.12.temp") and not regex.matches("plant.12.temp.raw")  # whole names, as Kafka
    with pytest.raises(OptionError, match="empty topic name"):
        opts.read_options({**URL, "subscribe": "a,,b"}, streaming=False)


def test_timestamps_follow_kafkas_names_and_precedence():
    given = opts.read_options({**URL, "topic": "plant.>", "startingTimestamp": "1000",
                               "startingOffsetsByTimestamp": '{"plant.1": 5}', "endingOffsetsByTimestamp": '{"plant/2": 7}'}, streaming=False)
    assert given.starting_time == opts.TimeSpec(1000) and given.ending_time == opts.TimeSpec(None, (("plant.2", 7),))
    assert given.ending_time.ms_for("plant.2") == 7 and given.ending_time.ms_for("plant.3") is None
    with pytest.raises(OptionError, match="startingTimestamp must be milliseconds"):
        opts.read_options({**URL, "topic": "plant.>", "startingTimestamp": "yesterday"}, streaming=False)
    with pytest.raises(OptionError, match="which topic 'plant.>' does not match"):
        opts.read_options({**URL, "topic": "plant.>", "startingOffsetsByTimestamp": '{"other": 5}'}, streaming=False)
    with pytest.raises(OptionError, match="unknown option.*endingtimestamp"):
        opts.read_options({**URL, "topic": "plant.>", "endingTimestamp": "5"}, streaming=True)


@pytest.mark.parametrize(("text", "seconds"), [("15m", 900.0), ("30s", 30.0), ("500ms", 0.5), ("2h", 7200.0), ("250", 0.25)])
def test_max_trigger_delay_takes_spark_durations(text, seconds):
    given = opts.read_options({**URL, "topic": "x", "maxTriggerDelay": text, "minOffsetsPerTrigger": "3"}, streaming=True)
    assert given.max_trigger_delay_s == seconds and given.min_offsets_per_trigger == 3


def test_min_partitions_cuts_smaller_slices_while_offsets_last():
    assert len(split({"a": (0, 40)}, 100, min_partitions=8)) == 8
    assert len(split({"a": (0, 40), "b": (0, 9)}, 100, min_partitions=4)) == 5  # 12 offsets each: 4 + 1
    assert len(split({"a": (0, 3)}, 100, min_partitions=8)) == 3  # one offset per slice at most
    assert len(split({"a": (0, 40)}, 5, min_partitions=2)) == 8  # partitionSize still bounds a slice
