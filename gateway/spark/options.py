"""The data source's options, checked on the driver when Spark plans the query.

Spark hands a Python data source its options as strings with lower-cased keys.
Everything is validated here, before a task runs, so a typo is one clear error
at ``load()``/``save()`` rather than a stack trace from an executor.

Offsets follow Spark's Kafka source: ``earliest``, ``latest`` or a JSON object
``{"plant.1.temp": 17, "plant.2.temp": -2}`` where -2 means earliest and -1
latest.  Topics the JSON does not name start at earliest and end at latest.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from urllib.parse import urlsplit

from core import names
from gateway.mqtt import topics

EARLIEST = -2
LATEST = -1
DEFAULT_PARTITION_SIZE = 100_000  # rows; ~15 MB of 128-byte messages per task
DEFAULT_STOMP_PORT = 61613
DEFAULT_TIMEOUT_S = 30.0
# A write's transactions: at most the broker's default max_transaction_messages
# rows, and half its max_transaction_bytes_per_client (64 MiB) of bodies and headers.
DEFAULT_TRANSACTION_ROWS = 100_000
DEFAULT_TRANSACTION_BYTES = 32 * 1024 * 1024
MAX_WRITE_ID_CHARS = 200

# Keys Spark itself may put into a source's or sink's options.
SPARK_KEYS = frozenset({"path", "checkpointlocation"})
COMMON = frozenset({"url", "user", "password", "timeout"})
READ_KEYS = COMMON | {"topic", "startingoffsets", "endingoffsets", "partitionsize", "failondataloss", "pushfilters"}
STREAM_READ_KEYS = (READ_KEYS - {"endingoffsets", "pushfilters"}) | {"maxoffsetspertrigger"}
WRITE_KEYS = COMMON | {"stomp", "destination", "writeid", "transactionrows", "transactionbytes"}


class OptionError(ValueError):
    """An option is missing, unknown or malformed; the message says which and why."""


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """How to reach the admin API (executors fetch from it too)."""

    url: str  # base URL, no trailing slash: http://gateway:8161
    user: str | None
    password: str | None
    timeout_s: float


@dataclasses.dataclass(frozen=True)
class OffsetSpec:
    """``earliest``/``latest`` for every topic, or per-topic offsets over a default."""

    default: int  # EARLIEST or LATEST
    per_topic: tuple[tuple[str, int], ...] = ()

    def offset_for(self, topic: str) -> int:
        return dict(self.per_topic).get(topic, self.default)


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    endpoint: Endpoint
    pattern: str  # core topic name or pattern without /topic/: plant.*.temp
    starting: OffsetSpec
    ending: OffsetSpec
    partition_size: int
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    push_filters: bool = False  # batch: take Spark's offset/timestamp/topic filters (see pushdown.py)


@dataclasses.dataclass(frozen=True)
class WriteOptions:
    endpoint: Endpoint
    stomp_host: str
    stomp_port: int
    destination: str | None  # None: every row names its own (a destination or topic column)
    write_id: str | None  # batch writes: the job identity idempotency keys derive from
    transaction_rows: int
    transaction_bytes: int


def _check_keys(options: Mapping[str, str], allowed: frozenset[str], what: str) -> dict[str, str]:
    given = {str(k).lower(): str(v) for k, v in options.items()}
    unknown = sorted(set(given) - allowed - SPARK_KEYS)
    if unknown:
        raise OptionError(f"unknown option(s) for a gateway {what}: {', '.join(unknown)}; known: {', '.join(sorted(allowed))}")
    return given


def _positive_int(given: dict[str, str], key: str, name: str) -> int | None:
    text = given.get(key)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"{name} must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise OptionError(f"{name} must be a positive integer, got {text!r}")
    return value


def _bool(given: dict[str, str], key: str, name: str, default: bool) -> bool:
    text = given.get(key)
    if text is None:
        return default
    if text.lower() not in ("true", "false"):
        raise OptionError(f"{name} must be true or false, got {text!r}")
    return text.lower() == "true"


def _timeout_s(given: dict[str, str]) -> float:
    text = given.get("timeout", str(DEFAULT_TIMEOUT_S))
    try:
        value = float(text)
    except ValueError:
        raise OptionError(f"timeout must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise OptionError(f"timeout must be positive, got {text!r}")
    return value


def endpoint(given: dict[str, str], *, required: bool = True) -> Endpoint:
    url = given.get("url", "")
    if not url and required:
        raise OptionError("option url is required: the broker's admin HTTP base URL, e.g. http://127.0.0.1:8161")
    parts = urlsplit(url)
    if url and (parts.scheme not in ("http", "https") or not parts.hostname):
        raise OptionError(f"option url must be an http(s) URL with a host, got {url!r}")
    return Endpoint(url.rstrip("/"), given.get("user"), given.get("password"), _timeout_s(given))


def topic_name(text: str, *, pattern: bool) -> str:
    """The core name (``plant.1.temp``) of a topic given in any accepted form:
    core (``plant.*.temp``), STOMP (``/topic/plant.*.temp``) or MQTT
    (``plant/+/temp``).  A name with ``/`` but no ``/topic/`` prefix is MQTT."""
    if text.startswith(names.Kind.TOPIC.value):
        address = names.parse(text)
    elif any(text.startswith(kind.value) for kind in names.Kind):
        raise OptionError(f"{text!r} is not a topic: only topics are archived")
    elif "/" in text or "+" in text or "#" in text:
        for i, level in enumerate(levels := text.split("/")):
            if ("+" in level and level != "+") or ("#" in level and (level != "#" or i != len(levels) - 1)):
                raise OptionError(f"{text!r} is not a valid MQTT topic filter: + and # must be whole levels, # the last")
        address = topics.to_pattern(text)
    else:
        address = names.topic(text)
    if isinstance(address, str):
        raise OptionError(f"{text!r} is not a valid topic: {address}")
    if not pattern and address.is_pattern:
        raise OptionError(f"{text!r} names no single topic")
    return address.name


def offset_spec(text: str | None, key: str, default: int) -> OffsetSpec:
    if text is None:
        return OffsetSpec(default)
    lowered = text.strip().lower()
    if lowered == "earliest":
        return OffsetSpec(EARLIEST)
    if lowered == "latest":
        return OffsetSpec(LATEST)
    try:
        given = json.loads(text)
    except ValueError:
        raise OptionError(f'{key} must be earliest, latest or JSON like {{"plant.1.temp": 17}}, got {text!r}') from None
    if not isinstance(given, dict):
        raise OptionError(f'{key} JSON must be an object of topic -> offset, got {text!r}')
    per_topic = []
    for topic, offset in given.items():
        if type(offset) is not int or offset < EARLIEST:
            raise OptionError(f"{key}: the offset of {topic!r} must be an integer >= 0, or -2 (earliest) or -1 (latest), got {offset!r}")
        per_topic.append((topic_name(topic, pattern=False), offset))
    return OffsetSpec(default, tuple(sorted(per_topic)))


def read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    given = _check_keys(options, STREAM_READ_KEYS if streaming else READ_KEYS, "stream source" if streaming else "source")
    text = given.get("topic") or given.get("path")
    if not text:
        raise OptionError("option topic is required: a topic or pattern such as plant.*.temp or plant/+/temp")
    pattern = topic_name(text, pattern=True)
    # As Spark's Kafka source: a new batch reads everything, a new stream only what comes next.
    starting = offset_spec(given.get("startingoffsets"), "startingOffsets", LATEST if streaming else EARLIEST)
    ending = offset_spec(given.get("endingoffsets"), "endingOffsets", LATEST)
    if ending.default == EARLIEST or any(o == EARLIEST for _, o in ending.per_topic):
        raise OptionError("endingOffsets cannot be earliest (the range would be empty)")
    for topic, _ in starting.per_topic + ending.per_topic:
        if not names.matches(tuple(pattern.split(".")), tuple(topic.split("."))):
            raise OptionError(f"offsets name topic {topic!r}, which the topic option {text!r} does not match")
    return ReadOptions(
        endpoint=endpoint(given),
        pattern=pattern,
        starting=starting,
        ending=ending,
        partition_size=_positive_int(given, "partitionsize", "partitionSize") or DEFAULT_PARTITION_SIZE,
        max_offsets_per_trigger=_positive_int(given, "maxoffsetspertrigger", "maxOffsetsPerTrigger"),
        fail_on_data_loss=_bool(given, "failondataloss", "failOnDataLoss", True),
        push_filters=_bool(given, "pushfilters", "pushFilters", False),
    )


def write_options(options: Mapping[str, str]) -> WriteOptions:
    given = _check_keys(options, WRITE_KEYS, "sink")
    # The STOMP address defaults to the admin URL's host; with stomp= the URL is optional.
    point = endpoint(given, required=not given.get("stomp"))
    stomp = given.get("stomp")
    if stomp:
        host, colon, port_text = stomp.rpartition(":")
        if not colon or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise OptionError(f"option stomp must be host:port, got {stomp!r}")
        host, port = host.strip("[]"), int(port_text)
    else:
        host, port = urlsplit(point.url).hostname or "", DEFAULT_STOMP_PORT
    destination = given.get("destination") or None
    if destination is not None:
        destination = destination_name(destination, "option destination")
    write_id = given.get("writeid")
    if write_id is not None and not (0 < len(write_id) <= MAX_WRITE_ID_CHARS and write_id.isprintable()):
        raise OptionError(f"writeId must be 1 to {MAX_WRITE_ID_CHARS} printable characters, got {write_id[:40]!r}")
    return WriteOptions(
        point, host, port, destination, write_id,
        transaction_rows=_positive_int(given, "transactionrows", "transactionRows") or DEFAULT_TRANSACTION_ROWS,
        transaction_bytes=_positive_int(given, "transactionbytes", "transactionBytes") or DEFAULT_TRANSACTION_BYTES,
    )


def destination_name(text: str, what: str) -> str:
    """A STOMP destination a message can go to (``/queue/out``, ``/topic/a.b``);
    raises :class:`OptionError` (a ``ValueError``) saying why not."""
    parsed = names.parse(text)
    if isinstance(parsed, str):
        raise OptionError(f"{what} {text!r}: {parsed}")
    if parsed.is_pattern:
        raise OptionError(f"{what} {text!r} is a pattern; a message goes to one destination")
    return text
