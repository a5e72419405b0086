"""Durable topic subscriptions: a named, stored queue that a topic keeps
filling while its subscriber is away (ActiveMQ's durable topic subscriber).

The topic tree holds the :class:`DurableSubscription` itself, not a consumer,
so routing is the same whether anyone is attached: the topic puts the message
in ``queue``; a returning subscriber attaches to that queue like any consumer
and drains what waited, in order.
"""

from __future__ import annotations

from typing import Any

from core.authorization import ANONYMOUS_PRINCIPAL, Principal
from core.destinations import Queue
from core.errors import InvalidRequest, LimitExceeded, UnknownDestination
from core.names import Address
from core.storage import MessageStore
from core.registry import QueueRegistry
from core.settings import BrokerSettings
from core.subscriptions import Subscription
from core.tally import Tally

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
    through :meth:`subscribe`, :meth:`restore` and :meth:`drop`, which keep
    the three in step, the topic tree and the store too."""

    def __init__(self, registry: QueueRegistry, store: MessageStore, settings: BrokerSettings) -> None:
        super().__init__()
        self.registry = registry
        self.store = store
        self.settings = settings
        self._by_owner: Tally[str | None] = Tally()  # None: stored without an owner
        self._by_client: dict[str, dict[str, DurableSubscription]] = {}

    def subscribe(
        self, client_id: str, name: str, pattern: Address, selector: Any = None, owner: str | None = None
    ) -> tuple[DurableSubscription, int]:
        """The durable subscription, created (and stored, selector and owner
        included) if new, or anew if its topic or selector changed: JMS 1.1
        §6.11.1 makes changing a durable subscriber deleting it and creating
        another.  Whether the caller may is the caller's check (Client).
        Returns it and the LSN that makes the change durable."""
        key = durable_key(client_id, name)
        lsn = 0
        durable = self.get(key)
        text = _text(selector)
        changed = durable is not None and (durable.pattern != pattern or _text(durable.queue.selector) != text)
        if durable is None or changed:  # checked before the old one goes: a refusal changes nothing
            self._check(owner, frees=changed and durable is not None and durable.owner == owner)
        if durable is not None and changed:
            lsn = self.drop(durable)
            durable = None
        if durable is None:
            durable = self.restore(key, client_id, name, pattern, selector, owner)
            lsn = self.store.add_subscription(key, pattern.text, text, owner)
        return durable, lsn

    def _check(self, owner: str | None, frees: bool) -> None:
        """Refuse (:class:`LimitExceeded`) one more durable subscription of
        ``owner`` past max_durable_subscriptions_per_user (``frees``: it
        replaces one of theirs): each is a queue kept on disk until removed."""
        limit = self.settings.max_durable_subscriptions_per_user
        if limit and owner != ANONYMOUS_OWNER and self.held_by(owner) - frees >= limit:
            raise LimitExceeded(f"too many durable subscriptions for user {owner!r} (limit {limit})")
        total = self.settings.max_durable_subscriptions
        if total and len(self) - frees >= total:
            raise LimitExceeded(f"too many durable subscriptions on the broker (limit {total})")

    def restore(
        self, key: str, client_id: str, name: str, pattern: Address, selector: Any, owner: str | None
    ) -> DurableSubscription:
        """Put a durable subscription in place (new, or recovered from the
        store, which already has it): its queue, indexes and topic tree entry."""
        queue = self.registry.durable_queue(pattern, key, selector)  # what it keeps, offline too
        durable = DurableSubscription(client_id, name, pattern, queue, owner)
        self[durable.key] = durable
        self._by_owner.add(durable.owner)
        self._by_client.setdefault(durable.client_id, {})[durable.key] = durable
        self.registry.attach(pattern, durable)
        return durable

    def drop(self, durable: DurableSubscription) -> int:
        """Remove a durable subscription and what it kept; returns the LSN
        of its removal from the store."""
        self.registry.detach(durable.pattern, durable)
        del self[durable.key]
        self._by_owner.remove(durable.owner)
        mine = self._by_client.get(durable.client_id, {})
        mine.pop(durable.key, None)
        if not mine:
            self._by_client.pop(durable.client_id, None)
        durable.queue.pending.clear()
        durable.queue.relieve()
        return self.store.remove_subscription(durable.key)

    def remove(self, key: str) -> int:
        """An administrator's removal of an offline durable subscription,
        whoever owns it; returns the LSN of the removal."""
        durable = self.get(key)
        if durable is None:
            raise UnknownDestination(f"no durable subscription {key!r}")
        if durable.active is not None:
            raise InvalidRequest(f"durable subscription {key!r} is in use by a connection")
        return self.drop(durable)

    def held_by(self, owner: str | None) -> int:
        return self._by_owner[owner]

    def of_client(self, client_id: str) -> list[DurableSubscription]:
        return list(self._by_client.get(client_id, {}).values())


def _text(selector: Any) -> str | None:
    return selector.text if selector is not None else None
