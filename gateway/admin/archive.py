"""The admin API's archive routes: which topics are archived, their offsets,
and ranges of their messages as an Arrow IPC stream.

    GET /api/v1/archive?pattern=P                 every archived topic (matching P, with * and >)
    GET /api/v1/archive/{topic}                   one: earliest, latest (exclusive), messages, bytes
    GET /api/v1/archive/{topic}/messages?from=A&to=B
                                                  offsets A..B-1 as application/vnd.apache.arrow.stream

Topics are core names without ``/topic/`` (MQTT ``plant/1/temp`` is
``plant.1.temp``), URL-encoded in the path.  The stream is produced a batch
at a time by :class:`ArrowStream`, whose blocking :meth:`ArrowStream.next_chunk`
admin/server.py runs in a worker thread: the range is never held in memory.
pyarrow is imported only when a range is actually read.
"""

from __future__ import annotations

import functools
from typing import Any
from urllib.parse import unquote

from core import names
from gateway.admin.http import Response, error, ok
from persistence.archive import Archive, ArchiveGone, ArchiveReader, Rows, TopicInfo, list_topics

ARROW_STREAM = "application/vnd.apache.arrow.stream"
# Rows per record batch: a few thousand, so a batch is a few hundred KiB.
BATCH_ROWS = 4096
# A range may end at offsets appended but not yet written by the committer:
# wait this long at most for it (it takes milliseconds).
WAIT_WRITTEN_S = 2.0
# The end-of-stream marker of the Arrow IPC stream format (continuation, zero length).
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def route(archive: Archive | None, method: str, rest: str, query: dict[str, list[str]]) -> Response:
    """``rest`` is the path after ``/api/v1/archive``."""
    if method != "GET":
        return error(405, f"{method} is not allowed here")
    if archive is None:
        return error(404, "this broker keeps no archive")
    if rest in ("", "/"):
        return _list(archive, query)
    parts = rest.lstrip("/").split("/")
    if len(parts) > 2 or (len(parts) == 2 and parts[1] != "messages"):
        return error(404, f"no such resource {rest[:100]!r}")
    topic = unquote(parts[0])
    address = names.parse("/topic/" + topic)
    if isinstance(address, str) or address.is_pattern:
        return error(400, f"invalid topic {topic[:100]!r}: {address if isinstance(address, str) else 'a pattern'}")
    info = archive.info(topic)
    if info is None:
        return error(404, f"topic {topic[:100]!r} has no archive")
    if len(parts) == 1:
        return ok(_view(info))
    return _messages(archive, info, query)


def _view(info: TopicInfo) -> dict[str, Any]:
    return {
        "topic": info.topic, "earliest": info.earliest, "latest": info.latest,
        "messages": info.latest - info.earliest, "bytes": info.bytes,
    }


def _list(archive: Archive, query: dict[str, list[str]]) -> Response:
    pattern = query.get("pattern", [None])[0]
    segments = None
    if pattern:
        address = names.parse("/topic/" + pattern)
        if isinstance(address, str):
            return error(400, f"invalid pattern {pattern[:100]!r}: {address}")
        segments = address.segments
    return ok({
        "topics": [
            _view(info) for info in list_topics(archive)
            if segments is None or names.matches(segments, tuple(info.topic.split(".")))
        ]
    })


def _offset(query: dict[str, list[str]], name: str) -> int | None | str:
    values = query.get(name)
    if not values:
        return None
    text = values[0]
    if not text.isdigit() or len(text) > 19:
        return f"{name} must be a non-negative integer offset, not {text[:40]!r}"
    return int(text)


def _messages(archive: Archive, info: TopicInfo, query: dict[str, list[str]]) -> Response:
    start = _offset(query, "from")
    stop = _offset(query, "to")
    for value in (start, stop):
        if isinstance(value, str):
            return error(400, value)
    start = info.earliest if start is None else start
    stop = info.latest if stop is None else stop
    assert isinstance(start, int) and isinstance(stop, int)
    if start > info.latest:
        return error(416, f"from={start} is beyond the latest offset {info.latest} of {info.topic}")
    if start > stop:
        return error(416, f"from={start} is after to={stop}")
    try:
        reader = archive.reader(info.topic, start, min(stop, info.latest))
    except ArchiveGone as exc:
        return ok({"status": 410, "reason": str(exc), "earliest": exc.earliest}, 410)
    return Response(200, b"", ARROW_STREAM, stream=ArrowStream(info.topic, reader))


class ArrowStream:
    """The Arrow IPC stream of one range: the schema, one record batch per
    :data:`BATCH_ROWS` rows read from disk, the end-of-stream marker."""

    def __init__(self, topic: str, reader: ArchiveReader) -> None:
        self.topic = topic
        self.reader = reader
        self._started = False
        self._ended = False

    def next_chunk(self) -> bytes | None:
        """Blocking (a worker thread): the next piece of the body, None at the end."""
        if self._ended:
            return None
        if not self._started:
            self._started = True
            self.reader.wait_written(WAIT_WRITTEN_S)
            return schema().serialize().to_pybytes()
        rows = self.reader.read(BATCH_ROWS)
        if not rows:
            self._ended = True
            self.reader.close()
            return END_OF_STREAM
        return record_batch(self.topic, rows).serialize().to_pybytes()

    def close(self) -> None:
        self.reader.close()


@functools.cache  # built once, on the first read (pyarrow is imported lazily)
def schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        ("topic", pa.string()),
        ("offset", pa.int64()),
        ("message_id", pa.string()),
        ("timestamp", pa.timestamp("ms", tz="UTC")),
        ("priority", pa.int32()),
        ("headers", pa.map_(pa.string(), pa.string())),
        ("body", pa.binary()),
    ])


def record_batch(topic: str, rows: Rows) -> Any:
    """Columns built in bulk from the reader's lists (UTF-8 bytes cast to
    strings, which validates them in C)."""
    import pyarrow as pa

    n = len(rows)
    headers = pa.MapArray.from_arrays(
        pa.array(rows.header_ends, pa.int32()),
        pa.array(rows.header_names, pa.binary()).cast(pa.string()),
        pa.array(rows.header_values, pa.binary()).cast(pa.string()),
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.array(rows.offsets, pa.int64()),
            pa.array(rows.ids, pa.binary()).cast(pa.string()),
            pa.array(rows.timestamps, pa.timestamp("ms", tz="UTC")),
            pa.array(rows.priorities, pa.int32()),
            headers,
            pa.array(rows.bodies, pa.binary()),
        ],
        schema=schema(),
    )
