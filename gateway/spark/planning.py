"""Offset arithmetic: which offsets of which topics a batch or micro-batch reads,
and how that is cut into Spark partitions.  Pure functions on plain values, so
they are unit-tested without Spark or a broker.

Offsets of a topic are 0, 1, 2, ... and never reused; ``latest`` is exclusive
(the offset the next message will get).  A streaming offset is the JSON object
``{"plant.1.temp": 42, ...}``: per topic, the next offset to read.  A topic the
start offset does not name appeared during the query and is read from 0, with
whatever retention already dropped skipped rather than failed: it is new, not
lost (Spark's Kafka source treats new partitions the same way).

Planning never checks ``earliest`` itself.  An executor asks the broker for its
range and the broker answers 410 for offsets retention dropped; the executor
then fails with the broker's reason or, when data loss is tolerated, reads on
from the earliest offset the broker reports.  One rule, in one place, and it
also covers retention that runs between planning and reading.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping

from gateway.spark.options import EARLIEST, LATEST, OffsetSpec


class PlanError(ValueError):
    """The requested offsets make no range (e.g. start past end)."""


@dataclasses.dataclass(frozen=True)
class TopicInfo:
    """One archived topic as ``GET /api/v1/archive`` describes it."""

    topic: str
    earliest: int
    latest: int  # exclusive


@dataclasses.dataclass(frozen=True)
class Slice:
    """One Spark partition: offsets ``start`` (inclusive) to ``end`` (exclusive) of one topic."""

    topic: str
    start: int
    end: int
    tolerate_loss: bool  # on 410, skip to the broker's earliest instead of failing


def _resolve(spec: OffsetSpec, info: TopicInfo) -> int:
    offset = spec.offset_for(info.topic)
    if offset == EARLIEST:
        return info.earliest
    if offset == LATEST:
        return info.latest
    return offset


def batch_ranges(infos: Iterable[TopicInfo], starting: OffsetSpec, ending: OffsetSpec) -> dict[str, tuple[int, int]]:
    """``{topic: (start, end)}`` for a batch read; an ending offset past
    ``latest`` is clamped to it, as the broker clamps ``to``."""
    ranges = {}
    for info in infos:
        start = _resolve(starting, info)
        end = min(_resolve(ending, info), info.latest)
        if start > end:
            raise PlanError(f"{info.topic}: startingOffsets {start} is past endingOffsets {end} (latest is {info.latest})")
        ranges[info.topic] = (start, end)
    return ranges


def split(
    ranges: Mapping[str, tuple[int, int]], partition_size: int, *, tolerate: Iterable[str] = (), min_partitions: int | None = None
) -> list[Slice]:
    """Cut each topic's range into slices of at most ``partition_size`` offsets,
    topics in name order so the plan is deterministic.  With
    ``min_partitions`` (Kafka's minPartitions) the slices are made smaller,
    if need be, so that there are at least that many (while offsets last)."""
    if partition_size <= 0:
        raise ValueError("partition_size must be positive")
    if min_partitions:
        total = sum(end - start for start, end in ranges.values())
        partition_size = max(1, min(partition_size, total // min_partitions))
    tolerant = frozenset(tolerate)
    out = []
    for topic in sorted(ranges):
        start, end = ranges[topic]
        for lo in range(start, end, partition_size):
            out.append(Slice(topic, lo, min(lo + partition_size, end), topic in tolerant))
    return out


def initial_offsets(infos: Iterable[TopicInfo], starting: OffsetSpec) -> dict[str, int]:
    """Where a new streaming query starts, per topic archived right now."""
    return {info.topic: _resolve(starting, info) for info in sorted(infos, key=lambda i: i.topic)}


def next_offsets(start: Mapping[str, int], infos: Iterable[TopicInfo], max_rows: int | None) -> dict[str, int]:
    """The end offset of the next micro-batch: every topic's ``latest``, or, with
    ``max_rows``, at most that many new offsets shared across topics in
    proportion to their backlog.  Never below ``start``: an offset only moves on."""
    ends = dict(start)
    backlog: list[tuple[str, int, int]] = []  # (topic, from, latest)
    for info in sorted(infos, key=lambda i: i.topic):
        # A topic new to the query starts at 0; what retention dropped is no backlog.
        begin = max(start.get(info.topic, 0), info.earliest)
        ends[info.topic] = begin
        if info.latest > begin:
            backlog.append((info.topic, begin, info.latest))
    total = sum(latest - begin for _, begin, latest in backlog)
    if max_rows is None or total <= max_rows:
        for topic, _, latest in backlog:
            ends[topic] = latest
        return ends
    takes = [(latest - begin) * max_rows // total for _, begin, latest in backlog]
    remainder = max_rows - sum(takes)
    for i, (topic, begin, latest) in enumerate(backlog):
        extra = min(remainder, latest - begin - takes[i])
        remainder -= extra
        ends[topic] = begin + takes[i] + extra
    return ends


def stream_slices(
    start: Mapping[str, int], end: Mapping[str, int], partition_size: int, *, fail_on_data_loss: bool, min_partitions: int | None = None
) -> list[Slice]:
    """The partitions of the micro-batch ``start`` -> ``end``."""
    ranges = {topic: (start.get(topic, 0), offset) for topic, offset in end.items() if offset > start.get(topic, 0)}
    new = [topic for topic in ranges if topic not in start]
    return split(ranges, partition_size, tolerate=ranges if not fail_on_data_loss else new, min_partitions=min_partitions)


def new_rows(start: Mapping[str, int], end: Mapping[str, int]) -> int:
    """How many offsets the micro-batch ``start`` -> ``end`` covers."""
    return sum(offset - start.get(topic, 0) for topic, offset in end.items() if offset > start.get(topic, 0))


def first_at_or_after(instant_us: int, start: int, end: int, time_of: Callable[[int], int | None]) -> int:
    """Bisection over offsets ``start``..``end - 1`` for the first whose time
    (``time_of``, µs; None for an offset retention dropped, which counts as
    earlier than any) is at or after ``instant_us``; ``end`` if none is."""
    low, high = start, end
    while low < high:
        mid = (low + high) // 2
        when = time_of(mid)
        if when is not None and when >= instant_us:
            high = mid
        else:
            low = mid + 1
    return low
