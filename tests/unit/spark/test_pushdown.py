"""Spark's filters turned into offset ranges (gateway.spark.pushdown), and the
bisection that maps an instant to an offset."""

from __future__ import annotations

import datetime

from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, IsNotNull, LessThan, LessThanOrEqual

from gateway.spark.planning import first_at_or_after
from gateway.spark.pushdown import Bounds, bounds, micros, narrow

UTC = datetime.timezone.utc
T0 = datetime.datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
T0_US = 1_795_780_800_000_000


def test_offset_and_topic_predicates_are_taken_whole_and_the_rest_left_to_spark():
    filters = [GreaterThanOrEqual(("offset",), 45), LessThan(("offset",), 60), LessThanOrEqual(("offset",), 70),
               In(("topic",), ("plant.a", "plant.b")), EqualTo(("topic",), "plant.a"),
               In(("offset",), (1, 2)), IsNotNull(("body",)), GreaterThan(("priority",), 3)]
    found, rest = bounds(filters)
    assert found == Bounds(offset_from=45, offset_to=60, topics=frozenset({"plant.a"}))
    assert rest == filters[5:] and all(any(r is f for f in filters) for r in rest)  # the very objects
    assert bounds([EqualTo(("offset",), 7)])[0] == Bounds(offset_from=7, offset_to=8)
    assert bounds([GreaterThan(("offset",), 7)])[0] == Bounds(offset_from=8)
    assert bounds([EqualTo(("offset",), True)])[0] == Bounds()  # a boolean is no offset


def test_timestamp_predicates_narrow_but_spark_still_checks_them():
    after = GreaterThanOrEqual(("timestamp",), T0)
    before = LessThanOrEqual(("timestamp",), T0 + datetime.timedelta(seconds=1))
    found, rest = bounds([after, before])
    assert found == Bounds(time_from_us=T0_US, time_to_us=T0_US + 1_000_001)
    assert rest == [after, before]
    assert micros(T0) == T0_US
    assert micros(T0.astimezone(datetime.timezone(datetime.timedelta(hours=5))).replace()) == T0_US
    assert micros(T0.astimezone().replace(tzinfo=None)) == T0_US  # naive: local time, as PySpark gives it
    assert micros("2026-11-27") is None


def test_narrow_cuts_each_topics_range_and_looks_up_times():
    times = {"plant.a": [10, 20, 30, 40, 50], "plant.b": [5, 6]}

    def lookup(topic: str, instant: int, start: int, end: int) -> int:
        return first_at_or_after(instant, start, end, lambda o: times[topic][o])

    ranges = {"plant.a": (0, 5), "plant.b": (0, 2)}
    assert narrow(ranges, Bounds(offset_from=1, offset_to=4), lookup) == {"plant.a": (1, 4), "plant.b": (1, 2)}
    assert narrow(ranges, Bounds(time_from_us=25, time_to_us=45), lookup) == {"plant.a": (2, 4), "plant.b": (2, 2)}
    assert narrow(ranges, Bounds(topics=frozenset({"plant.b"}), offset_to=1), lookup) == {"plant.b": (0, 1)}
    assert narrow(ranges, Bounds(offset_from=9), lookup) == {"plant.a": (9, 9), "plant.b": (9, 9)}


@given(st.lists(st.integers(0, 50), max_size=40).map(sorted), st.integers(-5, 60))
def test_the_bisection_finds_the_first_offset_at_or_after_an_instant(times, instant):
    expected = next((o for o, t in enumerate(times) if t >= instant), len(times))
    assert first_at_or_after(instant, 0, len(times), times.__getitem__) == expected


def test_offsets_retention_dropped_count_as_earlier_than_any_instant():
    times = [None, None, 7, 9]
    assert first_at_or_after(8, 0, 4, times.__getitem__) == 3
    assert first_at_or_after(0, 0, 4, times.__getitem__) == 2
