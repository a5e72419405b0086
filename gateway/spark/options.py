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
import os
import re
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

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
TLS_KEYS = frozenset({"ssl.ca.location", "ssl.certificate.location", "ssl.key.location"})
COMMON = COMMON | TLS_KEYS
# Spark's Kafka source's names, where the concept is the same.
SELECT_KEYS = frozenset({"topic", "subscribe", "subscribepattern"})
READ_KEYS = COMMON | SELECT_KEYS | {
    "startingoffsets", "endingoffsets", "startingtimestamp", "endingtimestamp", "startingoffsetsbytimestamp",
    "endingoffsetsbytimestamp", "startingoffsetsbytimestampstrategy", "partitionsize", "minpartitions",
    "failondataloss", "includeheaders", "pushfilters",
}
STREAM_READ_KEYS = (READ_KEYS - {"endingoffsets", "endingtimestamp", "endingoffsetsbytimestamp", "pushfilters"}) | {
    "maxoffsetspertrigger", "minoffsetspertrigger", "maxtriggerdelay",
}
WRITE_KEYS = COMMON | {"stomp", "destination", "writeid", "transactionrows", "transactionbytes"}
DEFAULT_MAX_TRIGGER_DELAY_S = 15 * 60.0  # Kafka's maxTriggerDelay default, 15m
# Kafka options a user may reach for that mean nothing here, and why.
REFUSED = {
    "assign": "the archive has no partitions (a topic is one ordered log); name topics with subscribe or topic",
    "kafka.bootstrap.servers": "the broker is reached with url (its admin HTTP API) and, for writes, stomp",
    "groupidprefix": "the source keeps no consumer group: a stream's offsets live in its checkpoint",
    "kafka.group.id": "the source keeps no consumer group: a stream's offsets live in its checkpoint",
    "kafkaconsumer.polltimeoutms": "use timeout (seconds per HTTP or STOMP wait)",
    "fetchoffset.numretries": "offsets come from one HTTP answer; a failed request fails the query",
    "fetchoffset.retryintervalms": "offsets come from one HTTP answer; a failed request fails the query",
    "maxrecordsperpartition": "use partitionSize (offsets per Spark partition)",
    "topic@sink": "a sink's target is destination (/topic/<name> or /queue/<name>), or a topic or destination column",
    "kafka.security.protocol": "TLS follows the url's https scheme and the stomp ssl:// form, with ssl.ca.location",
}


class OptionError(ValueError):
    """An option is missing, unknown or malformed; the message says which and why."""


REDACTED = "***"


def redacted_url(url: str) -> str:
    """``url`` with the password of a ``user:password@`` in it as ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{REDACTED}@{host}"))


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """How to reach the admin API (executors fetch from it too)."""

    url: str  # base URL, no trailing slash: http://gateway:8161
    user: str | None
    password: str | None
    timeout_s: float
    # TLS (an https url, a stomp ssl:// address): PEM files, librdkafka's names.
    ca_file: str | None = None  # ssl.ca.location: the CA that signed the broker's certificate
    cert_file: str | None = None  # ssl.certificate.location: a client certificate, if the broker asks
    key_file: str | None = None  # ssl.key.location

    def __repr__(self) -> str:
        # Spark prints a source's options in plans, logs and errors: the
        # password (and one written into the url) shows as ***.
        shown = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        shown["url"] = redacted_url(self.url)
        if self.password is not None:
            shown["password"] = REDACTED
        return f"Endpoint({', '.join(f'{name}={value!r}' for name, value in shown.items())})"

    __str__ = __repr__

    def tls_context(self) -> ssl.SSLContext:
        """A client context trusting ``ca_file`` (else the system's CAs)."""
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file is not None:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


@dataclasses.dataclass(frozen=True)
class OffsetSpec:
    """``earliest``/``latest`` for every topic, or per-topic offsets over a default."""

    default: int  # EARLIEST or LATEST
    per_topic: tuple[tuple[str, int], ...] = ()

    def offset_for(self, topic: str) -> int:
        return dict(self.per_topic).get(topic, self.default)


@dataclasses.dataclass(frozen=True)
class Selection:
    """Which archived topics a read takes: core patterns (``topic``, or
    ``subscribe``'s comma list) or a regular expression (``subscribePattern``)
    matched against whole core names, as Kafka's matches topic names."""

    patterns: tuple[str, ...] = ()  # plant.*.temp (core names, without /topic/)
    regex: str | None = None
    given: str = ""  # as the user wrote it, for messages

    def matches(self, topic: str) -> bool:
        if self.regex is not None:
            return re.fullmatch(self.regex, topic) is not None
        levels = tuple(topic.split("."))
        return any(names.matches(tuple(p.split(".")), levels) for p in self.patterns)


@dataclasses.dataclass(frozen=True)
class TimeSpec:
    """A start or end by time (Kafka's ``startingTimestamp`` and
    ``startingOffsetsByTimestamp``): ms since the epoch, for every topic or per topic."""

    default_ms: int | None
    per_topic: tuple[tuple[str, int], ...] = ()

    def ms_for(self, topic: str) -> int | None:
        return dict(self.per_topic).get(topic, self.default_ms)


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    endpoint: Endpoint
    selection: Selection
    starting: OffsetSpec
    ending: OffsetSpec
    partition_size: int
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    push_filters: bool = False  # batch: take Spark's offset/timestamp/topic filters (see pushdown.py)
    starting_time: TimeSpec | None = None  # over starting, as Kafka's timestamps are
    ending_time: TimeSpec | None = None
    # No offset at or after a starting timestamp: fail ("error", Kafka's default) or start at latest.
    time_strategy: str = "error"
    min_partitions: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_s: float = DEFAULT_MAX_TRIGGER_DELAY_S


@dataclasses.dataclass(frozen=True)
class WriteOptions:
    endpoint: Endpoint
    stomp_host: str
    stomp_port: int
    destination: str | None  # None: every row names its own (a destination or topic column)
    write_id: str | None  # batch writes: the job identity idempotency keys derive from
    stomp_tls: bool  # stomp=ssl://host:port
    transaction_rows: int
    transaction_bytes: int


def _check_keys(options: Mapping[str, str], allowed: frozenset[str], what: str) -> dict[str, str]:
    given = {str(k).lower(): str(v) for k, v in options.items()}
    unknown = sorted(set(given) - allowed - SPARK_KEYS)
    if unknown:
        why = "".join(
            f"; {key}: {REFUSED.get(key + '@sink' if what == 'sink' else key) or REFUSED.get(key, '')}"
            for key in unknown if REFUSED.get(key + "@sink" if what == "sink" else key) or REFUSED.get(key)
        )
        raise OptionError(f"unknown option(s) for a gateway {what}: {', '.join(unknown)}{why}; known: {', '.join(sorted(allowed))}")
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
        raise OptionError(f"option url must be an http(s) URL with a host, got {redacted_url(url)!r}")
    files = {}
    for key in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location"):
        path = given.get(key)
        if path is not None and not os.path.isfile(path):
            raise OptionError(f"option {key}: no such file {path!r} (a PEM file, readable on the driver and every executor)")
        files[key] = path
    if (files["ssl.certificate.location"] is None) != (files["ssl.key.location"] is None):
        raise OptionError("options ssl.certificate.location and ssl.key.location go together (a client certificate and its key)")
    return Endpoint(
        url.rstrip("/"), given.get("user"), given.get("password"), _timeout_s(given),
        files["ssl.ca.location"], files["ssl.certificate.location"], files["ssl.key.location"],
    )


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


def selection(given: dict[str, str]) -> Selection:
    """Exactly one of topic (a pattern), subscribe (a comma list) and subscribePattern (a regex)."""
    chosen = [key for key in ("topic", "subscribe", "subscribepattern") if given.get(key)]
    if not chosen and given.get("path"):
        given["topic"], chosen = given["path"], ["topic"]  # .load("plant.*.temp")
    if not chosen:
        raise OptionError(
            "option topic is required: a topic or pattern such as plant.*.temp or plant/+/temp (or subscribe,"
            " a comma list of them, or subscribePattern, a regular expression over names like plant.1.temp)"
        )
    if len(chosen) > 1:
        raise OptionError(f"give only one of the options topic, subscribe and subscribePattern; given: {', '.join(chosen)}")
    text = given[chosen[0]]
    if chosen[0] == "subscribepattern":
        try:
            re.compile(text)
        except re.error as error:
            raise OptionError(f"subscribePattern {text!r} is not a regular expression: {error}") from None
        return Selection(regex=text, given=f"subscribePattern {text!r}")
    parts = [part.strip() for part in text.split(",")] if chosen[0] == "subscribe" else [text]
    if any(not part for part in parts):
        raise OptionError(f"option {chosen[0]} has an empty topic name: {text!r}")
    return Selection(tuple(topic_name(part, pattern=True) for part in parts), given=f"{chosen[0]} {text!r}")


def _millis(text: str, key: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise OptionError(f"{key} must be milliseconds since the epoch, got {text!r}") from None
    if value < 0:
        raise OptionError(f"{key} must be milliseconds since the epoch, got {text!r}")
    return value


def time_spec(given: dict[str, str], single: str, by_topic: str, name: str) -> TimeSpec | None:
    """Kafka's precedence: the one timestamp over the per-topic JSON."""
    if given.get(single) is not None:
        return TimeSpec(_millis(given[single], name.replace("OffsetsByTimestamp", "Timestamp")))
    text = given.get(by_topic)
    if text is None:
        return None
    try:
        mapping = json.loads(text)
    except ValueError:
        mapping = None
    if not isinstance(mapping, dict):
        raise OptionError(f'{name} must be JSON like {{"plant.1.temp": 1700000000000}} (ms since the epoch per topic), got {text!r}')
    per_topic = []
    for topic, value in mapping.items():
        if isinstance(value, dict):
            raise OptionError(f"{name}: {topic!r} maps to partitions; a topic here is one log: give it one timestamp")
        if type(value) is not int:
            raise OptionError(f"{name}: the timestamp of {topic!r} must be an integer (ms since the epoch), got {value!r}")
        per_topic.append((topic_name(topic, pattern=False), _millis(str(value), name)))
    return TimeSpec(None, tuple(sorted(per_topic)))


def read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    given = _check_keys(options, STREAM_READ_KEYS if streaming else READ_KEYS, "stream source" if streaming else "source")
    chosen = selection(given)
    # As Spark's Kafka source: a new batch reads everything, a new stream only what comes next.
    starting = offset_spec(given.get("startingoffsets"), "startingOffsets", LATEST if streaming else EARLIEST)
    ending = offset_spec(given.get("endingoffsets"), "endingOffsets", LATEST)
    if ending.default == EARLIEST or any(o == EARLIEST for _, o in ending.per_topic):
        raise OptionError("endingOffsets cannot be earliest (the range would be empty)")
    starting_time = time_spec(given, "startingtimestamp", "startingoffsetsbytimestamp", "startingOffsetsByTimestamp")
    ending_time = time_spec(given, "endingtimestamp", "endingoffsetsbytimestamp", "endingOffsetsByTimestamp")
    for topic, _ in starting.per_topic + ending.per_topic + (starting_time.per_topic if starting_time else ()) + (ending_time.per_topic if ending_time else ()):
        if not chosen.matches(topic):
            raise OptionError(f"offsets or timestamps name topic {topic!r}, which {chosen.given} does not match")
    strategy = given.get("startingoffsetsbytimestampstrategy", "error").lower()
    if strategy not in ("error", "latest"):
        raise OptionError(f"startingOffsetsByTimestampStrategy must be error or latest, got {strategy!r}")
    if given.get("includeheaders", "true").lower() not in ("true", "false"):
        raise OptionError(f"includeHeaders must be true or false, got {given['includeheaders']!r}")
    delay = given.get("maxtriggerdelay")
    return ReadOptions(
        endpoint=endpoint(given),
        selection=chosen,
        starting=starting,
        ending=ending,
        partition_size=_positive_int(given, "partitionsize", "partitionSize") or DEFAULT_PARTITION_SIZE,
        max_offsets_per_trigger=_positive_int(given, "maxoffsetspertrigger", "maxOffsetsPerTrigger"),
        fail_on_data_loss=_bool(given, "failondataloss", "failOnDataLoss", True),
        push_filters=_bool(given, "pushfilters", "pushFilters", False),
        starting_time=starting_time,
        ending_time=ending_time,
        time_strategy=strategy,
        min_partitions=_positive_int(given, "minpartitions", "minPartitions"),
        min_offsets_per_trigger=_positive_int(given, "minoffsetspertrigger", "minOffsetsPerTrigger"),
        max_trigger_delay_s=DEFAULT_MAX_TRIGGER_DELAY_S if delay is None else duration_s(delay, "maxTriggerDelay"),
    )


DURATION_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def duration_s(text: str, name: str) -> float:
    """Spark's duration strings, as Kafka's maxTriggerDelay takes them: 15m, 30s, 500ms, 1h."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", text.lower())
    unit = match.group(2) if match else ""
    if match is None or (unit and unit not in DURATION_UNITS_S):
        raise OptionError(f"{name} must be a duration such as 15m, 30s or 500ms, got {text!r}")
    return float(match.group(1)) * DURATION_UNITS_S[unit or "ms"]


def write_options(options: Mapping[str, str]) -> WriteOptions:
    given = _check_keys(options, WRITE_KEYS, "sink")
    # The STOMP address defaults to the admin URL's host; with stomp= the URL is optional.
    point = endpoint(given, required=not given.get("stomp"))
    stomp = given.get("stomp")
    tls = False
    if stomp:
        address = stomp
        if address.lower().startswith("ssl://"):  # STOMP over TLS (the broker's stomp_tls_port)
            address, tls = address[len("ssl://"):], True
        host, colon, port_text = address.rpartition(":")
        if not colon or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise OptionError(f"option stomp must be host:port, or ssl://host:port for TLS, got {stomp!r}")
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
        point, host, port, destination, write_id, tls,
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
