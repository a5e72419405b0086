"""Shared subscriptions: one queue fed by a topic pattern and consumed by
several subscriptions, possibly of different clients, each message going to
one of them (MQTT 5's ``$share/{group}/{filter}``, JMS 2.0's shared
subscriptions, the mechanism of ActiveMQ's virtual topics).

A :class:`SharedGroup` is in the topic tree as a durable subscription is (the
topic puts the message in its ``queue``); its members are the queue's
consumers, so round robin among those with room, prefetch windows and
redelivery of what a leaving member held are the queue's.  A group is named
by its name *and* pattern (``$share/g/a`` and ``$share/g/b`` are two groups),
in a key space of its own (no durable subscription's key starts so).

A member whose session persists holds a :class:`Membership` (client id and a
name of the caller's choosing), stored; a group with one is durable: stored
too, with its persistent messages, so it collects while nobody is connected
and comes back after a restart.  A group goes when it has neither consumers
nor memberships: a non-durable one when its last member leaves, a durable one
when its last membership is dropped (and no member is attached).

What a member leaves unacknowledged goes back to the group for another member,
except what its protocol says is that member's alone (MQTT 5's QoS 2 message
sent and not yet answered with PUBREC, §4.8.2): those are *reserved* for it,
handed to it first when it comes back [MQTT-4.8.2-4] and dropped, never given
to another member, when its membership ends [MQTT-4.8.2-5].  A reservation is
noted in the store (``RESERVED_NOTES``), so it holds across a restart too.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from core.destinations import Queue
from core.errors import InvalidDestination, InvalidRequest, LimitExceeded
from core.messages import Message
from core.names import Address
from core.registry import QueueRegistry
from core.settings import BrokerSettings
from core.storage import MessageStore
from core.tally import UNKNOWN_HOLDER, Holder, Shares, holder_of_owner

GROUP_PREFIX = "shared:"
MEMBER_PREFIX = "member:"
# The store's namespace for reservations: key "{group key}\n{message id}"
# (one message may be in several groups), value the member's key.
RESERVED_NOTES = "shared-reserved"


def group_key(name: str, pattern: Address) -> str:
    """The key of group ``name`` on ``pattern`` (its stored queue's key).
    Length-prefixed, so no name and pattern collide with another pair."""
    return f"{GROUP_PREFIX}{len(name)}:{name}:{pattern.text}"


def member_key(client_id: str, name: str) -> str:
    """The key of client ``client_id``'s membership ``name``."""
    return f"{MEMBER_PREFIX}{len(client_id)}:{client_id}:{name}"


def split_key(key: str, prefix: str) -> tuple[str, str] | None:
    """The two parts of a :func:`group_key` (name, pattern text) or a
    :func:`member_key` (client id, name) made with ``prefix``, or None."""
    if not key.startswith(prefix):
        return None
    length, _, rest = key[len(prefix) :].partition(":")
    if not length.isdigit() or len(rest) < int(length) + 1 or rest[int(length)] != ":":
        return None
    return rest[: int(length)], rest[int(length) + 1 :]


class SharedGroup:
    """Group ``name`` on ``pattern``: its queue (the consumers are its
    members) and the persistent memberships it holds (``held``, by key)."""

    __slots__ = ("key", "name", "pattern", "queue", "held", "owner", "holder")

    def __init__(self, name: str, pattern: Address, queue: Queue, owner: str | None, holder: Holder) -> None:
        self.key = group_key(name, pattern)
        self.name = name
        self.pattern = pattern
        self.queue = queue
        self.held: dict[str, Membership] = {}
        self.owner = owner  # who made it (stored with it); members need only the right to read
        self.holder = holder  # whose share of max_shared_groups it takes (core.tally), until it goes

    @property
    def durable(self) -> bool:
        return self.queue.key is not None

    def __repr__(self) -> str:
        return f"SharedGroup({self.key!r}, members={len(self.queue.consumers)}, held={len(self.held)}, depth={self.queue.depth})"


class Membership:
    """A member's place in a group: ``key`` None for a member whose session
    does not persist (it lasts as long as its subscription), else stored
    under ``client_id`` and ``name`` and kept while it is away."""

    __slots__ = ("key", "client_id", "name", "group", "active", "owner", "reserved")

    def __init__(self, group: SharedGroup, client_id: str | None, name: str | None, owner: str | None) -> None:
        self.key = member_key(client_id, name) if client_id is not None and name is not None else None
        self.client_id = client_id
        self.name = name
        self.group = group
        self.active: Any = None  # the core.subscriptions.Subscription attached, if any
        self.owner = owner
        # Messages only this member may have, waiting for it to come back
        # (see the module's docstring), in delivery order.
        self.reserved: list[Message] = []

    def __repr__(self) -> str:
        return f"Membership({self.key!r}, {self.group.key!r}, {'active' if self.active is not None else 'offline'})"


class SharedGroups(dict[str, SharedGroup]):
    """The broker's shared groups by key, and the persistent memberships by
    key and by client id (so a session finds its own when it comes back).
    Changed only through :meth:`join`, :meth:`leave`, :meth:`drop_member`
    and :meth:`restore_*`, which keep them, the topic tree and the store in step."""

    def __init__(self, registry: QueueRegistry, store: MessageStore, settings: BrokerSettings) -> None:
        super().__init__()
        self.registry = registry
        self.store = store
        self.settings = settings
        self.memberships: dict[str, Membership] = {}
        self._by_client: dict[str, dict[str, Membership]] = {}
        # The groups each holder made (max_shared_groups_per_user): a group
        # is its maker's to account for while it lasts, whoever joins it.
        self.made = Shares("shared subscription groups")

    # -- members -----------------------------------------------------------

    def join(
        self, name: str, pattern: Address, selector: Any, owner: str | None, persistent: tuple[str, str] | None,
        holder: Holder = UNKNOWN_HOLDER,
    ) -> tuple[Membership, int]:
        """A membership of group ``name`` on ``pattern`` (created if new,
        filtered by ``selector``, in ``holder``'s share), persistent under
        ``persistent`` = (client id, name) if given: resumed if stored, else
        stored, with the group.  Whether the caller may, and whether it is
        already attached, are the caller's checks.  Returns it and the LSN
        that makes it durable."""
        if not name:
            raise InvalidRequest("a shared subscription needs a group name")
        key = group_key(name, pattern)
        group = self.get(key)
        if group is not None and _text(group.queue.selector) != _text(selector):
            raise InvalidRequest(f"shared subscription group {name!r} on {pattern.text!r} has another selector")
        lsn = 0
        kept = self.memberships.get(member_key(*persistent)) if persistent is not None else None
        if kept is not None and kept.group is not group:  # the same membership, now of another group: a new one
            lsn = self.drop_member(kept)
            kept = None
            group = self.get(key)
        if group is None:
            self._check_new(name, holder)
            group = self._place(key, name, pattern, selector, owner, holder, durable=False)
        if kept is not None:
            return kept, lsn
        if persistent is None:
            return Membership(group, None, None, owner), lsn
        if not group.durable:  # its first persistent member: from now on it keeps what it is fed
            group.queue.key = key
            self.registry.configure_shared(group.queue, durable=True)
            lsn = max(lsn, self.store.add_subscription(key, pattern.text, _text(selector), group.owner))
        membership = self._hold(group, persistent[0], persistent[1], owner)
        # A member's record names its group's key where a durable one names its pattern.
        return membership, max(lsn, self.store.add_subscription(membership.key, key, None, owner))  # type: ignore[arg-type]

    def set_aside(self, membership: Membership, unacked: list[Message], reserve: Collection[str]) -> list[Message]:
        """A leaving member's ``unacked`` messages whose ids are in ``reserve``
        are its alone: reserved for it, or dropped if its membership does not
        persist (its session ended with it).  Returns the others, which go
        back to the group."""
        mine = [message for message in unacked if message.id in reserve]
        if not mine:
            return unacked
        if membership.key is None:
            self._drop_reserved(membership.group, mine)
        else:
            self._reserve(membership, mine)
        return [message for message in unacked if message.id not in reserve]

    def leave(self, membership: Membership, *, remove: bool) -> int:
        """``membership``'s subscription let go (its consumer is already off
        the queue).  ``remove``: a persistent membership ends too.  The group
        goes if nobody is left in it.  Returns the LSN of what was removed."""
        membership.active = None
        if remove and membership.key is not None:
            return self.drop_member(membership)
        return self._settle(membership.group)

    def take_reserved(self, membership: Membership) -> list[Message]:
        """What was reserved for ``membership``, now that it is back: its
        to be handed again (marked redelivered), no longer noted."""
        reserved, membership.reserved = membership.reserved, []
        self._note(membership.group, reserved, None)
        return [message.redelivery() for message in reserved]

    def drop_member(self, membership: Membership) -> int:
        """End a persistent membership (its subscription detached); its
        group goes if that was the last one and no member is attached."""
        group = membership.group
        assert membership.key is not None and membership.client_id is not None
        if membership.reserved:
            reserved, membership.reserved = membership.reserved, []
            self._drop_reserved(group, reserved)
        self.memberships.pop(membership.key, None)
        group.held.pop(membership.key, None)
        mine = self._by_client.get(membership.client_id, {})
        mine.pop(membership.key, None)
        if not mine:
            self._by_client.pop(membership.client_id, None)
        return max(self.store.remove_subscription(membership.key), self._settle(group))

    def of_client(self, client_id: str) -> list[Membership]:
        """The persistent memberships of ``client_id``."""
        return list(self._by_client.get(client_id, {}).values())

    # -- recovery ----------------------------------------------------------

    def restore_group(self, key: str, name: str, pattern: Address, selector: Any, owner: str | None) -> SharedGroup:
        """A durable group recovered from the store, before anyone connects."""
        return self._place(key, name, pattern, selector, owner, holder_of_owner(owner), durable=True)

    def restore_member(self, key: str, client_id: str, name: str, group_key_: str, owner: str | None) -> bool:
        """A persistent membership recovered from the store; False (and
        forgotten there) when its group was not."""
        group = self.get(group_key_)
        if group is None:
            self.store.remove_subscription(key)
            return False
        self._hold(group, client_id, name, owner)
        return True

    def restore_reserved(self, notes: dict[str, bytes]) -> None:
        """After the groups and memberships: the recovered reservations
        (``RESERVED_NOTES``) take their messages out of their groups' queues
        and give them back to their members; a note whose message or member
        is gone is forgotten."""
        wanted: dict[str, dict[str, tuple[Membership, str]]] = {}  # group key -> message id -> (holder, note)
        for note, member in notes.items():
            group_key_, _, message_id = note.rpartition("\n")
            holder = self.memberships.get(member.decode("utf-8", "replace"))
            if holder is None or holder.group.key != group_key_:
                self.store.note(RESERVED_NOTES, note, None)
                continue
            wanted.setdefault(group_key_, {})[message_id] = (holder, note)
        for group_key_, by_message in wanted.items():
            queue = self[group_key_].queue
            for message in queue.pending.clear():  # recovery only: one pass over the group's backlog
                found = by_message.pop(message.id, None)
                if found is None:
                    queue.pending.push(message)
                else:
                    found[0].reserved.append(message)
            for _, note in by_message.values():  # acknowledged before the restart
                self.store.note(RESERVED_NOTES, note, None)

    def settle_restored(self) -> None:
        """After recovery: a durable group whose memberships all went (its
        record stayed while members without one were attached) goes now."""
        for group in list(self.values()):
            self._settle(group)

    # -- inside ------------------------------------------------------------

    def _check_new(self, name: str, holder: Holder) -> None:
        """Refuse a new group named ``name`` made by ``holder``: a name too
        long (:class:`InvalidDestination`: it is in every key the group is
        kept under), or past the holder's share or the broker's bound
        (:class:`LimitExceeded`)."""
        settings = self.settings
        longest = settings.max_shared_group_name_chars
        if len(name) > longest:
            raise InvalidDestination(f"shared subscription group name longer than {longest} characters "
                                     "(max_shared_group_name_chars)")
        reason = self.made.refusal(holder, settings.max_shared_groups_per_user)
        if reason is not None:
            raise LimitExceeded(reason)
        limit = settings.max_shared_groups
        if limit and len(self) >= limit:
            raise LimitExceeded(f"too many shared subscription groups on the broker (limit {limit})")

    def _place(self, key: str, name: str, pattern: Address, selector: Any, owner: str | None, holder: Holder, *,
               durable: bool) -> SharedGroup:
        queue = self.registry.shared_queue(pattern, key if durable else None, selector)
        group = self[key] = SharedGroup(name, pattern, queue, owner, holder)
        self.made.take(holder)
        queue.owner = group  # what the admin views show it as
        self.registry.attach(pattern, group)
        return group

    def _hold(self, group: SharedGroup, client_id: str, name: str, owner: str | None) -> Membership:
        membership = Membership(group, client_id, name, owner)
        assert membership.key is not None
        self.memberships[membership.key] = membership
        group.held[membership.key] = membership
        self._by_client.setdefault(client_id, {})[membership.key] = membership
        return membership

    def _reserve(self, membership: Membership, messages: list[Message]) -> None:
        assert membership.key is not None  # only a persistent membership outlives its connection
        membership.reserved.extend(messages)
        self._note(membership.group, messages, membership.key.encode())

    def _drop_reserved(self, group: SharedGroup, messages: list[Message]) -> None:
        """Messages reserved for a member whose membership ended: done with
        (MQTT 5 gives them to nobody else), in the store too."""
        self._note(group, messages, None)
        group.queue.discard(messages)

    def _note(self, group: SharedGroup, messages: list[Message], member: bytes | None) -> None:
        """Note (``member``'s key) or forget (None) the reservations of
        ``messages`` in ``group``: only a durable group's stored messages
        outlive a restart, so only theirs are in the store."""
        if not group.durable:
            return
        for message in messages:
            if message.location >= 0:
                self.store.note(RESERVED_NOTES, f"{group.key}\n{message.id}", member)

    def _settle(self, group: SharedGroup) -> int:
        """Remove ``group`` if it has neither consumers nor memberships: its
        queue and what it held go (in the store too, for a durable one)."""
        if group.queue.consumers or group.held or self.get(group.key) is not group:
            return 0
        self.registry.detach(group.pattern, group)
        del self[group.key]
        self.made.give_back(group.holder)
        queue = group.queue
        queue.pending.clear()  # the store forgets its messages with its record
        queue.delayed.clear()
        queue.relieve()
        return 0 if queue.key is None else self.store.remove_subscription(queue.key)


def _text(selector: Any) -> str | None:
    return selector.text if selector is not None else None
