"""The store port: what the core keeps on disk, as plain records, and the
protocol a store satisfies.

This module is the contract between the core and ``persistence``: the core
declares it, ``persistence.store.Store`` satisfies it structurally, and
``gateway/app.py`` wires the two.  It imports nothing but the standard
library (not even under TYPE_CHECKING), so persistence may import it without
depending on any of the core's classes; the core turns its ``Message`` into a
:class:`StoredMessage` (``Message.record``) and what the store recovered back
into queues (``core.recovery``).

The records are ``NamedTuple``\\ s: frozen and without a ``__dict__``, like a
frozen slotted dataclass, but built in a third of its time; one is built for
every persistent message stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol


class StoredMessage(NamedTuple):
    """One persistent message as the store keeps it: the one shape from the
    core's port to the record codec and back.

    ``headers`` and ``body`` are None in recovered records (metadata only:
    they stay on disk until :meth:`MessageStore.load`).  ``location`` is where
    the store keeps the record: -1 in a record handed to the store, set in
    every record the store hands back.
    """

    id: str
    destination: str  # the address text
    headers: dict[str, str] | None
    body: bytes | None
    priority: int
    expires: int  # epoch ms, 0 = never
    timestamp: int  # epoch ms
    delivery_count: int  # earlier deliveries
    location: int = -1


class StoredSubscription(NamedTuple):
    """A durable subscription as kept: its key (``core.durables.durable_key``),
    topic pattern, selector text and the name of the principal that owns it
    (None: stored before owners were recorded)."""

    key: str
    pattern: str
    selector: str | None
    owner: str | None


class Retained(NamedTuple):
    """A topic's retained message and the MQTT QoS it was published at (None
    when another protocol published it)."""

    message: StoredMessage
    qos: int | None


@dataclass(slots=True)
class Recovered:
    """What a store found when it opened.  ``queues`` maps each queue key (a
    queue's address text or a durable subscription's key) to its messages in
    append order, metadata only; after a clean stop their ``delivery_count``
    includes the deliveries noted then.  ``kv`` holds every namespace's notes
    (``MessageStore.note``) as kept."""

    clean: bool
    subscriptions: list[StoredSubscription]
    queues: dict[str, list[StoredMessage]]
    retained: list[Retained]
    commit_keys: list[str]  # idempotency keys of committed transactions, oldest first
    kv: dict[str, dict[str, bytes]]
    corrupt_records: int
    torn_bytes: int
    replayed_records: int
    seconds: float


class MessageStore(Protocol):
    """Where persistent messages and durable subscriptions are kept.

    Every call appends and returns at once with a log sequence number (LSN);
    the write happens later, in batches (group commit).  Whatever promises
    durability to a client waits until ``durable_lsn`` reaches that LSN.
    ``key`` names a queue that holds stored messages: a queue's address text,
    or a durable subscription's key.
    """

    @property
    def durable_lsn(self) -> int: ...

    def add_message(self, message: StoredMessage, keys: Sequence[str]) -> tuple[int, int]:
        """Store once for every queue in ``keys``: ``(lsn, location)``."""
        ...

    def ack(self, key: str, message_id: str) -> int: ...

    def transaction(
        self,
        adds: Sequence[tuple[StoredMessage, Sequence[str]]],
        acks: Sequence[tuple[str, str]],
        *,
        archived: Sequence[tuple[str, StoredMessage]] = (),
        commit_key: str | None = None,
    ) -> tuple[int, list[int]]:
        """All of it or none of it, as one record: stored messages (with their
        queue keys), acks (``(key, message id)``), messages kept in topic
        archives (``(topic name, message)``) and the idempotency key of the
        COMMIT (None without one).  ``(lsn, the location of each add)``."""
        ...

    def archive_message(self, topic: str, message: StoredMessage) -> int:
        """Keep ``message`` at the next offset of ``topic``'s archive
        (``topic`` is the name without ``/topic/``)."""
        ...

    def forget_commit_key(self, key: str) -> int:
        """An idempotency key fell out of the remembered window."""
        ...

    def add_subscription(self, key: str, pattern: str, selector: str | None = None, owner: str | None = None) -> int:
        """Keep a durable subscription: its topic, selector and the name of
        the principal that owns it (see core.durables.claim_refusal)."""
        ...

    def remove_subscription(self, key: str) -> int: ...

    def load(self, location: int, destination: str) -> StoredMessage | None:
        """The whole message stored at ``location`` (headers and body).  None
        when its record is unreadable (a bad checksum, undecodable): the store
        has reported it (naming ``destination``) and counted it, and the
        caller drops the message."""
        ...

    def retain(self, topic: str, message: StoredMessage | None, qos: int | None = None) -> int:
        """Keep ``message`` as the retained message of ``topic`` (None clears)."""
        ...

    def note(self, namespace: str, key: str, value: bytes | None) -> int:
        """Keep a small piece of protocol state across restarts (None forgets
        it); recovery hands back each namespace's notes."""
        ...


class NoStore:
    """The store of a broker that keeps nothing: every LSN is 0, always durable."""

    durable_lsn = 0

    def add_message(self, message: StoredMessage, keys: Sequence[str]) -> tuple[int, int]:
        return 0, -1

    def ack(self, key: str, message_id: str) -> int:
        return 0

    def transaction(
        self,
        adds: Sequence[tuple[StoredMessage, Sequence[str]]],
        acks: Sequence[tuple[str, str]],
        *,
        archived: Sequence[tuple[str, StoredMessage]] = (),
        commit_key: str | None = None,
    ) -> tuple[int, list[int]]:
        return 0, [-1] * len(adds)

    def archive_message(self, topic: str, message: StoredMessage) -> int:
        return 0

    def forget_commit_key(self, key: str) -> int:
        return 0

    def add_subscription(self, key: str, pattern: str, selector: str | None = None, owner: str | None = None) -> int:
        return 0

    def remove_subscription(self, key: str) -> int:
        return 0

    def retain(self, topic: str, message: StoredMessage | None, qos: int | None = None) -> int:
        return 0

    def note(self, namespace: str, key: str, value: bytes | None) -> int:
        return 0

    def load(self, location: int, destination: str) -> StoredMessage | None:
        raise LookupError(f"a message of {destination!r} has no body in memory and there is no store")

