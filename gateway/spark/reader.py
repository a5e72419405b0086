"""Batch and streaming reads of the broker's topic archive.

The driver plans (lists the archived topics matching the ``topic`` option and
cuts their offset ranges into slices); each executor task fetches one slice
over HTTP and hands Spark its Arrow record batches.

Streaming offsets are ``{"topic": next_offset}`` in Spark's checkpoint.  The
broker is never told what was consumed: ``commit`` does nothing, because Spark
calls it only when it plans the next batch, and a query restarted from its
checkpoint replays by offset.  That is what gives exactly-once into a sink
that is itself idempotent or transactional (Parquet, Delta, this broker's
idempotent COMMIT), as with Spark's Kafka source.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, Filter, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from gateway.spark import planning, pushdown
from gateway.spark.archive import ArchiveClient, DataLossError
from gateway.spark.options import OffsetSpec, ReadOptions, Selection, TimeSpec

# The columns, in the order and types of the archive's Arrow schema.
SCHEMA = (
    "topic string, offset bigint, message_id string, timestamp timestamp, "
    "priority int, headers map<string, string>, body binary"
)
# A tolerated 410 moves the start to the broker's earliest; retention running
# again while we retry could repeat that, but not forever.
MAX_LOSS_RETRIES = 8


def read_partition(options: ReadOptions, schema: StructType, partition: InputPartition) -> Iterator[Any]:
    """Executor side: the record batches of one slice.  A plan with no slices
    still gets one partition from Spark, with no value: it reads nothing."""
    piece = partition.value
    if piece is None:
        return iter(())
    assert isinstance(piece, planning.Slice), piece
    return read_slice(options, schema, piece)


def read_slice(options: ReadOptions, schema: StructType, piece: planning.Slice) -> Iterator[Any]:
    """The slice's record batches, cast to the Arrow types Spark checks them
    against (microsecond timestamps, non-null map keys)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    target = to_arrow_schema(schema, timezone="UTC")
    client = ArchiveClient(options.endpoint)
    start = piece.start
    for _ in range(MAX_LOSS_RETRIES):
        try:
            for batch in client.batches(piece.topic, start, piece.end):
                yield batch if batch.schema.equals(target) else batch.cast(target)
            return
        except DataLossError as loss:
            if not piece.tolerate_loss:
                raise DataLossError(
                    f"{loss}. Messages the query needed were dropped by the archive's retention"
                    " (archive_retention_s / archive_retention_bytes) before it read them. To read on from the"
                    " earliest kept offset instead of failing, set the option failOnDataLoss to false",
                    status=loss.status, body=loss.body,
                ) from None
            if loss.earliest <= start:
                raise
            if loss.earliest >= piece.end:
                return  # the whole slice was dropped; failOnDataLoss=false skips it
            start = loss.earliest
    raise DataLossError(f"{piece.topic}: retention kept dropping offsets while reading {piece.start}..{piece.end - 1}")


def no_archive(selection: Selection) -> str:
    """Why a batch read found nothing to read at all."""
    where = " or ".join(f"/topic/{p}" for p in selection.patterns) or "the topics"
    return (
        f"no archived topic matches {selection.given}: a topic is archived from its first message on, once a"
        f" [[broker.policies]] entry whose destination matches {where} sets archive = true"
        " (GET /api/v1/archive lists the archived topics)"
    )


def by_time(
    client: ArchiveClient, infos: list[planning.TopicInfo], offsets: OffsetSpec, times: TimeSpec | None, *, strategy: str, what: str
) -> OffsetSpec:
    """``offsets`` with the topics ``times`` names (or every topic) moved to
    their first offset archived at or after that time, as Kafka's
    startingTimestamp/endingTimestamp.  A start with no such offset fails
    (strategy ``error``, Kafka's default) or is ``latest``; an end is ``latest``."""
    if times is None:
        return offsets
    per_topic = dict(offsets.per_topic)
    for info in infos:
        ms = times.ms_for(info.topic)
        if ms is None:
            continue
        offset = client.offset_for_time(info.topic, ms * 1000, info.earliest, info.latest)
        if offset == info.latest and strategy == "error":
            raise planning.PlanError(
                f"no message of {info.topic} was archived at or after {ms} ms (the {what} timestamp; its newest"
                " is older): set startingOffsetsByTimestampStrategy to latest to start at the latest offset instead"
            )
        per_topic[info.topic] = offset
    return OffsetSpec(offsets.default, tuple(sorted(per_topic.items())))


class ArchiveReader(DataSourceReader):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.bounds = pushdown.Bounds()

    def partitions(self) -> list[InputPartition]:
        options = self.options
        client = ArchiveClient(options.endpoint)
        infos = client.topics(options.selection)
        if not infos:
            raise planning.PlanError(no_archive(options.selection))
        starting = by_time(client, infos, options.starting, options.starting_time, strategy=options.time_strategy, what="start")
        ending = by_time(client, infos, options.ending, options.ending_time, strategy="latest", what="end")
        ranges = planning.batch_ranges(infos, starting, ending)
        if self.bounds.narrows:
            ranges = pushdown.narrow(ranges, self.bounds, client.offset_for_time)
        tolerate = ranges if not options.fail_on_data_loss else ()
        pieces = planning.split(ranges, options.partition_size, tolerate=tolerate, min_partitions=options.min_partitions)
        return [InputPartition(piece) for piece in pieces]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(self.options, self.schema, partition)


class FilteringArchiveReader(ArchiveReader):
    """With ``pushFilters``: Spark's offset, timestamp and topic predicates
    narrow the ranges read.  A separate class because PySpark refuses a reader
    that overrides ``pushFilters`` unless the session enables
    ``spark.sql.python.filterPushdown.enabled`` (off by default)."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        self.bounds, rest = pushdown.bounds(filters)
        # Spark wants back the very objects it gave, for what it still evaluates.
        return iter(rest)


class ArchiveStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.client = ArchiveClient(options.endpoint)
        self.target: dict[str, int] | None = None  # set by Trigger.AvailableNow
        self.initial: dict[str, int] | None = None
        self.last_batch = time.monotonic()  # for minOffsetsPerTrigger's maxTriggerDelay

    def initialOffset(self) -> dict[str, int]:
        """Resolved once per run, so ``latest`` means "when the query started"
        even if Spark asks again before its first batch is logged (else what was
        published between two empty triggers could be skipped)."""
        if self.initial is None:
            infos = self.client.topics(self.options.selection)
            starting = by_time(self.client, infos, self.options.starting, self.options.starting_time,
                               strategy=self.options.time_strategy, what="start")
            self.initial = planning.initial_offsets(infos, starting)
        return self.initial

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self.reportLatestOffset()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        infos = self.client.topics(self.options.selection)
        if self.target is not None:
            infos = [planning.TopicInfo(i.topic, i.earliest, min(i.latest, self.target[i.topic])) for i in infos if i.topic in self.target]
        ends = planning.next_offsets(start, infos, max_rows)
        least = self.options.min_offsets_per_trigger
        now = time.monotonic()
        if (least is not None and self.target is None and planning.new_rows(start, ends) < least
                and now - self.last_batch < self.options.max_trigger_delay_s):
            return start  # Kafka's minOffsetsPerTrigger: wait for more, up to maxTriggerDelay
        if ends != start:
            self.last_batch = now
        return ends

    def reportLatestOffset(self) -> dict[str, int]:
        return {info.topic: info.latest for info in self.client.topics(self.options.selection)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        slices = planning.stream_slices(start, end, self.options.partition_size, fail_on_data_loss=self.options.fail_on_data_loss,
                                        min_partitions=self.options.min_partitions)
        return [InputPartition(piece) for piece in slices]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(self.options, self.schema, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to tell the broker: the checkpoint, not an ack, records progress."""
