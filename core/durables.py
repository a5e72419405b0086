"""Durable topic subscriptions: a named, stored queue that a topic keeps
filling while its subscriber is away (ActiveMQ's durable topic subscriber).

The topic tree holds the :class:`DurableSubscription` itself, not a consumer,
so routing is the same whether anyone is attached: the topic puts the message
in ``queue``; a returning subscriber attaches to that queue like any consumer
and drains what waited, in order.
"""

from __future__ import annotations

from core.destinations import Queue
from core.names import Address
from core.subscriptions import Subscription


def durable_key(client_id: str, name: str) -> str:
    """The store's name for a durable subscription.  Length-prefixed so no
    choice of client id and name can collide with another pair."""
    return f"durable:{len(client_id)}:{client_id}:{name}"


def parse_durable_key(key: str) -> tuple[str, str] | None:
    """(client id, name) from :func:`durable_key`, or None for any other key."""
    prefix, _, rest = key.partition(":")
    length, _, rest = rest.partition(":")
    if prefix != "durable" or not length.isdigit() or len(rest) < int(length) + 1:
        return None
    n = int(length)
    return rest[:n], rest[n + 1 :]


class DurableSubscription:
    """A durable subscription of ``client_id`` named ``name`` to ``pattern``."""

    __slots__ = ("key", "client_id", "name", "pattern", "queue", "active")

    def __init__(self, client_id: str, name: str, pattern: Address, queue: Queue) -> None:
        self.key = durable_key(client_id, name)
        self.client_id = client_id
        self.name = name
        self.pattern = pattern
        self.queue = queue
        self.active: Subscription | None = None

    def __repr__(self) -> str:
        state = "active" if self.active is not None else "offline"
        return f"DurableSubscription({self.key!r}, {self.pattern.text!r}, {state}, depth={self.queue.depth})"
