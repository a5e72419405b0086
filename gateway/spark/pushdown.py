"""Filter pushdown for batch reads: Spark's ``offset``, ``timestamp`` and
``topic`` predicates turned into narrower offset ranges, so a filter on
``offset >= N`` or on a time window reads only that part of the archive.

Spark hands a Python data source its filters (``pushFilters``, when the
session sets ``spark.sql.python.filterPushdown.enabled``); :func:`bounds`
keeps what it can use and returns the rest for Spark to evaluate.  Offset and
topic predicates are applied exactly, so Spark drops them.  A timestamp
predicate narrows the range through the topic's offsets by time (the first
offset at or after an instant, found by bisection, as Kafka's offsetsForTimes)
and Spark still evaluates it on the rows read: the range is exact while the
broker's clock only moves forward, and the filter stays exact regardless.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pyspark.sql.datasource import EqualTo, Filter, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual

# (topic, instant in µs since the epoch, from, to) -> the first offset in
# from..to-1 whose timestamp is at or after the instant, else ``to``.
Lookup = Callable[[str, int, int, int], int]


@dataclasses.dataclass(frozen=True)
class Bounds:
    """What the pushed filters allow: every bound optional, all ANDed."""

    offset_from: int = 0  # inclusive
    offset_to: int | None = None  # exclusive
    time_from_us: int | None = None  # rows with timestamp >= this
    time_to_us: int | None = None  # rows with timestamp < this
    topics: frozenset[str] | None = None

    @property
    def narrows(self) -> bool:
        return self != Bounds()


def micros(value: Any) -> int | None:
    """A pushed timestamp literal in µs since the epoch (PySpark gives a naive
    datetime in the worker's local time zone, or an aware one); None if it is
    not a datetime."""
    if not isinstance(value, datetime.datetime):
        return None
    if value.tzinfo is None:
        value = value.astimezone()  # local time, as PySpark made it
    delta = value - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _integer(value: Any) -> int | None:
    return value if type(value) is int else None


def bounds(filters: Iterable[Filter]) -> tuple[Bounds, list[Filter]]:
    """The bounds the filters set, and the filters Spark must still evaluate."""
    found = Bounds()
    rest: list[Filter] = []
    for f in filters:
        column = getattr(f, "attribute", None)
        value = getattr(f, "value", None)
        if column == ("offset",) and not isinstance(f, In) and (n := _integer(value)) is not None:
            found = _narrow_offsets(found, f, n)
            continue  # exact: offsets are read as asked
        if column == ("timestamp",) and not isinstance(f, In) and (t := micros(value)) is not None:
            found = _narrow_times(found, f, t)
        elif column == ("topic",) and isinstance(f, EqualTo) and isinstance(value, str):
            found = _only(found, {value})
            continue
        elif column == ("topic",) and isinstance(f, In) and all(isinstance(v, str) for v in value):
            found = _only(found, set(value))
            continue
        rest.append(f)  # unused, or (a timestamp) used but still checked row by row
    return found, rest


def _narrow_offsets(b: Bounds, f: Filter, n: int) -> Bounds:
    low, high = {
        GreaterThan: (n + 1, None), GreaterThanOrEqual: (n, None), LessThan: (None, n),
        LessThanOrEqual: (None, n + 1), EqualTo: (n, n + 1),
    }[type(f)]
    if low is not None:
        b = dataclasses.replace(b, offset_from=max(b.offset_from, low))
    if high is not None:
        b = dataclasses.replace(b, offset_to=high if b.offset_to is None else min(b.offset_to, high))
    return b


def _narrow_times(b: Bounds, f: Filter, t: int) -> Bounds:
    low, high = {
        GreaterThan: (t + 1, None), GreaterThanOrEqual: (t, None), LessThan: (None, t),
        LessThanOrEqual: (None, t + 1), EqualTo: (t, t + 1),
    }[type(f)]
    if low is not None:
        b = dataclasses.replace(b, time_from_us=low if b.time_from_us is None else max(b.time_from_us, low))
    if high is not None:
        b = dataclasses.replace(b, time_to_us=high if b.time_to_us is None else min(b.time_to_us, high))
    return b


def _only(b: Bounds, topics: set[str]) -> Bounds:
    return dataclasses.replace(b, topics=frozenset(topics) if b.topics is None else b.topics & topics)


def narrow(ranges: Mapping[str, tuple[int, int]], b: Bounds, lookup: Lookup) -> dict[str, tuple[int, int]]:
    """``ranges`` cut to the bounds; a topic left with nothing reads nothing."""
    out = {}
    for topic, (start, end) in ranges.items():
        if b.topics is not None and topic not in b.topics:
            continue
        start = max(start, b.offset_from)
        if b.offset_to is not None:
            end = min(end, b.offset_to)
        if start < end and b.time_from_us is not None:
            start = lookup(topic, b.time_from_us, start, end)
        if start < end and b.time_to_us is not None:
            end = lookup(topic, b.time_to_us, start, end)
        out[topic] = (start, max(start, end))
    return out
