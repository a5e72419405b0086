"""The broker facade: routing, subscriptions, acks and transactions per client."""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Any

from core.destinations import Queue
from core.durables import DurableSubscription, durable_key
from core.errors import (
    DuplicateSubscription,
    InvalidDestination,
    InvalidRequest,
    LimitExceeded,
    NotAuthorized,
    TransactionExists,
    UnknownDestination,
    UnknownSubscription,
    UnknownTransaction,
)
from core.matching import SubscriptionTree
from core.messages import DEFAULT_PRIORITY, Message
from core import names
from core.names import Address, Kind, matches
from core.policies import Policies, check_entries
from core.ports import Clock, NoStore, Sink, Store
from core.subscriptions import AckMode, Subscription
from core.transactions import Transaction


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
    max_destinations: int = 10_000
    max_subscriptions_per_client: int = 1_000
    max_transactions_per_client: int = 64
    max_transaction_messages: int = 100_000
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
    __slots__ = ("messages_in", "messages_discarded", "clients", "producer_holds", "dead_lettered")

    def __init__(self) -> None:
        self.messages_in = 0
        self.dead_lettered = 0
        self.producer_holds = 0  # times a producer was held back by flow control
        self.messages_discarded = 0
        self.clients = 0


class Broker:
    """Destinations and routing.  Clients act on it through :class:`Client`."""

    def __init__(
        self, clock: Clock, settings: BrokerSettings | None = None, *, node: str | None = None, store: Store | None = None
    ) -> None:
        self.clock = clock
        self.settings = settings or BrokerSettings()
        self.store: Store = store if store is not None else NoStore()
        self.policies = Policies(self.settings)
        self._delaying: list[Queue] = []  # queues that hold redeliveries back
        self.queues: dict[Address, Queue] = {}
        self.durables: dict[str, DurableSubscription] = {}
        # The last retained message of each topic (MQTT's retain flag), by name.
        self.retained: dict[Address, Message] = {}
        self._trees: dict[Kind, SubscriptionTree[Subscription]] = {
            Kind.TOPIC: SubscriptionTree(),
            Kind.TEMP_TOPIC: SubscriptionTree(),
        }
        self._temporary_owners: dict[Address, Client] = {}
        # Message ids stay unique across restarts without coordination.
        # No colon in ids: STOMP 1.1+ would have to escape it in every MESSAGE.
        self._id_prefix = f"ID-{node or os.urandom(4).hex()}-"
        self._seq = itertools.count(1)
        self._client_seq = itertools.count(1)
        # Idempotency keys of committed transactions, oldest first, each with
        # the LSN that made its commit durable (0 once restored).
        self.commit_keys: dict[str, int] = {}
        self.stats = BrokerStatistics()

    @property
    def durable_lsn(self) -> int:
        return self.store.durable_lsn

    def open_client(self, sink: Sink, *, client_id: str | None = None) -> Client:
        self.stats.clients += 1
        return Client(self, sink, next(self._client_seq), client_id)

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
        """Deliver a committed message to its queue or to every matching topic
        subscriber, storing it first if it is persistent and anything that
        keeps messages gets it.  Returns the LSN that makes it durable.
        A ``producer`` is held back if the message landed in congested queues."""
        targets = self._targets(message.address)
        if not message.address.is_queue:
            targets = self._selected(targets, message)
        elif targets and targets[0].waiters is not None and self.policies.for_address(message.address).send_fail_if_no_space:
            raise LimitExceeded(f"destination {message.address.text!r} is full (send_fail_if_no_space)")
        self.stats.messages_in += 1
        lsn = 0
        if message.persistent:
            keys = [queue.key for queue in targets if queue.key is not None]
            if keys:
                lsn = self.store.add_message(message, keys)
        if message.address.kind is Kind.TOPIC and self.policies.for_address(message.address).archive:
            archived = self.store.archive(message.address.name, message)
            if message.persistent:  # a receipt promises the archived copy too
                lsn = max(lsn, archived)
        if message.address.is_queue and self.policies.for_address(message.address).send_fail_if_no_space:
            producer = None  # a full queue refuses the next SEND instead of holding this one
        self._put(message, targets, producer)
        return lsn

    def retain(self, message: Message) -> int:
        """Keep ``message`` as its topic's retained message; an empty body
        clears it [MQTT-3.3.1-10].  Returns the LSN that makes it durable."""
        address = message.address
        if not message.body:
            if self.retained.pop(address, None) is None:
                return 0
            return self.store.retain(address.text, None)
        self.retained[address] = message
        # Kept on disk whatever its QoS: a retained value is state, not traffic.
        return self.store.retain(address.text, message)

    def retained_for(self, pattern: Address) -> list[Message]:
        """Retained messages a new subscription to ``pattern`` gets, flagged."""
        if not pattern.is_pattern:
            found = self.retained.get(pattern)
            return [] if found is None else [found.retained_copy()]
        system_ok = pattern.segments[0] not in ("*", ">")
        return [
            message.retained_copy()
            for address, message in self.retained.items()
            if address.kind is pattern.kind
            and (system_ok or not address.segments[0].startswith("$"))
            and matches(pattern.segments, address.segments)
        ]

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

    @staticmethod
    def _selected(targets: list[Queue], message: Message) -> list[Queue]:
        """The topic subscriptions whose selector (if any) takes ``message``."""
        if all(queue.selector is None for queue in targets):
            return targets
        return [q for q in targets if q.selector is None or q.selector.matches(message)]

    @staticmethod
    def _put(message: Message, targets: list[Queue], producer: Client | None) -> None:
        congested = None
        for queue in targets:
            queue.put(message)
            if queue.waiters is not None:
                if congested is None:
                    congested = [queue]
                else:
                    congested.append(queue)
        if congested and producer is not None:
            producer._hold(congested)

    def queue(self, address: Address) -> Queue | None:
        return self.queues.get(address)

    def _create_queue(self, address: Address, owner: Client | None = None) -> Queue:
        if len(self.queues) >= self.settings.max_destinations:
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
        headers = dict(message.headers or {})
        headers["originalDestination"] = message.address.text
        headers["originalMessageId"] = message.id
        headers["dlqDeliveryFailureCause"] = reason
        # A new id: the store knows the original by its id until the move commits.
        copy = Message(
            self._id_prefix + str(next(self._seq)), target, headers, message.body, persistent=message.persistent,
            priority=message.priority, expires=0, timestamp=message.timestamp,  # a dead letter does not expire
            redeliveries=message.redeliveries + 1, qos=message.qos,
        )
        if copy.body is None and message.location >= 0:
            self.store.load(copy)  # a stub: its headers and body are on disk
            copy.headers = {**(copy.headers or {}), **headers}
        dead = self.queues.get(target) or self._create_queue(target)
        if message.persistent and message.location >= 0 and queue.key is not None:
            # Atomically: in the DLQ and out of its queue, or neither.
            self.store.transaction([(copy, [dead.key])] if dead.key else [], [(queue.key, message)])
        elif message.persistent and dead.key is not None:
            self.store.add_message(copy, [dead.key])
        queue.stats.discarded += 1
        self.stats.dead_lettered += 1
        dead.put(copy)

    # -- durable subscriptions ----------------------------------------------

    def _durable(self, client_id: str, name: str, pattern: Address) -> tuple[DurableSubscription, int]:
        """The durable subscription, created (and stored) if new or if its
        topic changed (ActiveMQ: re-subscribing elsewhere replaces it)."""
        key = durable_key(client_id, name)
        lsn = 0
        durable = self.durables.get(key)
        if durable is not None and durable.pattern != pattern:
            lsn = self._drop_durable(durable)
            durable = None
        if durable is None:
            resident = self.policies.for_address(pattern).resident_messages
            queue = self._arm(Queue(pattern, store=self.store, key=key, resident=resident))
            durable = self.durables[key] = DurableSubscription(client_id, name, pattern, queue)
            self._trees[pattern.kind].add(pattern.segments, durable)
            lsn = self.store.add_subscription(key, pattern.text)
        return durable, lsn

    def _drop_durable(self, durable: DurableSubscription) -> int:
        self._trees[durable.pattern.kind].remove(durable.pattern.segments, durable)
        del self.durables[durable.key]
        durable.queue.pending.clear()
        durable.queue.relieve()
        return self.store.remove_subscription(durable.key)

    def archived(self, address: Address) -> bool:
        return address.kind is Kind.TOPIC and self.policies.for_address(address).archive

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
        subscriptions: dict[str, tuple[str, str, Address]],
        queues: dict[str, list[Message]],
        retained: list[Message] = (),  # type: ignore[assignment]
    ) -> None:
        """Rebuild what the store recovered: durable subscriptions (key ->
        client id, name, topic) and the messages of every stored queue, in
        their order.  Called once, before any client connects."""
        for key, (client_id, name, pattern) in subscriptions.items():
            resident = self.policies.for_address(pattern).resident_messages
            queue = self._arm(Queue(pattern, store=self.store, key=key, resident=resident))
            durable = self.durables[key] = DurableSubscription(client_id, name, pattern, queue)
            self._trees[pattern.kind].add(pattern.segments, durable)
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
        for message in retained:
            self.retained[message.address] = message

    def _claim(self, address: Address, client: Client) -> None:
        owner = self._temporary_owners.get(address)
        if owner is None:
            self._temporary_owners[address] = client
            client.temporaries.add(address)
            if address.is_queue and address not in self.queues:
                self._create_queue(address, owner=client)
        elif owner is not client:
            raise NotAuthorized(f"temporary destination {address.text!r} belongs to another connection")

    def _release(self, address: Address) -> None:
        self._temporary_owners.pop(address, None)
        queue = self.queues.pop(address, None)
        if queue is not None:
            queue.stats.discarded += len(queue.pending.clear())
            self.stats.messages_discarded += queue.stats.discarded
            queue.relieve()

    def sweep_expired(self) -> int:
        """Remove expired messages from every queue; returns how many."""
        queues = list(self.queues.values()) + [d.queue for d in self.durables.values()]
        return sum(queue.sweep() for queue in queues)

    def remove_queue(self, address: Address) -> int:
        """Delete an unused queue and its messages; returns how many went."""
        queue = self.queues.get(address)
        if queue is None:
            raise UnknownDestination(f"no destination {address.text!r}")
        if queue.consumers:
            raise InvalidRequest(f"destination {address.text!r} has {len(queue.consumers)} consumers")
        dropped = queue.purge()
        del self.queues[address]
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


class Client:
    """One connected client's view of the broker: its subscriptions,
    transactions and temporary destinations, all released by :meth:`close`."""

    def __init__(self, broker: Broker, sink: Sink, number: int, client_id: str | None) -> None:
        self.broker = broker
        self.sink = sink
        self.number = number
        self.client_id = client_id
        self.subscriptions: dict[Any, Subscription] = {}
        self.transactions: dict[str, Transaction] = {}
        self.temporaries: set[Address] = set()
        # Congested queues this client's messages went to; while non-empty
        # the client should not produce (its connection stops reading).
        # Each maps to its delivered count when last checked (check_held).
        self.blocked_on: dict[Queue, int] = {}
        self.last_lsn = 0
        self.held_until = 0.0  # when to check_held next, on the broker clock
        self.closed = False

    # -- producing ---------------------------------------------------------

    def send(self, message: Message, transaction: str | None = None) -> int:
        """Publish, or hold until COMMIT when in a transaction.  Returns the LSN
        a durability promise (a receipt) must wait for."""
        if transaction is None:
            return self.broker.route(message, self)
        tx = self._transaction(transaction)
        self._grow(tx)
        tx.sends.append((message.address, message))
        return 0

    def declare_temporary(self, address: Address) -> None:
        """Claim a temporary destination named in a reply-to before it is subscribed."""
        self.broker._claim(address, self)

    def _hold(self, queues: list[Queue]) -> None:
        if not self.blocked_on:
            self.held_until = self.broker.clock.monotonic() + self.broker.settings.slow_consumer_s
        for queue in queues:
            if queue not in self.blocked_on and queue.wait(self):
                self.blocked_on[queue] = queue.stats.delivered
        if self.blocked_on:
            self.broker.stats.producer_holds += 1

    def unblocked(self, queue: Queue) -> None:
        """A queue we were held back by has drained (core.destinations.Waiter)."""
        self.blocked_on.pop(queue, None)
        if not self.blocked_on and not self.closed:
            self.sink.unblocked()

    def check_held(self, now: float) -> list[Queue]:
        """Called by the session at ``held_until`` while blocked: a queue that
        delivered nothing since the last check has a slow consumer; stop
        waiting for it.  Returns the queues so declared, for the log."""
        if now < self.held_until:
            return []
        slow = []
        for queue, delivered in list(self.blocked_on.items()):
            # Only a topic subscription's own queue can cut a slow consumer
            # loose (it may drop its oldest); a shared queue holds producers
            # for as long as it is full, or the broker would grow without bound.
            if queue.stats.delivered == delivered and queue.limit:
                queue.slow = True
                slow.append(queue)
                queue.relieve()  # may unblock us (and others) right here
            else:
                self.blocked_on[queue] = queue.stats.delivered
        self.held_until = now + self.broker.settings.slow_consumer_s
        return slow

    # -- consuming ---------------------------------------------------------

    def subscribe(
        self,
        token: Any,
        address: Address,
        ack_mode: AckMode,
        prefetch: int | None = None,
        *,
        durable: tuple[str, str] | None = None,
        selector: Any = None,
        priority: int = 0,
        exclusive: bool = False,
    ) -> Subscription:
        """Start consuming.  With ``durable`` = (client id, subscription name)
        a topic subscription outlives the connection.  The LSN that makes a
        new durable subscription durable is left in ``last_lsn``."""
        self.last_lsn = 0
        if token in self.subscriptions:
            raise DuplicateSubscription(f"subscription {token!r} already exists on this connection")
        if len(self.subscriptions) >= self.broker.settings.max_subscriptions_per_client:
            raise LimitExceeded(f"too many subscriptions (limit {self.broker.settings.max_subscriptions_per_client})")
        if address.is_pattern and address.is_queue:
            raise InvalidDestination("wildcards are supported on topic subscriptions only")
        if address.is_temporary:
            if address.is_pattern:
                # A wildcard would reach into other connections' private replies.
                raise InvalidDestination("wildcards are not allowed on temporary destinations")
            self.broker._claim(address, self)
        policy = self.broker.policies.for_address(address)
        window = prefetch if prefetch and prefetch > 0 else policy.default_prefetch
        if durable is not None:
            return self._subscribe_durable(token, address, ack_mode, window, durable, selector)
        if address.is_queue:
            queue = self.broker.queues.get(address) or self.broker._create_queue(address)
            subscription = Subscription(token, address, queue, self.sink, ack_mode, window, private=False, owner=self)
            subscription.selector = selector  # consumers of one queue may each filter
            subscription.priority = priority
            subscription.exclusive = exclusive
        else:
            queue = self.broker._arm(
                Queue(address, owner=self, limit=policy.topic_buffer_limit, high_water=policy.topic_high_water)
            )
            queue.selector = selector  # filtered as the topic fans out
            subscription = Subscription(token, address, queue, self.sink, ack_mode, window, private=True, owner=self)
            self.broker._trees[address.kind].add(address.segments, subscription)
        self.subscriptions[token] = subscription
        queue.add_consumer(subscription)
        return subscription

    def _subscribe_durable(
        self, token: Any, address: Address, ack_mode: AckMode, window: int, owner: tuple[str, str], selector: Any = None
    ) -> Subscription:
        client_id, name = owner
        if address.kind is not Kind.TOPIC:
            raise InvalidDestination("durable subscriptions are for /topic/ destinations")
        existing = self.broker.durables.get(durable_key(client_id, name))
        if existing is not None and existing.active is not None:
            raise DuplicateSubscription(f"durable subscription {name!r} of client {client_id!r} is already active")
        durable, self.last_lsn = self.broker._durable(client_id, name, address)
        durable.queue.selector = selector  # what is kept from now on
        subscription = Subscription(token, address, durable.queue, self.sink, ack_mode, window, private=False, owner=self)
        subscription.durable = durable
        durable.active = subscription
        self.subscriptions[token] = subscription
        durable.queue.add_consumer(subscription)  # what waited while away goes out now
        return subscription

    def unsubscribe(self, token: Any, *, remove_durable: bool = False) -> int:
        """Stop consuming.  A durable subscription stays (and keeps collecting)
        unless ``remove_durable``; returns the LSN of its removal."""
        subscription = self.subscriptions.pop(token, None)
        if subscription is None:
            raise UnknownSubscription(f"no subscription {token!r} on this connection")
        self._detach(subscription)
        if remove_durable and subscription.durable is not None:
            return self.broker._drop_durable(subscription.durable)
        return 0

    def remove_durable(self, client_id: str, name: str) -> int:
        """Remove the offline durable subscription ``name`` of ``client_id``."""
        durable = self.broker.durables.get(durable_key(client_id, name))
        if durable is None:
            raise UnknownSubscription(f"no durable subscription {name!r} for client {client_id!r}")
        if durable.active is not None:
            raise InvalidRequest(f"durable subscription {name!r} is in use by another connection")
        return self.broker._drop_durable(durable)

    def _detach(self, subscription: Subscription) -> None:
        queue = subscription.queue
        if subscription.durable is not None:
            subscription.durable.active = None
        queue.remove_consumer(subscription)
        unacked = subscription.take_all()
        if subscription.private:
            self.broker._trees[subscription.address.kind].remove(subscription.address.segments, subscription)
            queue.relieve()  # nobody will drain it now; free its producers
        elif unacked:
            queue.requeue(unacked)

    def subscription(self, token: Any) -> Subscription:
        subscription = self.subscriptions.get(token)
        if subscription is None:
            raise UnknownSubscription(f"no subscription {token!r} on this connection")
        return subscription

    def ack(self, token: Any, message_id: str, transaction: str | None = None) -> int:
        subscription = self.subscription(token)
        tx = None if transaction is None else self._transaction(transaction)
        if tx is not None:
            self._grow(tx)  # before take: a refused ACK must leave the message unacked
        messages = subscription.take(message_id)
        lsn = 0
        if tx is None:
            lsn = subscription.queue.acked(messages)
        else:
            tx.acks.append((subscription, messages))
        subscription.queue.dispatch()
        return lsn

    def nack(self, token: Any, message_id: str, transaction: str | None = None) -> int:
        """Put messages back for redelivery with their delivery count raised."""
        subscription = self.subscription(token)
        tx = None if transaction is None else self._transaction(transaction)
        if tx is not None:
            self._grow(tx)
        messages = subscription.take(message_id)
        if tx is None:
            subscription.queue.requeue(messages)
        else:
            tx.nacks.append((subscription, messages))
            subscription.queue.dispatch()
        return 0

    def resume(self) -> None:
        """The sink is accepting again: hand it what waited meanwhile."""
        for subscription in list(self.subscriptions.values()):
            subscription.queue.dispatch()

    # -- transactions ------------------------------------------------------

    def begin(self, transaction: str) -> None:
        if transaction in self.transactions:
            raise TransactionExists(f"transaction {transaction!r} is already open")
        if len(self.transactions) >= self.broker.settings.max_transactions_per_client:
            raise LimitExceeded(f"too many open transactions (limit {self.broker.settings.max_transactions_per_client})")
        self.transactions[transaction] = Transaction(transaction)

    def commit_once(self, transaction: str, key: str) -> tuple[int, bool]:
        """COMMIT with an idempotency key: a key committed before (within the
        remembered window) makes this a replay whose sends are discarded; its
        acks and nacks settle as usual.  Returns the LSN a receipt waits for
        and whether it was such a duplicate."""
        earlier = self.broker.commit_keys.get(key)
        if earlier is None:
            return self.commit(transaction, key), False
        self._transaction(transaction).sends.clear()
        return max(earlier, self.commit(transaction)), True

    def commit(self, transaction: str, key: str | None = None) -> int:
        tx = self._transaction(transaction)
        # All or nothing: create every queue the sends need before routing any.
        broker = self.broker
        missing = {a for a, _ in tx.sends if a.is_queue and not a.is_temporary and a not in broker.queues}
        if len(broker.queues) + len(missing) > broker.settings.max_destinations:
            raise LimitExceeded(f"too many destinations (limit {broker.settings.max_destinations})")
        del self.transactions[transaction]
        routed = [
            (message, broker._targets(address) if address.is_queue else broker._selected(broker._targets(address), message))
            for address, message in tx.sends
        ]
        # One store record for all of it, so a crash keeps all or none.
        adds = []
        for message, targets in routed:
            if message.persistent:
                keys = [queue.key for queue in targets if queue.key is not None]
                if keys:
                    adds.append((message, keys))
        acks = [
            (subscription.queue.key, message)
            for subscription, messages in tx.acks
            if subscription.queue.key is not None
            for message in messages
            if message.location >= 0
        ]
        archived = [(address.name, message) for address, message in tx.sends if broker.archived(address)]
        lsn = 0
        if adds or acks or archived or key is not None:
            lsn = broker.store.transaction(adds, acks, archived=archived, commit_key=key)
        if key is not None:
            broker._remember_commit(key, lsn)
        for message, targets in routed:
            broker.stats.messages_in += 1
            broker._put(message, targets, self)
        for subscription, messages in tx.acks:
            subscription.queue.stats.dequeued += len(messages)
            subscription.queue.dispatch()
        for subscription, messages in tx.nacks:
            subscription.queue.requeue(messages)
        return lsn

    def abort(self, transaction: str) -> None:
        tx = self.transactions.pop(transaction, None)
        if tx is None:
            raise UnknownTransaction(f"no open transaction {transaction!r}")
        self._roll_back(tx)

    def _roll_back(self, tx: Transaction) -> None:
        for subscription, messages in tx.settled_back():
            subscription.queue.requeue(messages)

    def _transaction(self, transaction: str) -> Transaction:
        tx = self.transactions.get(transaction)
        if tx is None:
            raise UnknownTransaction(f"no open transaction {transaction!r}")
        return tx

    def _grow(self, tx: Transaction) -> None:
        if tx.size >= self.broker.settings.max_transaction_messages:
            raise LimitExceeded(
                f"transaction {tx.id!r} holds too many frames (limit {self.broker.settings.max_transaction_messages})"
            )
        tx.size += 1

    # -- leaving -----------------------------------------------------------

    def close(self) -> None:
        """Abort open transactions, return unacked messages to their queues,
        and drop this client's temporary destinations.  Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.broker.stats.clients -= 1
        # Detach first, so rolled-back acks go to the other consumers, not to us.
        subscriptions, self.subscriptions = self.subscriptions, {}
        for subscription in subscriptions.values():
            self._detach(subscription)
        transactions, self.transactions = self.transactions, {}
        for tx in transactions.values():
            self._roll_back(tx)
        for address in self.temporaries:
            self.broker._release(address)
        self.temporaries.clear()
        for queue in self.blocked_on:
            if queue.waiters is not None and self in queue.waiters:
                queue.waiters.remove(self)
        self.blocked_on.clear()
