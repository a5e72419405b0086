"""The small interfaces through which the core speaks to the world.

Implemented by ``gateway`` (sinks, clocks) and ``persistence`` (the store),
structurally: neither side imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from core.messages import Message


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; for deadlines."""
        ...

    def wall_ms(self) -> int:
        """Milliseconds since the epoch; for message timestamps and expiry."""
        ...


class Sink(Protocol):
    """Where a connection receives deliveries: it appends them to its outbox.

    ``accepting`` goes false while the connection's outbox is over its
    high-water mark; the core then holds messages back (in the queue, or in a
    topic subscription's bounded buffer) until the connection calls
    :meth:`core.broker.Client.resume`.
    """

    accepting: bool

    # ``subscription``: a core.subscriptions.Subscription, not imported here,
    # so this module stays a leaf that the core's modules all depend on.
    def deliver(self, subscription: Any, message: Message) -> bool | None:
        """Hand over one message.  True means it needs no acknowledgement
        after all (settled on the spot), whatever the subscription's ack mode."""
        ...

    def unblocked(self) -> None:
        """The queues this client's producing was held back by have drained
        (see ``Client.blocked_on``): it may read and send again."""
        ...


class Store(Protocol):
    """Where persistent messages and durable subscriptions are kept.

    Every call appends and returns at once with a log sequence number (LSN);
    the write happens later, in batches (group commit).  Whatever promises
    durability to a client waits until ``durable_lsn`` reaches that LSN.
    ``key`` names a queue that holds stored messages: a queue's address text,
    or a durable subscription's key.
    """

    @property
    def durable_lsn(self) -> int: ...

    def add_message(self, message: Message, keys: list[str]) -> int:
        """Store once for every queue in ``keys``; sets ``message.location``."""
        ...

    def ack(self, key: str, message: Message) -> int: ...

    def transaction(
        self,
        adds: list[tuple[Message, list[str]]],
        acks: list[tuple[str, Message]],
        *,
        archived: Sequence[tuple[str, Message]] = (),
        commit_key: str | None = None,
    ) -> int:
        """All of it or none of it, as one record: stored messages, acks,
        messages kept in topic archives (``(topic name, message)``) and the
        idempotency key of the COMMIT (None without one)."""
        ...

    def archive(self, topic: str, message: Message) -> int:
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

    def load(self, message: Message) -> bool:
        """Fill in a stub's headers and body from disk.  False when its record
        is unreadable (a bad checksum, undecodable): the store has reported
        and counted it, and the caller drops the message."""
        ...

    def retain(self, topic: str, message: Message | None) -> int:
        """Keep ``message`` as the retained message of ``topic`` (None clears)."""
        ...

    def note(self, namespace: str, key: str, value: bytes | None) -> int:
        """Keep a small piece of protocol state across restarts (None forgets
        it); recovery hands back each namespace's notes."""
        ...


class NoStore:
    """The store of a broker that keeps nothing: every LSN is 0, always durable."""

    durable_lsn = 0

    def add_message(self, message: Message, keys: list[str]) -> int:
        return 0

    def ack(self, key: str, message: Message) -> int:
        return 0

    def transaction(
        self,
        adds: list[tuple[Message, list[str]]],
        acks: list[tuple[str, Message]],
        *,
        archived: Sequence[tuple[str, Message]] = (),
        commit_key: str | None = None,
    ) -> int:
        return 0

    def archive(self, topic: str, message: Message) -> int:
        return 0

    def forget_commit_key(self, key: str) -> int:
        return 0

    def add_subscription(self, key: str, pattern: str, selector: str | None = None, owner: str | None = None) -> int:
        return 0

    def remove_subscription(self, key: str) -> int:
        return 0

    def retain(self, topic: str, message: Message | None) -> int:
        return 0

    def note(self, namespace: str, key: str, value: bytes | None) -> int:
        return 0

    def load(self, message: Message) -> bool:
        raise LookupError(f"message {message.id!r} has no body in memory and there is no store")
