"""The core's Store port over the persistence package: converts the core's
messages to stored records and back, and turns what recovery found into
queues and durable subscriptions.  No I/O scheduling here (that is app.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core import names
from core.destinations import Queue
from core.durables import parse_durable_key
from core.messages import Message
from persistence import records
from persistence.archive import Archive
from persistence.store import Recovered, Store, StoredMessage

SYNC_POLICIES = ("always", "interval", "never")
# The store's key/value namespaces: delivery counts noted at a clean stop,
# and retained messages by topic.
REDELIVERIES = "redeliveries"
RETAINED = "retained"
# Idempotency keys of committed transactions, each with its commit's sequence
# number (so the oldest are known after a restart).
COMMIT_KEYS = "commit-keys"
# Between a stored durable subscription's pattern, its selector and its owner
# (see add_subscription).
SELECTOR_MARK = "\x00"


@dataclasses.dataclass(frozen=True)
class StoreSettings:
    # always: a receipt waits for fdatasync (group commit); interval: fsync at
    # most every sync_interval_ms and receipts do not wait; never: tests only.
    sync: str = "always"
    sync_interval_ms: int = 100
    segment_bytes: int = 32 * 1024 * 1024
    # Topic archives: segment size (retention drops whole segments).
    archive_segment_bytes: int = 16 * 1024 * 1024
    # How often the maintenance task checkpoints, collects and compacts (and
    # the free space of the data folder is looked at).
    maintenance_interval_s: float = 1.0
    # The disk alarm (RabbitMQ's disk_free_limit): below this many free bytes
    # on the data folder's filesystem persistent producers are held (or
    # refused, with send_fail_if_no_space) until space comes back; 0 = off.
    min_free_bytes: int = 50 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.sync not in SYNC_POLICIES:
            raise ValueError(f"store.sync must be one of {', '.join(SYNC_POLICIES)}, not {self.sync!r}")
        if self.min_free_bytes < 0:
            raise ValueError(f"store.min_free_bytes must not be negative, not {self.min_free_bytes}")
        if self.archive_segment_bytes <= 0:
            raise ValueError(f"store.archive_segment_bytes must be positive, not {self.archive_segment_bytes}")


def open_store(data_dir: str, settings: StoreSettings, log: Any) -> Store:
    def report(event: str, **fields: Any) -> None:
        # Corruption and recovery are worth an operator's attention; the
        # store says which with its event name.
        (log.warning if any(word in event for word in ("corrupt", "fail", "gap", "refused")) else log.info)(event, **fields)

    return Store(
        Path(data_dir) / "store",
        segment_bytes=settings.segment_bytes,
        sync=settings.sync,
        interval_ms=settings.sync_interval_ms,
        log=report,
        archive=Archive(Path(data_dir) / "archive", segment_bytes=settings.archive_segment_bytes, log=report),
    )


class BrokerStore:
    """Implements :class:`core.ports.Store` on a :class:`persistence.store.Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._commit_seq = 0
        # Locations whose record failed to read: never read (or reported) again.
        self._damaged: set[int] = set()

    @property
    def durable_lsn(self) -> int:
        return self.store.durable_lsn

    def add_message(self, message: Message, keys: list[str]) -> int:
        stored = _stored(message)
        lsn = self.store.add_message(stored, keys)
        message.location = stored.location
        return lsn

    def ack(self, key: str, message: Message) -> int:
        return self.store.ack(key, message.id)

    def transaction(
        self,
        adds: list[tuple[Message, list[str]]],
        acks: list[tuple[str, Message]],
        *,
        archived: Sequence[tuple[str, Message]] = (),
        commit_key: str | None = None,
    ) -> int:
        stored = [(_stored(message), keys) for message, keys in adds]
        puts = []
        if commit_key is not None:
            self._commit_seq += 1
            puts.append((COMMIT_KEYS, commit_key, b"%d" % self._commit_seq))
        lsn = self.store.transaction(
            stored,
            [(key, message.id) for key, message in acks],
            archived=[_archived(topic, m) for topic, m in archived],
            puts=puts,
        )
        for (message, _), (record, _) in zip(adds, stored):
            message.location = record.location
        return lsn

    def archive(self, topic: str, message: Message) -> int:
        return self.store.archive_message(*_archived(topic, message))

    def forget_commit_key(self, key: str) -> int:
        return self.store.delete(COMMIT_KEYS, key)

    def restored_commit_keys(self, recovered: Recovered) -> list[str]:
        """The remembered idempotency keys, oldest first; later commits
        number on from the newest."""
        numbered = []
        for key, value in recovered.kv.get(COMMIT_KEYS, {}).items():
            numbered.append((int(value) if value.isdigit() else 0, key))
        numbered.sort()
        if numbered:
            self._commit_seq = numbered[-1][0]
        return [key for _, key in numbered]

    def add_subscription(self, key: str, pattern: str, selector: str | None = None, owner: str | None = None) -> int:
        return self.store.add_subscription(key, encode_subscription(pattern, selector, owner))

    def remove_subscription(self, key: str) -> int:
        return self.store.remove_subscription(key)

    def load(self, message: Message) -> bool:
        location = message.location
        if location in self._damaged:
            return False
        try:
            stored = self.store.read_message(location)
        except (records.CorruptRecord, ValueError, IndexError) as exc:  # struct.error is a ValueError
            # Found only now because a clean start trusts its checkpoint and
            # leaves bodies on disk: handled as recovery would have, reported
            # once (every queue holding the record asks again).
            self._damaged.add(location)
            self.store.report_damaged(location, getattr(exc, "reason", None) or str(exc), destination=message.address.text)
            return False
        message.headers = stored.headers
        message.body = stored.body
        return True

    def retain(self, topic: str, message: Message | None) -> int:
        return self.note(RETAINED, topic, None if message is None else _encode_retained(message))

    def note(self, namespace: str, key: str, value: bytes | None) -> int:
        if value is None:
            return self.store.delete(namespace, key)
        return self.store.put(namespace, key, value)

    def remember_redeliveries(self, queues: list[Queue]) -> int:
        """At a clean stop: note which stored messages had been delivered, so
        they come back marked redelivered (the store keeps no count per
        delivery; that would cost a record per message)."""
        noted = 0
        for queue in queues:
            for message in queue.pending:
                # Only those delivered in this run: they were loaded to go out,
                # so they have a body.  (A stub marked redelivered by a crash
                # recovery and never sent since is not worth a record each;
                # there may be millions.)
                if message.redeliveries and message.location >= 0 and message.body is not None:
                    self.store.put(REDELIVERIES, message.id, b"%d" % message.redeliveries)
                    noted += 1
        return noted

    def forget_redeliveries(self, recovered: Recovered) -> None:
        """Once restored, the notes of the last stop are spent."""
        for message_id in recovered.kv.get(REDELIVERIES, {}):
            self.store.delete(REDELIVERIES, message_id)


def _archived(topic: str, m: Message) -> tuple[str, str, dict[str, str], bytes, int, int]:
    """What the store keeps of a message in ``topic``'s archive."""
    return (topic, m.id, m.headers, m.body or b"", m.priority, m.timestamp)


def _encode_retained(message: Message) -> bytes:
    # The message codec of the journal, with the MQTT QoS where queue keys go
    # (a retained message belongs to no queue).
    qos = f"qos:{message.qos}" if message.qos is not None else "qos:"
    return records.encode_message(
        message.id, message.address.text, message.headers, message.body,
        message.priority, message.expires, message.timestamp, 0, [qos],
    )


def restored_retained(recovered: Recovered) -> list[Message]:
    out = []
    for value in recovered.kv.get(RETAINED, {}).values():
        try:
            message_id, destination, headers, body, priority, expires, timestamp, _, keys = records.decode_message(value)
        except (records.CorruptRecord, ValueError, IndexError):
            continue
        address = names.parse(destination)
        if isinstance(address, str):
            continue
        qos_text = keys[0][4:] if keys and keys[0].startswith("qos:") else ""
        out.append(
            Message(
                message_id, address, headers, body, persistent=True, priority=priority, expires=expires,
                timestamp=timestamp, qos=int(qos_text) if qos_text.isdigit() else None,
            )
        )
    return out


def encode_subscription(pattern: str, selector: str | None, owner: str | None) -> str:
    """The store keeps a subscription's description as one opaque string:
    the pattern, then after a NUL (which no destination name or selector can
    hold) the selector, then after another the owner's name ("" for the
    anonymous principal).  Folders written before selectors, or before
    owners, were kept read as having none (see :func:`decode_subscription`)."""
    if owner is None:
        return pattern if selector is None else f"{pattern}{SELECTOR_MARK}{selector}"
    return f"{pattern}{SELECTOR_MARK}{selector or ''}{SELECTOR_MARK}{owner}"


def decode_subscription(stored: str) -> tuple[str, str | None, str | None]:
    """(pattern, selector or None, owner or None) of :func:`encode_subscription`."""
    parts = stored.split(SELECTOR_MARK, 2)
    selector = parts[1] if len(parts) > 1 and parts[1] else None
    return parts[0], selector, parts[2] if len(parts) > 2 else None


def restored(
    recovered: Recovered,
) -> tuple[dict[str, tuple[str, str, names.Address, str | None, str | None]], dict[str, list[Message]], int]:
    """What :meth:`core.broker.Broker.restore` takes, from what the store
    recovered, and how many records it had to skip as unusable.

    After a crash nobody knows which stored messages were on their way to a
    consumer, so every one comes back marked redelivered (JMS allows a false
    "redelivered", never a false "not redelivered").
    """
    skipped = 0
    subscriptions: dict[str, tuple[str, str, names.Address, str | None, str | None]] = {}
    for key, stored in recovered.subscriptions.items():
        named = parse_durable_key(key)
        pattern, selector, owner = decode_subscription(stored)
        address = names.parse(pattern)
        if named is None or isinstance(address, str):
            skipped += 1
            continue
        subscriptions[key] = (named[0], named[1], address, selector, owner)
    at_least = 0 if recovered.clean else 1
    noted = recovered.kv.get(REDELIVERIES, {})
    queues: dict[str, list[Message]] = {}
    for key, stored_messages in recovered.queues.items():
        messages = []
        for record in stored_messages:
            address = names.parse(record.destination)
            if isinstance(address, str):
                skipped += 1
                continue
            messages.append(
                Message(
                    record.id,
                    address,
                    None,
                    None,
                    persistent=True,
                    priority=record.priority,
                    expires=record.expires,
                    timestamp=record.timestamp,
                    redeliveries=max(record.delivery_count, at_least, int(noted.get(record.id, b"0"))),
                    location=record.location,
                )
            )
        queues[key] = messages
    return subscriptions, queues, skipped


def _stored(message: Message) -> StoredMessage:
    return StoredMessage(
        message.id,
        message.address.text,
        message.headers,
        message.body,
        message.priority,
        message.expires,
        message.timestamp,
        message.redeliveries,
    )
