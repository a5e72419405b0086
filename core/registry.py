"""The broker's queues by address and the topic subscription trees: where a
message goes (its targets), and every queue made and configured the same way,
from the destination's policy, in one place (:meth:`QueueRegistry.configure`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from core.destinations import Queue
from core.errors import InvalidRequest, LimitExceeded, QueueNotEmpty, UnknownDestination
from core.matching import SubscriptionTree
from core.messages import Message
from core.names import Address, Kind
from core.policies import Policies
from core.ports import Clock
from core.storage import MessageStore
from core.settings import BrokerSettings, BrokerStatistics

# What a queue hands a message to that keeps failing (the broker's dead-letter move).
DeadLetter = Callable[[Queue, Message, str], None]


class QueueRegistry:
    """Queues by address, topic subscriptions by pattern, and the policies
    that shape every queue."""

    def __init__(
        self,
        settings: BrokerSettings,
        policies: Policies,
        clock: Clock,
        store: MessageStore,
        stats: BrokerStatistics,
        dead_letter: DeadLetter,
    ) -> None:
        self.settings = settings
        self.policies = policies
        self.clock = clock
        self.store = store
        self.stats = stats
        self.dead_letter = dead_letter
        self.queues: dict[Address, Queue] = {}
        self.temporaries = 0  # of ``queues``, the temporary ones (capped per connection instead)
        # Topic patterns -> what they feed: a Subscription or a DurableSubscription (its ``queue``).
        self.trees: dict[Kind, SubscriptionTree[Any]] = {Kind.TOPIC: SubscriptionTree(), Kind.TEMP_TOPIC: SubscriptionTree()}
        # Queues that may hold redeliveries back, for the broker's timer (a dict as an ordered set).
        self._delaying: dict[Queue, None] = {}

    # -- making queues -----------------------------------------------------

    def configure(self, queue: Queue, *, selector: Any = None) -> Queue:
        """Give ``queue`` its destination's policy: the broker's clock (for
        expiry), its bounds and paging by what it is (a queue, a durable
        subscription's stored queue, a topic subscriber's own queue), and its
        dead-letter routing (not for the dead-letter queues: what fails there
        stays there)."""
        policy = self.policies.for_address(queue.address)
        if queue.address.is_queue:
            limit, high_water, resident = 0, policy.queue_high_water, policy.resident_messages
        elif queue.key is not None:  # a durable subscription's: bounded by its owner (MQTT) if at all
            limit, high_water, resident = 0, 0, policy.resident_messages
        else:
            limit, high_water, resident = policy.topic_buffer_limit, policy.topic_high_water, 0
        delay: Callable[[int], int] | None = None
        if policy.redelivery_delay_ms:
            first, backoff, cap = policy.redelivery_delay_ms, policy.redelivery_backoff, policy.max_redelivery_delay_ms
            delaying = self._delaying

            def held_for(n: int) -> int:
                # Back in the timer's sight: a queue nobody consumed was let go
                # of (a durable subscription or shared group, say, while away).
                delaying[queue] = None
                return int(min(cap, first * backoff ** max(0, n - 1)))

            delay = held_for
            delaying[queue] = None
        dead = not queue.address.text.startswith(policy.dead_letter_queue)
        return queue.configure(
            limit=limit,
            high_water=high_water,
            resident=resident,
            clock=self.clock,
            expired_to_dlq=policy.expired_to_dlq,
            dead_letter=self.dead_letter if dead else None,
            max_redeliveries=policy.max_redeliveries if dead else None,
            redelivery_delay=delay,
            selector=selector,
        )

    def apply_policies(self, entries: list[dict[str, Any]]) -> Policies:
        """Per-destination policy ``entries`` from a reloaded configuration
        (ValueError names a bad one), for what is decided per message and
        the queues made from now on; the named queues there already take
        their new bounds and dead-letter routing too.  A topic subscriber's,
        durable subscription's or shared group's queue keeps what it was
        given (an MQTT session bounds its own) until it is made again."""
        self.policies = Policies(dataclasses.replace(self.settings, policies=entries))
        for queue in self.queues.values():
            if queue.address.is_queue and not queue.address.is_temporary:
                self.configure(queue)
        return self.policies

    def create(self, address: Address, owner: Any = None) -> Queue:
        """A new queue at ``address``; refused (:class:`LimitExceeded`) past
        max_destinations, which temporary queues take no share of."""
        if address.is_temporary:
            self.temporaries += 1
        elif self.destination_count() >= self.settings.max_destinations:
            raise LimitExceeded(f"too many destinations (limit {self.settings.max_destinations})")
        # Temporary queues are never stored: they die with their connection.
        key = None if address.is_temporary else address.text
        queue = self.queues[address] = Queue(address, owner=owner, store=self.store, key=key)
        return self.configure(queue)

    def get(self, address: Address) -> Queue:
        """The queue at ``address``, created if new."""
        return self.queues.get(address) or self.create(address)

    def durable_queue(self, pattern: Address, key: str, selector: Any) -> Queue:
        """A durable subscription's stored queue, keeping what ``selector`` takes."""
        return self.configure(Queue(pattern, store=self.store, key=key), selector=selector)

    def topic_queue(self, pattern: Address, owner: Any, selector: Any) -> Queue:
        """A non-durable topic subscriber's own queue, filtered as the topic fans out."""
        return self.configure(Queue(pattern, owner=owner), selector=selector)

    def shared_queue(self, pattern: Address, key: str | None, selector: Any) -> Queue:
        """A shared subscription group's queue (core.shared), stored under
        ``key`` if the group is durable."""
        queue = Queue(pattern, store=self.store, key=key)
        self.configure(queue, selector=selector)
        return self.configure_shared(queue, durable=key is not None)

    def configure_shared(self, queue: Queue, *, durable: bool) -> Queue:
        """A group's queue holds producers back as a topic subscriber's does
        while its members lag, and past max_shared_group_messages loses its
        oldest (with nobody attached it would otherwise grow without bound);
        a durable group's stored messages page out as a durable's."""
        policy = self.policies.for_address(queue.address)
        return queue.configure(
            limit=self.settings.max_shared_group_messages, high_water=policy.topic_high_water,
            resident=policy.resident_messages if durable else 0,
        )

    def destination_count(self) -> int:
        return len(self.queues) - self.temporaries

    def drop(self, address: Address) -> Queue | None:
        """Take the queue at ``address`` out (it goes away; the caller settles
        what it held)."""
        queue = self.queues.pop(address, None)
        if queue is not None and address.is_temporary:
            self.temporaries -= 1
        return queue

    def remove(self, address: Address, *, force: bool = False) -> int:
        """Delete a queue nobody consumes; one that still holds messages only
        with ``force``, and they go with it, in the store too.  Returns how
        many went."""
        queue = self.queues.get(address)
        if queue is None:
            raise UnknownDestination(f"no destination {address.text!r}")
        if queue.consumers:
            raise InvalidRequest(f"destination {address.text!r} has {len(queue.consumers)} consumers")
        held = queue.depth + len(queue.delayed)
        if held and not force:
            raise QueueNotEmpty(f"queue {address.text!r} holds {held} messages", held)
        dropped = queue.purge()
        self.drop(address)
        return dropped

    # -- topic subscriptions -----------------------------------------------

    def attach(self, pattern: Address, entry: Any) -> None:
        """Feed ``entry`` (its ``queue``) what is published to ``pattern``."""
        self.trees[pattern.kind].add(pattern.segments, entry)

    def detach(self, pattern: Address, entry: Any) -> None:
        self.trees[pattern.kind].remove(pattern.segments, entry)

    # -- routing -----------------------------------------------------------

    def targets_for(self, message: Message) -> list[Queue]:
        """Where ``message`` goes: its queue (created if new; none for a
        temporary one whose owner left: a reply to a requester gone, counted
        as discarded), or the topic subscriptions whose selector (if any) takes it."""
        address = message.address
        if address.is_queue:
            queue = self.queues.get(address)
            if queue is None:
                if address.is_temporary:
                    self.stats.messages_discarded += 1
                    return []
                queue = self.create(address)
            return [queue]
        # A loop, not comprehensions and all(): they are calls of their own, per message.
        targets = []
        selective = False
        for target in self.trees[address.kind].match(address.segments):
            queue = target.queue
            targets.append(queue)
            if queue.selector is not None:
                selective = True
        if not selective:
            return targets
        return [q for q in targets if q.selector is None or q.selector.matches(message)]

    # -- held redeliveries -------------------------------------------------

    def next_redelivery_ms(self) -> int | None:
        """When the earliest held redelivery is due (epoch ms), if any."""
        dues = [q.delayed[0][0] for q in self._delaying if q.delayed]
        return min(dues) if dues else None

    def release_redeliveries(self, now_ms: int) -> int:
        """Put back every held redelivery that is due; returns how many."""
        delaying = self._delaying  # changed in place: each queue's delay function holds it
        for queue in [q for q in delaying if not (q.delayed or q.consumers or q.address in self.queues)]:
            del delaying[queue]
        return sum(q.release_delayed(now_ms) for q in list(delaying))
