"""Queues: pending messages in priority order and the consumers they go to."""

from __future__ import annotations

import enum
import heapq
import itertools
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from core.buffers import PriorityBuffer
from core.messages import Message
from core.names import Address
from core.ports import Clock, Sink
from core.settings import QueueStatistics
from core.storage import MessageStore


# Ties between redeliveries due at the same millisecond keep their order.
_DELAY_ORDER = itertools.count()

# JMS message groups: messages with the same value go to the same consumer.
GROUP_HEADER = "JMSXGroupID"
# Group assignments a queue remembers (ActiveMQ bounds its map the same way).
MAX_GROUPS = 65_536


class AckMode(enum.Enum):
    AUTO = "auto"  # acked as it is handed to the connection
    CLIENT = "client"  # an ack covers this message and every earlier one
    CLIENT_INDIVIDUAL = "client-individual"  # an ack covers exactly one message


# An Enum member read through its class (AckMode.AUTO) is a Python-level
# lookup in 3.11: the hot path compares against this constant instead.  And
# where a queue has one unranked consumer (each topic subscriber's own queue),
# put and dispatch check its room (Subscription.has_room) inline, not by calls.
AUTO = AckMode.AUTO


class Consumer(Protocol):
    """What a queue needs of a consumer (a :class:`core.subscriptions.Subscription`,
    which imports this module, not the other way round)."""

    sink: Sink
    ack_mode: AckMode
    prefetch: int
    unacked: dict[str, Message]
    selector: Any
    priority: int
    exclusive: bool

    @property
    def has_room(self) -> bool: ...


class Waiter(Protocol):
    """A producer held back by congested queues (a :class:`core.clients.Client`)."""

    def unblocked(self, queue: Queue) -> None: ...


class Queue:
    """A queue: each message goes to exactly one consumer.

    Dispatch is round-robin over the consumers that have room (prefetch credit
    and a connection that is accepting).  A message that finds a consumer with
    room and nothing queued ahead of it skips the buffer entirely.

    Producer flow control: once ``pending`` reaches ``high_water`` the queue
    is *congested*; producers whose messages landed here register as
    ``waiters`` and stop sending (their connections stop reading) until
    dispatch brings it down to half of ``high_water``, when each is told
    through :meth:`Waiter.unblocked`.  Zero turns it off.

    ``limit`` is the hard bound on ``pending`` for private (topic-subscription)
    queues: past it the oldest message of the lowest priority (or the new one,
    when its priority is lower still) is discarded and counted.  Flow control keeps a topic below it;
    it is the safety net when many producers overshoot at once.
    """

    __slots__ = (
        "address", "pending", "consumers", "_rr", "stats", "owner", "limit", "high_water", "waiters", "slow",
        "store", "key", "resident", "dead_letter", "max_redeliveries", "clock", "expiring", "expired_to_dlq",
        "selective", "selector", "ranked", "groups", "redelivery_delay", "delayed",
    )

    def __init__(self, address: Address, *, owner: Any = None, store: MessageStore | None = None, key: str | None = None) -> None:
        self.address = address
        # Stored messages in this queue are acked in ``store`` under ``key``;
        # past ``resident`` pending messages, new stored ones wait as stubs.
        self.store = store
        self.key = key
        self.resident = 0
        # Where a message redelivered more than max_redeliveries times goes
        # (the broker's dead-letter routing); None: redeliver forever.
        self.dead_letter: Callable[[Queue, Message, str], None] | None = None
        self.max_redeliveries = 0
        # Expiry: the broker's clock (None: never expire), how many pending
        # messages carry an expiry (0: the sweep skips this queue), and
        # whether expired persistent messages go to the dead-letter queue.
        self.clock: Clock | None = None
        self.expiring = 0
        self.expired_to_dlq = True
        # Selectors: how many consumers have one (0: the plain, fast dispatch),
        # and, for a topic subscription's own queue, the filter applied as the
        # topic fans out (a message it rejects never enters).
        self.selective = 0
        self.selector: Any = None
        # True once consumers differ in priority or one is exclusive: picking
        # then ranks them (the plain round robin stays the fast path).
        self.ranked = False
        # Message groups (JMSXGroupID): which consumer owns each group.  None
        # until a grouped message arrives; then dispatch is message-aware.
        self.groups: dict[str, Consumer] | None = None
        # Redelivery delay: ms to hold a message back given its redelivery
        # count (None: put it back at once), and the held ones by due time.
        self.redelivery_delay: Callable[[int], int] | None = None
        self.delayed: list[tuple[int, int, Message]] = []
        self.pending = PriorityBuffer()
        self.consumers: list[Consumer] = []
        self._rr = 0
        self.stats = QueueStatistics()
        self.owner = owner
        self.limit = 0
        self.high_water = 0
        self.waiters: list[Waiter] | None = None  # None: not congested
        # A consumer that made no progress while producers waited on it: it
        # no longer holds them back (see Client.check_held); cleared once it
        # catches up.
        self.slow = False

    def configure(
        self,
        *,
        limit: int | None = None,
        high_water: int | None = None,
        resident: int | None = None,
        clock: Clock | None = None,
        expired_to_dlq: bool | None = None,
        dead_letter: Callable[[Queue, Message, str], None] | None = None,
        max_redeliveries: int | None = None,
        redelivery_delay: Callable[[int], int] | None = None,
        selector: Any = None,
    ) -> Queue:
        """Set how this queue behaves (None: as it is): the one place its
        settings are written, by the broker from its policies and by a
        protocol that bounds its own subscriptions (MQTT's max queued)."""
        if limit is not None:
            self.limit = limit
        if high_water is not None:
            self.high_water = high_water
        if resident is not None:
            self.resident = resident
        if clock is not None:
            self.clock = clock
        if expired_to_dlq is not None:
            self.expired_to_dlq = expired_to_dlq
        if dead_letter is not None:
            self.dead_letter = dead_letter
        if max_redeliveries is not None:
            self.max_redeliveries = max_redeliveries
        if redelivery_delay is not None:
            self.redelivery_delay = redelivery_delay
        if selector is not None:
            self.selector = selector
        return self

    @property
    def congested(self) -> bool:
        return self.waiters is not None

    def __repr__(self) -> str:
        return f"Queue({self.address.text!r}, depth={len(self.pending)}, consumers={len(self.consumers)})"

    @property
    def depth(self) -> int:
        return len(self.pending)

    def put(self, message: Message) -> None:
        self.stats.enqueued += 1
        if message.expires:
            if self._expired(message):
                return
            self.expiring += 1
        if self.groups is None and message.headers and GROUP_HEADER in message.headers:
            self.groups = {}
        if self.selective or self.groups is not None:
            # Waiting messages are ones no consumer with room selects, so a
            # newcomer some consumer takes does not jump ahead of its own kind.
            if message.headers is None and not self._load(message):
                return
            consumer = self._pick_for(message)
            if consumer is not None:
                self._deliver(consumer, message)
                return
        elif not self.pending.length and self.consumers:
            only = self.consumers[0] if len(self.consumers) == 1 and not self.ranked else None
            if only is None:
                consumer = self._pick()
            else:
                consumer = only if only.sink.accepting and (only.ack_mode is AUTO or len(only.unacked) < only.prefetch) else None
            if consumer is not None:
                self._deliver(consumer, message)
                return
        pending = self.pending
        if self.resident and message.location >= 0 and pending.length >= self.resident:
            message = message.stub()  # its body stays on disk until dispatch
        if self.limit and pending.length >= self.limit:
            self.stats.discarded += 1
            if message.priority < pending.lowest_priority():
                self._forget(message)
                return  # the newcomer is worth less than all that waits: drop it
            self._forget(pending.pop_lowest())
        pending.push(message)
        if self.high_water and self.waiters is None and not self.slow and pending.length >= self.high_water:
            self.waiters = []

    def restore(self, messages: Iterable[Message]) -> None:
        """Messages recovered from the store, in their order, before anyone
        consumes: they entered (through the broker's door) before a restart."""
        for message in messages:
            self.pending.push(message)
            self.stats.enqueued += 1

    def requeue(self, messages: Iterable[Message]) -> None:
        """Put messages back at the head, marked redelivered, in their original
        order; one delivered too often goes to ``dead_letter`` instead."""
        dead_letter = self.dead_letter
        for message in reversed(list(messages)):
            again = message.redelivery()
            if dead_letter is not None and again.redeliveries > self.max_redeliveries:
                dead_letter(self, message, f"delivered {again.redeliveries} times, more than {self.max_redeliveries + 1}")
                continue
            self.stats.redelivered += 1
            delay = self.redelivery_delay(again.redeliveries) if self.redelivery_delay is not None else 0
            if delay and self.clock is not None:
                # Held back a while (a failing consumer gets time to recover);
                # the broker's timer puts it back at the head when due.
                heapq.heappush(self.delayed, (self.clock.wall_ms() + delay, next(_DELAY_ORDER), again))
                continue
            self.pending.push_front(again)
        self.dispatch()

    def release_delayed(self, now_ms: int) -> int:
        """Put back the held redeliveries that are due; returns how many."""
        delayed = self.delayed
        due = []
        while delayed and delayed[0][0] <= now_ms:
            due.append(heapq.heappop(delayed)[2])
        for message in reversed(due):
            self.pending.push_front(message)
        if due:
            self.dispatch()
        return len(due)

    def dispatch(self) -> None:
        pending = self.pending
        if self.selective or self.groups is not None:
            self._dispatch_selective()
        else:
            # (pending.length, not bool(pending): a Python call per message.)
            only = self.consumers[0] if len(self.consumers) == 1 and not self.ranked else None
            while pending.length:
                if only is None:
                    consumer = self._pick()
                    if consumer is None:
                        break
                elif only.sink.accepting and (only.ack_mode is AUTO or len(only.unacked) < only.prefetch):
                    consumer = only
                else:
                    break
                message = pending.pop()
                if message.expires and self._expired(message):
                    continue  # never delivered once past its time
                self._deliver(consumer, message)
        if pending.length <= self.high_water // 2:
            self.slow = False
            if self.waiters is not None:
                self.relieve()

    def wait(self, producer: Waiter) -> bool:
        """Register a producer to be told when this queue is no longer
        congested; False (and nothing registered) if it is not."""
        waiters = self.waiters
        if waiters is None:
            return False
        if producer not in waiters:
            waiters.append(producer)
        return True

    def relieve(self) -> None:
        """End congestion (drained, or the queue is going away): wake producers."""
        waiters, self.waiters = self.waiters, None
        for producer in waiters or ():
            producer.unblocked(self)

    def add_consumer(self, subscription: Consumer) -> None:
        """Attach a consumer; delivery to it starts with the next :meth:`dispatch`."""
        self.consumers.append(subscription)
        if subscription.selector is not None:
            self.selective += 1
        self._rerank()

    def remove_consumer(self, subscription: Consumer) -> None:
        self.consumers.remove(subscription)
        if self.groups:  # its groups move on to whoever takes their next message
            for group in [g for g, owner in self.groups.items() if owner is subscription]:
                del self.groups[group]
        if subscription.selector is not None:
            self.selective -= 1
        self._rerank()
        if self._rr >= len(self.consumers):
            self._rr = 0

    def acked(self, messages: list[Message]) -> int:
        """Consumers are done with these: forget them, in the store too.
        Returns the LSN that makes that durable."""
        self.stats.dequeued += len(messages)
        lsn = 0
        if self.key is not None and self.store is not None:
            for message in messages:
                if message.location >= 0:
                    lsn = self.store.ack(self.key, message.id)
        return lsn

    def _dispatch_selective(self) -> None:
        """Dispatch when some consumer filters: each message in delivery order
        goes to the next consumer with room whose selector takes it; one that
        no consumer takes stays, in its place, for later consumers."""
        pending = self.pending
        if not pending or not any(c.has_room for c in self.consumers):
            return
        kept = []
        room = True  # only a delivery can use room up, so look again only after one
        for message in pending.clear():
            if message.expires and self._expired(message):
                continue
            if room and message.headers is None and not self._load(message):
                continue  # a selector reads headers: bring them in (or drop a damaged one)
            consumer = self._pick_for(message) if room else None
            if consumer is None:
                kept.append(message)
            else:
                self._deliver(consumer, message)
                room = any(c.has_room for c in self.consumers)
        for message in kept:
            pending.push(message)

    def _pick_for(self, message: Message) -> Consumer | None:
        """Round robin over the consumers with room that select ``message``
        (its headers in memory)."""
        group = message.headers.get(GROUP_HEADER) if self.groups is not None and message.headers else None
        if group is not None:
            owner = self.groups.get(group)  # type: ignore[union-attr]
            if owner is not None:
                # The group stays with its consumer while it lives, room or not.
                return owner if owner.has_room else None
        consumers = self._eligible() if self.ranked else self.consumers
        n = len(consumers)
        start = self._rr % n if n else 0
        for i in range(n):
            candidate = consumers[(start + i) % n]
            if candidate.has_room and (candidate.selector is None or candidate.selector.matches(message)):
                self._rr = (start + i + 1) % n
                if group is not None:
                    groups = self.groups
                    assert groups is not None
                    if len(groups) >= MAX_GROUPS:
                        del groups[next(iter(groups))]  # the oldest assignment is forgotten first
                    groups[group] = candidate
                return candidate
        return None

    def _rerank(self) -> None:
        consumers = self.consumers
        self.ranked = any(c.exclusive for c in consumers) or len({c.priority for c in consumers}) > 1

    def _eligible(self) -> list[Consumer]:
        """The consumers that may be picked now, by rank: the first exclusive
        consumer alone if there is one (ActiveMQ's exclusive consumer), else
        the highest priority that has room, else all."""
        consumers = self.consumers
        for consumer in consumers:
            if consumer.exclusive:
                return [consumer]
        for level in sorted({c.priority for c in consumers}, reverse=True):
            group = [c for c in consumers if c.priority == level]
            if any(c.has_room for c in group):
                return group
        return consumers

    def _pick(self) -> Consumer | None:
        if self.ranked:
            group = self._eligible()
            n = len(group)
            for i in range(n):
                candidate = group[(self._rr + i) % n]
                if candidate.has_room:
                    self._rr = (self._rr + i + 1) % max(len(self.consumers), 1)
                    return candidate
            return None
        consumers = self.consumers
        n = len(consumers)
        start = self._rr
        for i in range(n):
            candidate = consumers[(start + i) % n]
            if candidate.has_room:
                self._rr = (start + i + 1) % n
                return candidate
        return None

    def purge(self) -> int:
        """Drop every waiting message, those held back for a delayed redelivery
        too (delivered, unacked ones stay with their consumers); how many."""
        dropped = self.pending.clear()
        dropped.extend(message for _, _, message in self.delayed)
        self.delayed.clear()
        for message in dropped:
            self._forget(message)
        self.stats.discarded += len(dropped)
        if self.waiters is not None:
            self.relieve()
        return len(dropped)

    def hand(self, consumer: Consumer, messages: list[Message]) -> None:
        """Deliver ``messages`` to ``consumer`` alone, ahead of what waits (core.shared's reservations)."""
        for message in messages:
            self._deliver(consumer, message)

    def discard(self, messages: list[Message]) -> None:
        """Drop delivered, unacknowledged messages nobody may have now (counted as discarded)."""
        for message in messages:
            self._forget(message)
        self.stats.discarded += len(messages)

    def browse(self, limit: int) -> list[Message]:
        """The first ``limit`` pending messages in delivery order, untouched."""
        return list(itertools.islice(self.pending, limit))

    def sweep(self) -> int:
        """Remove every expired pending message; returns how many.  Cheap for
        a queue that held no message with an expiry since the last sweep."""
        if not self.expiring or self.clock is None:
            return 0
        now = self.clock.wall_ms()
        before = self.stats.expired
        self.expiring = 0
        for message in self.pending.clear():  # in delivery order, so pushing back keeps it
            if message.expires and message.expires <= now:
                self._expired(message)
            else:
                self.pending.push(message)
                if message.expires:
                    self.expiring += 1
        return self.stats.expired - before

    def _expired(self, message: Message) -> bool:
        """If ``message`` is past its expiry: count it, dead-letter a stored
        one (or forget it), and say so."""
        if self.clock is None or message.expires > self.clock.wall_ms():
            return False
        self.stats.expired += 1
        if self.expired_to_dlq and message.persistent and self.dead_letter is not None:
            self.dead_letter(self, message, "expired")
        else:
            self._forget(message)
        return True

    def _forget(self, message: Message) -> None:
        """A discarded message is done with here, in the store too."""
        if message.location >= 0 and self.key is not None and self.store is not None:
            self.store.ack(self.key, message.id)

    def _load(self, message: Message) -> bool:
        """Bring a stub's headers and body in from the store.  A damaged
        record (the store reported and counted it) loses exactly its own
        message: forgotten here and in the store, so a restart does not bring
        it back, and dispatch goes on with the next."""
        if self.store is None or message.load(self.store):
            return True
        self.stats.discarded += 1
        self._forget(message)
        return False

    def _deliver(self, consumer: Consumer, message: Message) -> None:
        if message.body is None and not self._load(message):
            return
        self.stats.delivered += 1
        if consumer.ack_mode is AUTO:
            self.stats.dequeued += 1
            if message.location >= 0 and self.key is not None and self.store is not None:
                self.store.ack(self.key, message.id)
            consumer.sink.deliver(consumer, message)
            return
        consumer.unacked[message.id] = message
        if consumer.sink.deliver(consumer, message):
            # Settled on the spot (an MQTT QoS 0 delivery on a QoS 1 subscription).
            del consumer.unacked[message.id]
            self.acked([message])
