"""The broker facade: routing, subscriptions, acks and transactions per client."""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Sequence
from typing import Any

from core.authorization import ANONYMOUS_PRINCIPAL, Authorizer, Principal
from core.destinations import Queue
from core.durables import ANONYMOUS_OWNER, DurableSubscription, Durables, durable_key
from core.errors import (
    InvalidDestination,
    InvalidRequest,
    LimitExceeded,
    NotAuthorized,
    QueueNotEmpty,
    UnknownDestination,
)
from core.matching import SubscriptionTree
from core.messages import DEFAULT_PRIORITY, Message, store_transaction
from core import names
from core.names import Address, Kind
from core.policies import Policies, check_entries
from core.retained import RetainedMessages
from core.selectors import Selector, SelectorError, compile_selector
from core.ports import Clock, Sink
from core.storage import MessageStore, NoStore
from core.clients import Client
from core.subscriptions import Subscription
from core.temporaries import Temporaries


@dataclasses.dataclass(frozen=True)
class BrokerSettings:
    # ActiveMQ's default queue prefetch.
    default_prefetch: int = 1000
    # Messages a non-durable topic subscriber may fall behind before the oldest
    # are discarded (ActiveMQ's pending-message limit strategy).
    topic_buffer_limit: int = 10_000
    # A topic subscriber this far behind holds back the topic's producers
    # (ActiveMQ's producer flow control) until it has caught up half of it.
    topic_high_water: int = 1_000
    # ...unless it takes nothing for this long while producers wait: then it
    # is a slow consumer, and it alone pays (its buffer overflows at
    # topic_buffer_limit) rather than every subscriber of the topic.
    slow_consumer_s: float = 2.0
    # Stored messages a queue keeps in memory with their bodies; beyond this
    # they wait on disk and are read back on dispatch.
    resident_messages: int = 10_000
    # A message NACKed, rolled back or left unacked this many times more than
    # its first delivery goes to the dead-letter queue (ActiveMQ's default 6).
    max_redeliveries: int = 6
    dead_letter_queue: str = "/queue/DLQ"
    # True: each queue's dead letters go to DLQ.<its name> instead.
    dead_letter_per_destination: bool = False
    # A queue this deep holds its producers back (their connections stop
    # reading) until consumers bring it down to half; 0 = no limit.  With
    # send_fail_if_no_space the SEND is refused with an error instead.
    queue_high_water: int = 100_000
    send_fail_if_no_space: bool = False
    # Expired persistent messages go to the dead-letter queue (non-persistent
    # ones are dropped); false drops both.  Counted either way.
    expired_to_dlq: bool = True
    # Redelivery delay: the first redelivery waits this long (0: at once),
    # each later one backoff times longer, up to the maximum.
    redelivery_delay_ms: int = 0
    redelivery_backoff: float = 1.0
    max_redelivery_delay_ms: int = 60_000
    # Queues and durable subscriptions; temporary destinations do not count
    # here (one client could otherwise take them all) but against their
    # connection's own max_temporaries_per_client.
    max_destinations: int = 10_000
    max_temporaries_per_client: int = 100
    max_subscriptions_per_client: int = 1_000
    max_transactions_per_client: int = 64
    max_transaction_messages: int = 100_000
    # Bytes (bodies and headers) held in open transactions until COMMIT: per
    # connection, all its transactions together, and broker-wide; 0 = no limit.
    max_transaction_bytes_per_client: int = 64 * 1024 * 1024
    max_transaction_bytes_total: int = 512 * 1024 * 1024
    # Retained messages (MQTT) kept broker-wide, and their body bytes (0 = no
    # limit): past either a new retained topic is not kept (the publish is
    # still routed), nor a larger value for a kept one; replacing one with a
    # value no larger and clearing one always work.
    max_retained_messages: int = 100_000
    max_retained_bytes: int = 256 * 1024 * 1024
    # Durable subscriptions (STOMP's and persistent MQTT sessions' filters)
    # one logged-in user may hold, and all clients together; past either the
    # SUBSCRIBE is refused (0 = no limit).  Anonymous clients of an open
    # broker are bound by the broker-wide limit alone: they are every device
    # of a broker without users, not one user to be fair to.
    max_durable_subscriptions_per_user: int = 1_000
    max_durable_subscriptions: int = 100_000
    # Topic archives (per-destination policy, usually): every message
    # published to an archived topic gets the topic's next offset and is kept
    # until retention drops it, by age and by bytes per topic (0 = no limit).
    archive: bool = False
    archive_retention_s: int = 0
    archive_retention_bytes: int = 0
    # Idempotency keys of COMMITs remembered (persistently) so a replayed
    # transaction is discarded; the oldest are forgotten beyond this.
    commit_keys: int = 100_000
    # Per-destination overrides of the settings above (core/policies.py).
    policies: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        check_entries(self, self.policies)  # a bad entry fails at start-up, named


class BrokerStatistics:
    __slots__ = (
        "messages_in", "messages_discarded", "clients", "producer_holds", "dead_lettered", "denied", "retained_refused",
    )

    def __init__(self) -> None:
        self.denied: dict[str, int] = {}  # operations the authorization map refused, by operation
        self.messages_in = 0
        self.dead_lettered = 0
        self.producer_holds = 0  # times a producer was held back by flow control
        self.messages_discarded = 0
        self.clients = 0
        self.retained_refused = 0  # retained messages not kept for max_retained_*


class Broker:
    """Destinations and routing.  Clients act on it through :class:`Client`."""

    def __init__(
        self,
        clock: Clock,
        settings: BrokerSettings | None = None,
        *,
        node: str | None = None,
        store: MessageStore | None = None,
        authorizer: Authorizer | None = None,
    ) -> None:
        self.clock = clock
        # None: no authorization map, every client may do everything.
        self.authorizer = authorizer
        # True once users exist (the app sets it): durable state then needs a
        # login and ownerless state is nobody's (core.durables.claim_refusal).
        self.secured = False
        self.settings = settings or BrokerSettings()
        self.store: MessageStore = store if store is not None else NoStore()
        self.policies = Policies(self.settings)
        self._delaying: list[Queue] = []  # queues that hold redeliveries back
        self.queues: dict[Address, Queue] = {}
        self.durables = Durables()
        # The last retained message of each topic (MQTT's retain flag), by name.
        self.retained = RetainedMessages()
        self._trees: dict[Kind, SubscriptionTree[Subscription]] = {
            Kind.TOPIC: SubscriptionTree(),
            Kind.TEMP_TOPIC: SubscriptionTree(),
        }
        self.temporaries = Temporaries(self)
        self.transaction_bytes = 0  # held in every client's open transactions
        # Message ids stay unique across restarts without coordination.
        # No colon in ids: STOMP 1.1+ would have to escape it in every MESSAGE.
        self._id_prefix = f"ID-{node or os.urandom(4).hex()}-"
        self._seq = itertools.count(1)
        self._client_seq = itertools.count(1)
        # Idempotency keys of committed transactions, oldest first, each with
        # the LSN that made its commit durable (0 once restored).
        self.commit_keys: dict[str, int] = {}
        self.stats = BrokerStatistics()
        # The disk alarm (free space below the store's minimum, told by the
        # app): persistent producers wait in ``disk_waiters``, in order.
        self.disk_alarm = False
        self.disk_waiters: dict[Client, None] = {}

    def set_disk_alarm(self, on: bool) -> bool:
        """Free space went below the store's minimum (on) or came back (off);
        True if that changed anything.  Clearing it lets every producer it
        held go on, unless a congested queue still holds it."""
        if on == self.disk_alarm:
            return False
        self.disk_alarm = on
        if not on:
            waiters, self.disk_waiters = self.disk_waiters, {}
            for client in waiters:
                if not client.closed and not client.blocked_on:
                    client.sink.unblocked()
        return True

    @property
    def durable_lsn(self) -> int:
        return self.store.durable_lsn

    def open_client(
        self, sink: Sink, *, client_id: str | None = None, principal: Principal = ANONYMOUS_PRINCIPAL
    ) -> Client:
        self.stats.clients += 1
        return Client(self, sink, next(self._client_seq), client_id, principal)

    def message(
        self,
        address: Address,
        headers: dict[str, str],
        body: bytes,
        *,
        persistent: bool = False,
        priority: int = DEFAULT_PRIORITY,
        expires: int = 0,
    ) -> Message:
        """A new message with a fresh id and the broker's timestamp."""
        if address.is_pattern:
            raise InvalidDestination(f"cannot send to a wildcard destination {address.text!r}")
        return Message(
            self._id_prefix + str(next(self._seq)),
            address,
            headers,
            body,
            persistent=persistent,
            priority=priority,
            expires=expires,
            timestamp=self.clock.wall_ms(),
        )

    def route(self, message: Message, producer: Client | None = None) -> int:
        """Deliver one message outside a transaction: :meth:`publish`'s rules
        for one message, without the bookkeeping for many, because every
        SEND and PUBLISH comes this way (measured: the general path cost
        about 4% of the broker's CPU per message)."""
        address = message.address
        policy = self.policies.for_address(address)
        targets = self._targets_for(message)
        refuses = policy.send_fail_if_no_space and address.is_queue
        if refuses and targets:
            self._refuse_if_full(targets[0], 1)
        lsn = 0
        if message.persistent:
            keys = [queue.key for queue in targets if queue.key is not None]
            if keys:
                lsn, message.location = self.store.add_message(message.record(), keys)
        if policy.archive and address.kind is Kind.TOPIC:
            archived = self.store.archive_message(address.name, message.record())
            if message.persistent:  # a receipt promises the archived copy too
                lsn = max(lsn, archived)
        self.stats.messages_in += 1
        # A full queue under send_fail_if_no_space refuses the next SEND instead of holding this one.
        if self._put(message, targets) and producer is not None and not refuses:
            producer._hold([queue for queue in targets if queue.waiters is not None])
        return lsn

    @staticmethod
    def _refuse_if_full(queue: Queue, count: int) -> None:
        """Under send_fail_if_no_space: refuse (:class:`LimitExceeded`)
        ``count`` more messages for a queue that is full or that they would fill."""
        if queue.waiters is not None or (queue.high_water and queue.depth + count > queue.high_water):
            raise LimitExceeded(f"destination {queue.address.text!r} is full (send_fail_if_no_space)")

    def publish(
        self,
        messages: Sequence[Message],
        producer: Client | None = None,
        *,
        acks: Sequence[tuple[str, Message]] = (),
        commit_key: str | None = None,
    ) -> int:
        """Deliver committed messages, all or none: each to its queue or to
        every matching topic subscriber, storing persistent ones first where
        anything keeps them (with a COMMIT's acks and idempotency key in the
        same store record).  Returns the LSN that makes it durable.

        One rule for a SEND and a COMMIT: a queue that is full, or that these
        messages would fill, refuses them all under send_fail_if_no_space;
        otherwise they go in and ``producer`` is held until it drains."""
        if len(messages) > 1:  # create no queue unless all of them can be
            missing = {m.address for m in messages if m.address.kind is Kind.QUEUE and m.address not in self.queues}
            if self._destination_count() + len(missing) > self.settings.max_destinations:
                raise LimitExceeded(f"too many destinations (limit {self.settings.max_destinations})")
        routed = []
        adds = []
        archived = []
        adding: dict[Queue, int] | None = None  # queues that refuse rather than hold: how many each gets
        for message in messages:
            address = message.address
            policy = self.policies.for_address(address)
            targets = self._targets_for(message)
            routed.append((message, targets, policy))
            if policy.send_fail_if_no_space and address.is_queue and targets:
                adding = adding or {}
                adding[targets[0]] = adding.get(targets[0], 0) + 1
            if message.persistent:
                keys = [queue.key for queue in targets if queue.key is not None]
                if keys:
                    adds.append((message, keys))
            if policy.archive and address.kind is Kind.TOPIC:
                archived.append((address.name, message))
        if adding is not None:
            for queue, count in adding.items():
                self._refuse_if_full(queue, count)
        lsn = 0
        if adds or acks or archived or commit_key is not None:
            lsn = store_transaction(self.store, adds, acks, archived=archived, commit_key=commit_key)
        if commit_key is not None:
            self._remember_commit(commit_key, lsn)
        congested: dict[Queue, None] | None = None
        for message, targets, policy in routed:
            self.stats.messages_in += 1
            # A full queue under send_fail_if_no_space refuses the next SEND instead of holding this one.
            if self._put(message, targets) and producer is not None and not (
                policy.send_fail_if_no_space and message.address.is_queue
            ):
                congested = congested or {}
                congested.update((q, None) for q in targets if q.waiters is not None)
        if congested:
            producer._hold(list(congested))  # type: ignore[union-attr]
        return lsn

    def retain(self, message: Message) -> int:
        """Keep ``message`` as its topic's retained message; an empty body
        clears it [MQTT-3.3.1-10].  Returns the LSN that makes it durable."""
        address = message.address
        if not message.body:
            if self.retained.pop(address) is None:
                return 0
            return self.store.retain(address.text, None)
        self._check_retained(message)
        self.retained.put(message)
        # Kept on disk whatever its QoS: a retained value is state, not traffic.
        return self.store.retain(address.text, message.record(), message.qos)

    def _check_retained(self, message: Message) -> None:
        """Refuse (:class:`LimitExceeded`) a retained message past the
        broker-wide bounds: clients choosing topic names must not grow the
        process (and the store) without bound."""
        reason = self.retained.refusal(message, self.settings.max_retained_messages, self.settings.max_retained_bytes)
        if reason is not None:
            self.stats.retained_refused += 1
            raise LimitExceeded(reason)

    def retained_for(self, pattern: Address, limit: int = 0) -> list[Message]:
        """Retained messages a new subscription to ``pattern`` gets, flagged:
        at most ``limit`` (0: all), what its queue can hold (more would be
        copied only to be dropped, on the event loop, per SUBSCRIBE)."""
        return [message.retained_copy() for message in self.retained.matching(pattern, limit)]

    def _targets(self, address: Address) -> list[Queue]:
        if address.is_queue:
            queue = self.queues.get(address)
            if queue is None:
                if address.is_temporary:
                    # The owner is gone: a reply to a requester that left.
                    self.stats.messages_discarded += 1
                    return []
                queue = self._create_queue(address)
            return [queue]
        return [target.queue for target in self._trees[address.kind].match(address.segments)]

    def _targets_for(self, message: Message) -> list[Queue]:
        """Where ``message`` goes: its queue, or the topic subscriptions whose
        selector (if any) takes it."""
        targets = self._targets(message.address)
        return targets if message.address.is_queue else self._selected(targets, message)

    @staticmethod
    def _selected(targets: list[Queue], message: Message) -> list[Queue]:
        """The topic subscriptions whose selector (if any) takes ``message``."""
        if all(queue.selector is None for queue in targets):
            return targets
        return [q for q in targets if q.selector is None or q.selector.matches(message)]

    @staticmethod
    def _put(message: Message, targets: list[Queue]) -> bool:
        """Put ``message`` in each target; whether any of them is congested."""
        congested = False
        for queue in targets:
            queue.put(message)
            if queue.waiters is not None:
                congested = True
        return congested

    def queue(self, address: Address) -> Queue | None:
        return self.queues.get(address)

    def _destination_count(self) -> int:
        return len(self.queues) - self.temporaries.queues

    def _create_queue(self, address: Address, owner: Client | None = None) -> Queue:
        if address.is_temporary:
            self.temporaries.queues += 1  # capped per connection instead (core/temporaries.py)
        elif self._destination_count() >= self.settings.max_destinations:
            raise LimitExceeded(f"too many destinations (limit {self.settings.max_destinations})")
        # Temporary queues are never stored: they die with their connection.
        key = None if address.is_temporary else address.text
        policy = self.policies.for_address(address)
        queue = self.queues[address] = Queue(
            address, owner=owner, store=self.store, key=key, resident=policy.resident_messages,
            high_water=policy.queue_high_water,
        )
        self._arm(queue)
        return queue

    def _arm(self, queue: Queue) -> Queue:
        """Give a queue the broker's clock (for expiry) and its dead-letter
        routing (not the dead-letter queues: what fails there stays there)."""
        policy = self.policies.for_address(queue.address)
        queue.clock = self.clock
        queue.expired_to_dlq = policy.expired_to_dlq
        if not queue.address.text.startswith(policy.dead_letter_queue):
            queue.dead_letter = self._dead_letter
            queue.max_redeliveries = policy.max_redeliveries
        if policy.redelivery_delay_ms:
            first, backoff, cap = policy.redelivery_delay_ms, policy.redelivery_backoff, policy.max_redelivery_delay_ms
            queue.redelivery_delay = lambda n: int(min(cap, first * backoff ** max(0, n - 1)))
            self._delaying.append(queue)
        return queue

    def next_redelivery_ms(self) -> int | None:
        """When the earliest held redelivery is due (epoch ms), if any."""
        dues = [q.delayed[0][0] for q in self._delaying if q.delayed]
        return min(dues) if dues else None

    def release_redeliveries(self, now_ms: int) -> int:
        """Put back every held redelivery that is due; returns how many."""
        self._delaying = [q for q in self._delaying if q.delayed or q.consumers or q.address in self.queues]
        return sum(q.release_delayed(now_ms) for q in self._delaying)

    def _dead_letter(self, queue: Queue, message: Message, reason: str) -> None:
        """Move a message that keeps failing to the dead-letter queue, saying
        where it came from and why; one store record for the move."""
        settings = self.policies.for_address(queue.address)
        name = settings.dead_letter_queue
        if settings.dead_letter_per_destination:
            name = f"{name}.{queue.address.name}"
        target = names.parse(name)
        if isinstance(target, str):
            target = names.parse("/queue/DLQ")
        assert not isinstance(target, str)
        body = message.body
        headers = dict(message.headers or {})
        if body is None and message.location >= 0:
            # A stub: its headers and body are on disk.  Read into a copy of
            # the stub (the new message has no place on disk yet).
            loaded = message.stub()
            if not loaded.load(self.store):
                # Its record is damaged (the store reported it): nothing is
                # left to dead-letter, so it is only forgotten.
                if queue.key is not None:
                    self.store.ack(queue.key, message.id)
                queue.stats.discarded += 1
                return
            body, headers = loaded.body, dict(loaded.headers or {})
        headers["originalDestination"] = message.address.text
        headers["originalMessageId"] = message.id
        headers["dlqDeliveryFailureCause"] = reason
        # A new id: the store knows the original by its id until the move commits.
        copy = Message(
            self._id_prefix + str(next(self._seq)), target, headers, body, persistent=message.persistent,
            priority=message.priority, expires=0, timestamp=message.timestamp,  # a dead letter does not expire
            redeliveries=message.redeliveries + 1, qos=message.qos,
        )
        dead = self.queues.get(target) or self._create_queue(target)
        if message.persistent and message.location >= 0 and queue.key is not None:
            # Atomically: in the DLQ and out of its queue, or neither.
            store_transaction(self.store, [(copy, [dead.key])] if dead.key else [], [(queue.key, message)])
        elif message.persistent and dead.key is not None:
            _, copy.location = self.store.add_message(copy.record(), [dead.key])
        queue.stats.discarded += 1
        self.stats.dead_lettered += 1
        dead.put(copy)

    # -- durable subscriptions ----------------------------------------------

    def _durable(
        self, client_id: str, name: str, pattern: Address, selector: Selector | None = None, owner: str | None = None
    ) -> tuple[DurableSubscription, int]:
        """The durable subscription, created (and stored, selector and owner
        included) if new, or anew if its topic or selector changed: JMS 1.1
        §6.11.1 makes changing a durable subscriber deleting it and creating
        another.  Whether the caller may is the caller's check (Client)."""
        key = durable_key(client_id, name)
        lsn = 0
        durable = self.durables.get(key)
        text = _text(selector)
        changed = durable is not None and (durable.pattern != pattern or _text(durable.queue.selector) != text)
        if durable is None or changed:  # checked before the old one goes: a refusal changes nothing
            self._check_durables(owner, frees=changed and durable is not None and durable.owner == owner)
        if durable is not None and changed:
            lsn = self._drop_durable(durable)
            durable = None
        if durable is None:
            durable = self._add_durable(key, client_id, name, pattern, selector, owner)
            lsn = self.store.add_subscription(key, pattern.text, text, owner)
        return durable, lsn

    def _check_durables(self, owner: str | None, frees: bool) -> None:
        """Refuse (:class:`LimitExceeded`) one more durable subscription of
        ``owner`` past max_durable_subscriptions_per_user (``frees``: it
        replaces one of theirs): each is a queue kept on disk until removed."""
        limit = self.settings.max_durable_subscriptions_per_user
        if limit and owner != ANONYMOUS_OWNER and self.durables.held_by(owner) - frees >= limit:
            raise LimitExceeded(f"too many durable subscriptions for user {owner!r} (limit {limit})")
        total = self.settings.max_durable_subscriptions
        if total and len(self.durables) - frees >= total:
            raise LimitExceeded(f"too many durable subscriptions on the broker (limit {total})")

    def _add_durable(
        self, key: str, client_id: str, name: str, pattern: Address, selector: Selector | None, owner: str | None
    ) -> DurableSubscription:
        resident = self.policies.for_address(pattern).resident_messages
        queue = self._arm(Queue(pattern, store=self.store, key=key, resident=resident))
        queue.selector = selector  # what it keeps, offline too
        durable = DurableSubscription(client_id, name, pattern, queue, owner)
        self.durables.add(durable)
        self._trees[pattern.kind].add(pattern.segments, durable)
        return durable

    def _drop_durable(self, durable: DurableSubscription) -> int:
        self._trees[durable.pattern.kind].remove(durable.pattern.segments, durable)
        self.durables.remove(durable)
        durable.queue.pending.clear()
        durable.queue.relieve()
        return self.store.remove_subscription(durable.key)

    def remove_durable(self, key: str) -> int:
        """An administrator's removal of an offline durable subscription,
        whoever owns it; returns the LSN of the removal."""
        durable = self.durables.get(key)
        if durable is None:
            raise UnknownDestination(f"no durable subscription {key!r}")
        if durable.active is not None:
            raise InvalidRequest(f"durable subscription {key!r} is in use by a connection")
        return self._drop_durable(durable)

    def restore_commit_keys(self, keys: list[str]) -> None:
        """Idempotency keys remembered from before a restart, oldest first."""
        for key in keys[-self.settings.commit_keys :]:
            self.commit_keys[key] = 0

    def _remember_commit(self, key: str, lsn: int) -> None:
        keys = self.commit_keys
        keys[key] = lsn
        while len(keys) > self.settings.commit_keys:
            oldest = next(iter(keys))
            del keys[oldest]
            self.store.forget_commit_key(oldest)

    def restore(
        self,
        subscriptions: dict[str, tuple[str, str, Address, str | None, str | None]],
        queues: dict[str, list[Message]],
        retained: list[Message] = (),  # type: ignore[assignment]
    ) -> None:
        """Rebuild what the store recovered: durable subscriptions (key ->
        client id, name, topic, selector text, owner or None) and the messages of every
        stored queue, in their order.  Called once, before any client connects."""
        for key, (client_id, name, pattern, text, owner) in subscriptions.items():
            # A stored selector compiled once already; should this version
            # refuse it, keeping everything loses nothing.
            try:
                selector = compile_selector(text) if text else None
            except SelectorError:
                selector = None
            self._add_durable(key, client_id, name, pattern, selector, owner)
        for key, messages in queues.items():
            durable = self.durables.get(key)
            if durable is not None:
                target = durable.queue
            else:
                address = messages[0].address if messages else None
                if address is None or not address.is_queue or address.text != key:
                    continue  # messages of a subscription that no longer exists
                target = self.queues.get(address) or self._create_queue(address)
            for message in messages:
                target.pending.push(message)
                target.stats.enqueued += 1
        for message in retained:  # all of them, even past a lowered limit: nothing kept is lost
            self.retained.put(message)

    def sweep_expired(self) -> int:
        """Remove expired messages from every queue; returns how many."""
        queues = list(self.queues.values()) + [d.queue for d in self.durables.values()]
        return sum(queue.sweep() for queue in queues)

    def remove_queue(self, address: Address, *, force: bool = False) -> int:
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
        del self.queues[address]
        if address.is_temporary:
            self.temporaries.queues -= 1
        return dropped

    def statistics(self) -> dict[str, Any]:
        return {
            "clients": self.stats.clients,
            "messages_in": self.stats.messages_in,
            "messages_discarded": self.stats.messages_discarded,
            "producer_holds": self.stats.producer_holds,
            "dead_lettered": self.stats.dead_lettered,
            "queues": {q.address.text: (q.depth, len(q.consumers)) for q in self.queues.values()},
            "durable_subscriptions": {d.key: (d.queue.depth, d.active is not None) for d in self.durables.values()},
        }


def _text(selector: Selector | None) -> str | None:
    return selector.text if selector is not None else None
