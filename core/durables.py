"""Durable topic subscriptions: a named, stored queue that a topic keeps
filling while its subscriber is away (ActiveMQ's durable topic subscriber).

The topic tree holds the :class:`DurableSubscription` itself, not a consumer,
so routing is the same whether anyone is attached: the topic puts the message
in ``queue``; a returning subscriber attaches to that queue like any consumer
and drains what waited, in order.
"""

from __future__ import annotations

from core.authorization import ANONYMOUS_PRINCIPAL, Principal
from core.destinations import Queue
from core.names import Address
from core.subscriptions import Subscription

# Client ids in these namespaces are the broker's own: an MQTT session's
# (the MQTT client id after "mqtt:") and a RabbitMQ-style durable's scope (the
# owning user after "user:").  A STOMP client-id may not start with either, so
# no STOMP client can name another protocol's or another user's durable state.
MQTT_PREFIX = "mqtt:"
USER_PREFIX = "user:"
RESERVED_PREFIXES = (MQTT_PREFIX, USER_PREFIX)
# The owner recorded for the anonymous principal (no user is named "").
ANONYMOUS_OWNER = ""


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


def owner_of(principal: Principal) -> str:
    """The owner name recorded with the durable state ``principal`` makes."""
    return ANONYMOUS_OWNER if principal is ANONYMOUS_PRINCIPAL else principal.name


def claim_refusal(owner: str | None, principal: Principal, secured: bool) -> str | None:
    """Why ``principal`` may not resume, replace or remove durable state
    recorded as ``owner``'s (None: stored before owners were recorded), or
    None if it may.  ``secured``: the broker has users, so an anonymous
    client may hold no durable state and ownerless state is nobody's (an
    administrator removes it); an open broker serves everyone as anonymous,
    as before owners existed."""
    if secured and principal is ANONYMOUS_PRINCIPAL:
        return "anonymous clients cannot hold durable subscriptions or persistent sessions; log in"
    if owner is None:
        return "it was stored without an owner; an administrator can remove it" if secured else None
    if owner != owner_of(principal):
        return "it belongs to another user"
    return None


class DurableSubscription:
    """A durable subscription of ``client_id`` named ``name`` to ``pattern``,
    made by the principal named ``owner`` (see :func:`claim_refusal`)."""

    __slots__ = ("key", "client_id", "name", "pattern", "queue", "active", "owner")

    def __init__(self, client_id: str, name: str, pattern: Address, queue: Queue, owner: str | None = None) -> None:
        self.key = durable_key(client_id, name)
        self.client_id = client_id
        self.name = name
        self.pattern = pattern
        self.queue = queue
        self.active: Subscription | None = None
        self.owner = owner

    def __repr__(self) -> str:
        state = "active" if self.active is not None else "offline"
        return f"DurableSubscription({self.key!r}, {self.pattern.text!r}, {state}, depth={self.queue.depth})"


class Durables(dict[str, DurableSubscription]):
    """The broker's durable subscriptions by key, also counted by owner (for
    max_durable_subscriptions_per_user) and grouped by client id (so a
    CONNECT finds its session's without scanning everyone's).  Changed only
    through :meth:`add` and :meth:`remove`, which keep the three in step."""

    def __init__(self) -> None:
        super().__init__()
        self._by_owner: dict[str | None, int] = {}  # None: stored without an owner
        self._by_client: dict[str, dict[str, DurableSubscription]] = {}

    def add(self, durable: DurableSubscription) -> None:
        self[durable.key] = durable
        self._by_owner[durable.owner] = self._by_owner.get(durable.owner, 0) + 1
        self._by_client.setdefault(durable.client_id, {})[durable.key] = durable

    def remove(self, durable: DurableSubscription) -> None:
        del self[durable.key]
        count = self._by_owner.pop(durable.owner, 0) - 1
        if count > 0:  # no entry once none are left: the maps stay as small as what they count
            self._by_owner[durable.owner] = count
        mine = self._by_client.get(durable.client_id, {})
        mine.pop(durable.key, None)
        if not mine:
            self._by_client.pop(durable.client_id, None)

    def held_by(self, owner: str | None) -> int:
        return self._by_owner.get(owner, 0)

    def of_client(self, client_id: str) -> list[DurableSubscription]:
        return list(self._by_client.get(client_id, {}).values())
