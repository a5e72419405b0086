"""Batch and streaming writes: one STOMP message per row, a Spark partition
in as many transactions as the broker's limits need.

Each task connects and, for every ``transactionRows`` rows (or
``transactionBytes`` of bodies and headers, whichever comes first), BEGINs,
SENDs and COMMITs with a receipt.  The COMMIT's receipt is the truth: a
transaction is sent once it is receipted, whatever happens to the connection
after (a DISCONNECT that gets no answer fails nothing).  A task that fails
leaves its open transaction on a closed connection, and the broker rolls back
a transaction its connection leaves open, so no transaction is half-sent.

Each COMMIT carries ``idempotency-key``: ``spark-write:<write id>:<partition>``
for a batch write (the ``writeId`` option, or an id made once per ``save()`` on
the driver, so a retried task reuses it) and
``spark-stream:<query id>:<batch id>:<partition>`` for a micro-batch, read from
the local properties Spark sets on every task of a streaming batch; the
partition's second transaction appends ``:1``, the third ``:2``, and so on.
If Spark (or the user, with the same ``writeId``) replays a partition whose
COMMITs already succeeded, the broker drops the replay's sends and answers
each receipt with ``duplicate: true``.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, BooleanType, ByteType, IntegerType, LongType, MapType, ShortType, StringType, StructType

from gateway.spark.options import OptionError, WriteOptions, destination_name, topic_name
from gateway.spark.stompclient import Stalled, StompClient, StompError
from gateway.stomp import frames

# Spark's local properties on the tasks of a streaming micro-batch
# (StreamExecution.QUERY_ID_KEY, MicroBatchExecution.BATCH_ID_KEY).
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"

INTEGERS = (ByteType, ShortType, IntegerType, LongType)
# The columns a written DataFrame may have, and the Spark types each accepts.
COLUMNS: dict[str, tuple[type, ...]] = {
    "body": (BinaryType, StringType),
    "headers": (MapType,),
    "priority": INTEGERS,
    "persistent": (BooleanType,),
    # Per-row routing, as the Kafka sink's topic column: a STOMP destination,
    # or a topic in any form the topic option takes; the destination option,
    # when set, wins (as Kafka's topic option overrides the column).
    "destination": (StringType,),
    "topic": (StringType,),
}
# Headers a row may not set: the transport's own, and the ones columns set.
RESERVED_HEADERS = frozenset({"destination", "transaction", "receipt", "content-length", "priority", "persistent", "idempotency-key"})

log = logging.getLogger("gateway.spark")


def check_schema(schema: StructType, options: WriteOptions) -> None:
    """Driver side: refuse a DataFrame this sink cannot write, before any task runs."""
    fields = {field.name: field.dataType for field in schema.fields}
    if "body" not in fields:
        raise OptionError(f"a DataFrame written to gateway needs a body column (binary or string); it has {sorted(fields)}")
    for name, data_type in fields.items():
        accepted = COLUMNS.get(name)
        if accepted is None:
            raise OptionError(f"column {name!r} cannot be written to gateway; the columns are {', '.join(COLUMNS)}")
        if not isinstance(data_type, accepted):
            raise OptionError(f"column {name!r} has type {data_type.simpleString()}; expected {' or '.join(t.typeName() for t in accepted)}")
        if isinstance(data_type, MapType) and not (isinstance(data_type.keyType, StringType) and isinstance(data_type.valueType, StringType)):
            raise OptionError(f"column headers must be map<string,string>, got {data_type.simpleString()}")
    if "destination" in fields and "topic" in fields:
        raise OptionError("a DataFrame may route rows by a destination or a topic column, not both")
    if options.destination is None and "destination" not in fields and "topic" not in fields:
        raise OptionError("option destination is required (e.g. /queue/out or /topic/plant.1.cmd), or a destination or topic column naming each row's")


MAX_KNOWN_DESTINATIONS = 10_000  # checked names a task remembers


class Router:
    """Each row's destination: the option, else its column (checked once per distinct value)."""

    def __init__(self, fixed: str | None) -> None:
        self.fixed = fixed
        self.known: dict[tuple[str, str], str] = {}

    def __call__(self, values: dict[str, Any]) -> str:
        if self.fixed is not None:
            return self.fixed
        column = "destination" if "destination" in values else "topic"
        text = values.get(column)
        if text is None:
            raise ValueError(f"a row has no {column} (null) and the destination option is not set")
        found = self.known.get((column, text))
        if found is None:
            if column == "destination":
                found = destination_name(text, "a row's destination")
            else:
                found = "/topic/" + topic_name(text, pattern=False)
            if len(self.known) < MAX_KNOWN_DESTINATIONS:
                self.known[(column, text)] = found
        return found


def send_frame(destination: str, transaction: str, values: dict[str, Any]) -> frames.Send:
    """The SEND for one row; a bad value raises and so fails (and rolls back) the task."""
    headers = {"destination": destination, "transaction": transaction}
    user_headers = values.get("headers") or {}
    clash = RESERVED_HEADERS.intersection(user_headers)
    if clash:
        raise ValueError(f"row headers may not set {', '.join(sorted(clash))}; use the priority/persistent/destination columns")
    headers.update(user_headers)
    priority = values.get("priority")
    if priority is not None:
        if not 0 <= priority <= 9:
            raise ValueError(f"priority must be 0 to 9, got {priority}")
        headers["priority"] = str(priority)
    if values.get("persistent"):
        headers["persistent"] = "true"
    body = values["body"]
    if body is None:
        body = b""
    elif isinstance(body, str):
        body = body.encode()
    return frames.Send(headers, bytes(body))


class RowEncoder:
    """A row's SEND as bytes, the very bytes ``codec.send(send_frame(...))``
    makes, without building a frame per row: each destination's head
    (command, destination, transaction) is escaped and encoded once.  This is
    the writer's per-row path (building and encoding a frame per row was a
    fifth to a third of Spark's CPU per row in benchmarks/spark_write.py), so
    it is kept to joins."""

    MAX_HEADS = 10_000  # destinations whose encoded head a task keeps

    def __init__(self, escape: Callable[[str], str], transaction: str) -> None:
        self.escape = escape
        self.transaction = transaction
        self.heads: dict[str, bytes] = {}

    def encode(self, destination: str, values: dict[str, Any]) -> bytes:
        """Raises ValueError for a value the broker would refuse (fails the task)."""
        head = self.heads.get(destination)
        if head is None:
            escape = self.escape
            head = f"SEND\ndestination:{escape(destination)}\ntransaction:{escape(self.transaction)}\n".encode()
            if len(self.heads) < self.MAX_HEADS:
                self.heads[destination] = head
        body = values["body"]
        if body is None:
            body = b""
        elif isinstance(body, str):
            body = body.encode()
        if values.get("headers") or values.get("priority") is not None or values.get("persistent"):
            frame = send_frame(destination, self.transaction, values)  # the checks, in one place
            escape = self.escape
            head += "".join(f"{escape(k)}:{escape(v)}\n" for k, v in list(frame.headers.items())[2:]).encode()
        if body:
            return b"".join((head, b"content-length:%d\n\n" % len(body), body, b"\0"))
        return head + b"\n\0"


@dataclasses.dataclass
class SentPartition(WriterCommitMessage):
    partition: int
    rows: int
    transactions: int
    duplicates: int  # transactions the broker had committed already (a replay), so dropped


def transaction_key(base: str, number: int) -> str:
    """The idempotency key of a partition's ``number``-th transaction (the
    first keeps the bare key, as before partitions were split)."""
    return base if number == 0 else f"{base}:{number}"


def send_partition(options: WriteOptions, rows: Iterator[Any], partition: int, key: str) -> SentPartition:
    """Executor side: the partition's rows in transactions of at most
    ``transaction_rows`` rows and ``transaction_bytes`` bytes, each committed
    with its own key derived from ``key``."""
    route = Router(options.destination)
    count = transactions = duplicates = 0
    tls = options.endpoint.tls_context() if options.stomp_tls else None
    with StompClient(options.stomp_host, options.stomp_port, timeout_s=options.endpoint.timeout_s, tls=tls) as client:
        client.connect(options.stomp_host, options.endpoint.user, options.endpoint.password)
        # One transaction id for the connection: each BEGIN follows the last
        # COMMIT, so a row encoded for a full transaction goes in the next as is.
        transaction = f"spark-{uuid.uuid4().hex}"
        encode = RowEncoder(client.codec.escape, transaction).encode
        begin = client.codec.send(frames.Begin({"transaction": transaction}))
        limit_rows, limit_bytes = options.transaction_rows, options.transaction_bytes
        try:
            pending: bytes | None = None  # the row that did not fit the last transaction
            rows = iter(rows)
            while True:
                in_tx = size = 0
                if pending is not None:
                    client.send_raw(begin)
                    client.send_raw(pending)
                    in_tx, size, pending = 1, len(pending), None
                for row in rows:
                    values = row.asDict()
                    data = encode(route(values), values)
                    # The frame's length bounds what the broker counts (body and headers).
                    if in_tx and (in_tx >= limit_rows or size + len(data) > limit_bytes):
                        pending = data
                        break
                    if in_tx == 0:
                        client.send_raw(begin)
                    client.send_raw(data)
                    in_tx += 1
                    size += len(data)
                if in_tx == 0:
                    break
                receipt = client.request(frames.Commit({"transaction": transaction, "idempotency-key": transaction_key(key, transactions)}))
                count += in_tx
                transactions += 1
                duplicates += receipt.headers.get("duplicate") == "true"
                if pending is None:
                    break
        except StompError as error:
            notes = []
            if transactions:
                notes.append(f"partition {partition}: {count} rows in {transactions} transaction(s) were committed before"
                             " this and stay sent; a rerun with the same writeId, or Spark's retry of this task, skips them")
            if isinstance(error, Stalled):
                # What was written but not read (up to the COMMIT) waits in
                # the broker's socket buffer and goes through once it drains.
                notes.append("the transaction in flight may still be committed when the broker reads on: only a rerun"
                             " with the same writeId is sure to land each row once")
            if notes:
                raise StompError(f"{error} ({'; '.join(notes)})") from None
            raise
        try:
            client.disconnect()
        except StompError as error:
            # Every transaction has its receipt: the rows are sent, and the
            # broker ends a connection that goes away; nothing to fail for.
            log.warning("disconnect_unanswered partition=%s rows=%s reason=%s", partition, count, error)
    return SentPartition(partition, count, transactions, duplicates)


class GatewayWriter(DataSourceWriter):
    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        check_schema(schema, options)
        self.options = options
        # The writeId option names the job, so a rerun of it lands once; else
        # one per save(), shared by the retries of its tasks.
        self.write_id = options.write_id or uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> SentPartition:
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        return send_partition(self.options, iterator, partition, f"spark-write:{self.write_id}:{partition}")


class GatewayStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        check_schema(schema, options)
        if options.write_id is not None:
            raise OptionError("writeId is for batch writes; a stream's keys derive from its query id and batch id (keep its checkpointLocation)")
        self.options = options

    def write(self, iterator: Iterator[Any]) -> SentPartition:
        context = TaskContext.get()
        query = context.getLocalProperty(QUERY_ID_PROPERTY)
        batch = context.getLocalProperty(BATCH_ID_PROPERTY)
        if query is None or batch is None:
            raise RuntimeError("a gateway stream write ran outside a streaming micro-batch (no query or batch id)")
        partition = context.partitionId()
        return send_partition(self.options, iterator, partition, f"spark-stream:{query}:{batch}:{partition}")

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Each partition committed its own transactions already."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """A failed task's open transaction was rolled back; the transactions
        it (or another task) committed stay committed, and Spark's replay of
        this batch id is deduplicated by the broker, key by key."""
