"""The small interfaces through which the core speaks to the world (and hears the time and chance).

Implemented by ``gateway``, structurally.  The store port is
``core.storage.MessageStore``: a leaf module of plain records, so that
``persistence`` can implement it without importing any of the core's classes.
"""

from __future__ import annotations

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


class Entropy(Protocol):
    """Random bytes, for names that must not repeat from one run to the next
    (message ids, temporary destinations).  ``os.urandom`` is one (the app
    passes it); a test may pass a fixed one."""

    def __call__(self, size: int, /) -> bytes: ...


class Sink(Protocol):
    """Where a connection receives deliveries: it appends them to its outbox.

    ``accepting`` goes false while the connection's outbox is over its
    high-water mark; the core then holds messages back (in the queue, or in a
    topic subscription's bounded buffer) until the connection calls
    :meth:`core.broker.Client.resume`.
    """

    @property
    def accepting(self) -> bool: ...

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

    def revoked(self, revocation: Any) -> None:
        """A reload took a right this client was using (a
        core.revocation.Revocation: its user was removed, or subscriptions it
        may no longer read); nothing is delivered to it any more.  Tell the
        peer in the protocol's words and end the connection (its
        ``Client.close``) before returning."""
        ...
