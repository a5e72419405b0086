"""The broker facade: routing, subscriptions, acks and transactions per client."""

from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Any

from core.authorization import ANONYMOUS_PRINCIPAL, Authorizer, Principal
from core.destinations import Queue
from core.durables import DurableSubscription, durable_key
from core.errors import (
    InvalidDestination,
    InvalidRequest,
    LimitExceeded,
    NotAuthorized,
    QueueNotEmpty,
    UnknownDestination,
)
from core.matching import SubscriptionTree
from core.messages import DEFAULT_PRIORITY, Message
from core import names
from core.names import Address, Kind, matches
from core.policies import Policies, check_entries
from core.selectors import Selector, SelectorError, compile_selector
from core.ports import Clock, NoStore, Sink, Store
from core.clients import Client
from core.subscriptions import Subscription


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
    __slots__ = ("messages_in", "messages_discarded", "clients", "producer_holds", "dead_lettered", "denied")

    def __init__(self) -> None:
        self.denied: dict[str, int] = {}  # operations the authorization map refused, by operation
        self.messages_in = 0
        self.dead_lettered = 0
        self.producer_holds = 0  # times a producer was held back by flow control
        self.messages_discarded = 0
        self.clients = 0


class Broker:
    """Destinations and routing.  Clients act on it through :class:`Client`."""

    def __init__(
        self,
        clock: Clock,
        settings: BrokerSettings | None = None,
        *,
        node: str | None = None,
        store: Store | None = None,
        authorizer: Authorizer | None = None,
    ) -> None:
        self.clock = clock
        # None: no authorization map, every client may do everything.
        self.authorizer = authorizer
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
        """Deliver a committed message to its queue or to every matching topic
        subscriber, storing it first if it is persistent and anything that
        keeps messages gets it.  Returns the LSN that makes it durable.
        A ``producer`` is held back if the message landed in congested queues."""
        address = message.address
        policy = self.policies.for_address(address)
        targets = self._targets_for(message)
        if address.is_queue and targets and targets[0].waiters is not None and policy.send_fail_if_no_space:
            raise LimitExceeded(f"destination {address.text!r} is full (send_fail_if_no_space)")
        self.stats.messages_in += 1
        lsn = 0
        if message.persistent:
            keys = [queue.key for queue in targets if queue.key is not None]
            if keys:
                lsn = self.store.add_message(message, keys)
        if policy.archive and address.kind is Kind.TOPIC:
            archived = self.store.archive(address.name, message)
            if message.persistent:  # a receipt promises the archived copy too
                lsn = max(lsn, archived)
        if address.is_queue and policy.send_fail_if_no_space:
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

    def _durable(
        self, client_id: str, name: str, pattern: Address, selector: Selector | None = None
    ) -> tuple[DurableSubscription, int]:
        """The durable subscription, created (and stored, selector included)
        if new, or anew if its topic or selector changed: JMS 1.1 §6.11.1
        makes changing a durable subscriber deleting it and creating another."""
        key = durable_key(client_id, name)
        lsn = 0
        durable = self.durables.get(key)
        text = _text(selector)
        if durable is not None and (durable.pattern != pattern or _text(durable.queue.selector) != text):
            lsn = self._drop_durable(durable)
            durable = None
        if durable is None:
            durable = self._add_durable(key, client_id, name, pattern, selector)
            lsn = self.store.add_subscription(key, pattern.text, text)
        return durable, lsn

    def _add_durable(
        self, key: str, client_id: str, name: str, pattern: Address, selector: Selector | None
    ) -> DurableSubscription:
        resident = self.policies.for_address(pattern).resident_messages
        queue = self._arm(Queue(pattern, store=self.store, key=key, resident=resident))
        queue.selector = selector  # what it keeps, offline too
        durable = self.durables[key] = DurableSubscription(client_id, name, pattern, queue)
        self._trees[pattern.kind].add(pattern.segments, durable)
        return durable

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
        subscriptions: dict[str, tuple[str, str, Address, str | None]],
        queues: dict[str, list[Message]],
        retained: list[Message] = (),  # type: ignore[assignment]
    ) -> None:
        """Rebuild what the store recovered: durable subscriptions (key ->
        client id, name, topic, selector text) and the messages of every
        stored queue, in their order.  Called once, before any client connects."""
        for key, (client_id, name, pattern, text) in subscriptions.items():
            # A stored selector compiled once already; should this version
            # refuse it, keeping everything loses nothing.
            try:
                selector = compile_selector(text) if text else None
            except SelectorError:
                selector = None
            self._add_durable(key, client_id, name, pattern, selector)
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
