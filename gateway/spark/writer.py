"""Batch and streaming writes: one STOMP message per row, one transaction per
Spark partition.

Each task connects, BEGINs, SENDs its rows, and COMMITs with a receipt; only
the receipt makes the task succeed.  A task that fails before it closes its
connection with the transaction still open, and the broker rolls back a
transaction its connection leaves open, so nothing is half-sent.

The COMMIT carries ``idempotency-key``: ``<write id>:<partition>`` for a batch
write (the id is made once on the driver, so a retried task reuses it) and
``<query id>:<batch id>:<partition>`` for a micro-batch, read from the local
properties Spark sets on every task of a streaming batch.  If Spark replays a
partition whose COMMIT already succeeded, the broker drops the replay's sends
and answers the receipt with ``duplicate: true``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, BooleanType, ByteType, IntegerType, LongType, MapType, ShortType, StringType, StructType

from gateway.spark.options import OptionError, WriteOptions
from gateway.spark.stompclient import StompClient
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
}
# Headers a row may not set: the transport's own, and the ones columns set.
RESERVED_HEADERS = frozenset({"destination", "transaction", "receipt", "content-length", "priority", "persistent"})


def check_schema(schema: StructType) -> None:
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


def send_frame(destination: str, transaction: str, row: Any) -> frames.Send:
    """The SEND for one row; a bad value raises and so fails (and rolls back) the task."""
    values = row.asDict()
    headers = {"destination": destination, "transaction": transaction}
    user_headers = values.get("headers") or {}
    clash = RESERVED_HEADERS.intersection(user_headers)
    if clash:
        raise ValueError(f"row headers may not set {', '.join(sorted(clash))}; use the priority/persistent columns")
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


@dataclasses.dataclass
class SentPartition(WriterCommitMessage):
    partition: int
    rows: int
    duplicate: bool  # the broker had committed this key already and dropped the replay


def send_partition(options: WriteOptions, rows: Iterator[Any], partition: int, key: str) -> SentPartition:
    """Executor side: the partition's rows in one transaction, committed with ``key``."""
    transaction = f"spark-{uuid.uuid4().hex}"
    count = 0
    with StompClient(options.stomp_host, options.stomp_port, timeout_s=options.endpoint.timeout_s) as client:
        client.connect(options.stomp_host, options.endpoint.user, options.endpoint.password)
        client.send_frame(frames.Begin({"transaction": transaction}))
        for row in rows:
            client.send_frame(send_frame(options.destination, transaction, row))
            count += 1
        receipt = client.request(frames.Commit({"transaction": transaction, "idempotency-key": key}))
        client.disconnect()
    return SentPartition(partition, count, receipt.headers.get("duplicate") == "true")


class GatewayWriter(DataSourceWriter):
    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        check_schema(schema)
        self.options = options
        self.write_id = uuid.uuid4().hex  # one per save(), shared by the retries of its tasks

    def write(self, iterator: Iterator[Any]) -> SentPartition:
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        return send_partition(self.options, iterator, partition, f"spark-write:{self.write_id}:{partition}")


class GatewayStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        check_schema(schema)
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
        """Each partition committed its own transaction already."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Failed tasks left nothing (their transactions rolled back); committed
        ones stay committed, and Spark's replay of this batch id is deduplicated
        by the broker."""
