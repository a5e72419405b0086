"""A subscription: one consumer of one queue, with its ack mode and prefetch window."""

from __future__ import annotations

from typing import Any

from core.destinations import AUTO, AckMode, Queue
from core.errors import UnknownMessage
from core.messages import Message
from core.names import Address
from core.ports import Sink

__all__ = ["AckMode", "Subscription"]  # AckMode lives with the queue that acts on it


class Subscription:
    """A consumer attached to a queue.

    A queue subscription consumes a shared queue.  A topic subscription owns a
    private queue that the topic fans messages into (``private``), so acks,
    prefetch and redelivery work the same for both.

    ``unacked`` holds messages delivered and not yet acked, in delivery order;
    its size against ``prefetch`` is the credit window.  ``token`` is the
    protocol session's own handle (a STOMP subscription id, say).
    """

    __slots__ = (
        "token", "address", "queue", "sink", "ack_mode", "prefetch", "unacked", "private", "owner", "durable", "selector",
        "priority", "exclusive", "shared",
    )

    def __init__(
        self,
        token: Any,
        address: Address,
        queue: Queue,
        sink: Sink,
        ack_mode: AckMode,
        prefetch: int,
        *,
        private: bool,
        owner: Any = None,
    ) -> None:
        self.token = token
        self.address = address
        self.queue = queue
        self.sink = sink
        self.ack_mode = ack_mode
        self.prefetch = prefetch
        self.unacked: dict[str, Message] = {}
        self.private = private
        self.owner = owner
        self.durable: Any = None  # the DurableSubscription this consumes, if any
        self.shared: Any = None  # its core.shared.Membership, if a shared group's member
        self.selector: Any = None  # a core.selectors.Selector, or None: every message
        self.priority = 0  # consumer priority: higher is served first while it has room
        self.exclusive = False  # an exclusive consumer gets the whole queue while it lives

    @property
    def has_room(self) -> bool:
        return self.sink.accepting and (self.ack_mode is AUTO or len(self.unacked) < self.prefetch)

    def take(self, message_id: str) -> list[Message]:
        """Remove and return what an ack or nack of ``message_id`` covers.

        Cumulative in CLIENT mode: every message delivered up to this one
        (STOMP 1.2 §SUBSCRIBE ack Header).
        """
        if message_id not in self.unacked:
            raise UnknownMessage(f"message {message_id!r} is not awaiting acknowledgement on this subscription")
        if self.ack_mode is not AckMode.CLIENT:
            return [self.unacked.pop(message_id)]
        taken = []
        for mid in self.unacked:
            taken.append(mid)
            if mid == message_id:
                break
        return [self.unacked.pop(mid) for mid in taken]

    def take_all(self) -> list[Message]:
        taken = list(self.unacked.values())
        self.unacked.clear()
        return taken
