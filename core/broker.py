"""The broker facade and its one door: every message that enters a
destination comes in through :meth:`Broker.publish`, which decides its
targets, flow control, storage and counters by one set of rules."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Protocol

from core import names
from core.authorization import ANONYMOUS_PRINCIPAL, Authorizer, Principal
from core.clients import Client
from core.destinations import Queue
from core.durables import Durables
from core.errors import InvalidDestination, LimitExceeded
from core.messages import DEFAULT_PRIORITY, Message, store_transaction
from core.names import Address, Kind
from core.policies import Policies
from core.ports import Clock, Entropy, Sink
from core.registry import QueueRegistry
from core.retained import RetainedMessages
from core.selectors import SelectorError, compile_selector
from core.settings import BrokerSettings, BrokerStatistics
from core.shared import SharedGroups
from core.storage import MessageStore, NoStore
from core.tally import Holder
from core.temporaries import Temporaries

__all__ = ["Broker", "BrokerSettings", "BrokerStatistics", "Client", "Producer"]


class Producer(Protocol):
    """Who a message entered for (a :class:`Client`): the one flow control
    holds while a queue its messages went to is congested."""

    def hold(self, queues: list[Queue]) -> bool:
        """Stop producing until ``queues`` drain; whether that holds it now."""
        ...

    def refused_retain(self, reason: str) -> None:
        """Its message was routed but not kept as the retained one."""
        ...

    holder: Holder  # whose share of the broker's pools what it makes takes (core.tally)


def fixed_entropy(size: int, /) -> bytes:
    """The Entropy a broker has when given none: zeros, the same every run.
    Enough for a test; the app passes the OS's (gateway/app.py), since a
    restarted broker's message ids and temporary names must not repeat the
    last run's."""
    return bytes(size)


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
        entropy: Entropy = fixed_entropy,
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
        self.stats = BrokerStatistics()
        self.registry = QueueRegistry(self.settings, self.policies, clock, self.store, self.stats, self._dead_letter)
        self.queues = self.registry.queues  # by address; temporary ones too
        self.durables = Durables(self.registry, self.store, self.settings)
        self.shared = SharedGroups(self.registry, self.store, self.settings)  # shared subscription groups
        # The last retained message of each topic (MQTT's retain flag), by name.
        self.retained = RetainedMessages(self.settings, self.stats)
        self.temporaries = Temporaries(self.registry, entropy(3).hex())
        self.transaction_bytes = 0  # held in every client's open transactions
        # Message ids stay unique across restarts without coordination.
        # No colon in ids: STOMP 1.1+ would have to escape it in every MESSAGE.
        self._id_prefix = f"ID-{node or entropy(4).hex()}-"
        self._seq = itertools.count(1)
        self._client_seq = itertools.count(1)
        # Idempotency keys of committed transactions, oldest first, each with
        # the LSN that made its commit durable (0 once restored).
        self.commit_keys: dict[str, int] = {}
        # The disk alarm (free space below the store's minimum, told by the
        # app): persistent producers wait in ``disk_waiters``, in order.
        self.disk_alarm = False
        self.disk_waiters: dict[Client, None] = {}

    @property
    def durable_lsn(self) -> int:
        return self.store.durable_lsn

    # -- clients -------------------------------------------------------------

    def open_client(
        self, sink: Sink, *, client_id: str | None = None, principal: Principal = ANONYMOUS_PRINCIPAL,
        source: str | None = None,  # the peer's host: an anonymous client's share of the pools (core.tally)
    ) -> Client:
        self.stats.clients += 1
        return Client(self, sink, next(self._client_seq), client_id, principal, source)

    def client_closed(self, client: Client) -> None:
        """``client`` left (:meth:`Client.close`): it waits for nothing more."""
        self.stats.clients -= 1
        self.disk_waiters.pop(client, None)

    def count_denied(self, operation: str) -> None:
        """The authorization map refused ``operation`` to a client."""
        denied = self.stats.denied
        denied[operation] = denied.get(operation, 0) + 1

    def hold_transaction_bytes(self, size: int) -> None:
        """Count ``size`` more bytes held in open transactions, refusing
        (:class:`LimitExceeded`) past max_transaction_bytes_total."""
        total = self.settings.max_transaction_bytes_total
        if total and self.transaction_bytes + size > total:
            raise LimitExceeded(f"open transactions on the broker hold too many bytes (limit {total})")
        self.transaction_bytes += size

    def release_transaction_bytes(self, size: int) -> None:
        self.transaction_bytes -= size

    def replace_policies(self, entries: list[dict[str, Any]]) -> None:
        """Per-destination policies from a reloaded configuration (see QueueRegistry.apply_policies)."""
        self.policies = self.registry.apply_policies(entries)

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
                client.disk_cleared()
        return True

    def held_for_disk(self, client: Client, address: Address) -> bool:
        """Before a persistent message to ``address`` is taken: while the disk
        alarm is on, refuse it (:class:`LimitExceeded`, with
        send_fail_if_no_space) or hold ``client`` until free space comes back
        (True).  Nothing is stored meanwhile."""
        if not self.disk_alarm:
            return False
        if self.policies.for_address(address).send_fail_if_no_space:
            raise LimitExceeded("the broker's disk is nearly full: persistent messages are refused (send_fail_if_no_space)")
        if client not in self.disk_waiters:
            self.disk_waiters[client] = None
            self.stats.producer_holds += 1
        return True

    def message(
        self,
        address: Address,
        headers: dict[str, str],
        body: bytes,
        persistent: bool = False,
        priority: int = DEFAULT_PRIORITY,
        expires: int = 0,
    ) -> Message:
        """A new message with a fresh id and the broker's timestamp."""
        if address.is_pattern:
            raise InvalidDestination(f"cannot send to a wildcard destination {address.text!r}")
        return Message(
            self._id_prefix + str(next(self._seq)), address, headers, body, persistent, priority, expires,
            self.clock.wall_ms(),
        )

    # -- the door ------------------------------------------------------------

    def publish(
        self,
        messages: Message | Sequence[Message],
        producer: Producer | None = None,
        # Not keyword-only, though meant as keywords: CPython fills missing
        # keyword-only arguments from a dict, a cost on every SEND.
        acks: Sequence[tuple[str, Message]] = (),
        commit_key: str | None = None,
        retain: bool = False,
        dead_letter: bool = False,
        to: Queue | None = None,
        holder: Holder | None = None,
    ) -> int:
        """The one way into a destination: a SEND or PUBLISH (one message), a
        COMMIT (its messages, with its acks and idempotency key), an
        administrator's send, a dead letter or an expired message moved to
        the dead-letter queue, a retained value.  Returns the LSN that makes
        it durable (what a receipt waits for).  The rules, for all of them:

        - targets: a message goes to its queue (created if new) or to every
          topic subscription whose selector takes it; ``to``: into that one
          queue only, unstored and uncounted (a new subscription's copies of
          kept retained values, which their own store record keeps);
        - flow control: a queue that is full, or that these messages would
          fill, refuses them all (:class:`LimitExceeded`) under
          send_fail_if_no_space; otherwise they go in and ``producer`` is held
          until it drains.  A ``dead_letter`` move is never refused nor holds
          anyone: moving a message must not block;
        - storage: persistent messages are stored where a target keeps them,
          a topic's messages archived where its policy says, all in one record
          with ``acks`` and ``commit_key`` (a dead letter's ack of the
          original makes the move atomic); ``retain``: the message is also
          kept (an empty body clears) as its topic's retained value
          [MQTT-3.3.1-5], or, past max_retained_* or the share of them of
          ``holder`` (by default ``producer``'s), not kept (still routed:
          ``producer`` is told and it is counted);
        - counters: each message counts as in (``messages_in``), a dead letter
          as dead-lettered instead.

        One message without acks takes a shorter path (no bookkeeping for
        many): every SEND and PUBLISH comes this way, and the general one cost
        about 4% of the broker's CPU per message."""
        if messages.__class__ is not Message or acks or commit_key is not None or to is not None:
            return self._enter_all(messages, producer, acks, commit_key, retain, dead_letter, to, holder)
        # The fast path: _enter_all's rules, for one message.
        message: Message = messages
        address = message.address
        policies = self.policies
        policy = policies.base if policies.uniform else policies.for_address(address)
        targets = self.registry.targets_for(message)
        refuses = policy.send_fail_if_no_space and address.is_queue and not dead_letter
        if refuses and targets:
            _refuse_if_full(targets[0], 1)
        lsn = 0
        record = None  # built once, for the store and the archive alike
        if message.persistent:
            keys = [queue.key for queue in targets if queue.key is not None]
            if keys:
                record = message.record()
                lsn, message.location = self.store.add_message(record, keys)
        if policy.archive and address.kind is Kind.TOPIC:
            archived = self.store.archive_message(address.name, message.archive_record(record))
            if message.persistent:  # a receipt promises the archived copy too
                lsn = max(lsn, archived)
        if dead_letter:
            self.stats.dead_lettered += 1
        else:
            self.stats.messages_in += 1
        congested = False
        for queue in targets:  # _put, inline: a call less per message
            queue.put(message)
            if queue.waiters is not None:
                congested = True
        # A full queue under send_fail_if_no_space refuses the next SEND instead of holding this one.
        if congested and producer is not None and not refuses and not dead_letter:
            if producer.hold([queue for queue in targets if queue.waiters is not None]):
                self.stats.producer_holds += 1
        if retain:
            lsn = max(lsn, self.retained.keep(message, self.store, producer, holder))
        return lsn

    def _enter_all(
        self,
        messages: Message | Sequence[Message],
        producer: Producer | None,
        acks: Sequence[tuple[str, Message]],
        commit_key: str | None,
        retain: bool,
        dead_letter: bool,
        to: Queue | None,
        holder: Holder | None = None,
    ) -> int:
        """:meth:`publish` for any number of messages, all or none."""
        if isinstance(messages, Message):
            messages = (messages,)
        if to is not None:
            for message in messages:
                to.put(message)
            return 0
        lsn = self._enter_messages(messages, producer, acks, commit_key, dead_letter)
        for message in messages if retain else ():
            lsn = max(lsn, self.retained.keep(message, self.store, producer, holder))
        return lsn

    def _enter_messages(
        self,
        messages: Sequence[Message],
        producer: Producer | None,
        acks: Sequence[tuple[str, Message]],
        commit_key: str | None,
        dead_letter: bool,
    ) -> int:
        if len(messages) > 1:  # create no queue unless all of them can be
            registry = self.registry
            missing = {m.address for m in messages if m.address.kind is Kind.QUEUE and m.address not in registry.queues}
            if registry.destination_count() + len(missing) > self.settings.max_destinations:
                raise LimitExceeded(f"too many destinations (limit {self.settings.max_destinations})")
        routed = []
        adds = []
        archived = []
        adding: dict[Queue, int] | None = None  # queues that refuse rather than hold: how many each gets
        for message in messages:
            address = message.address
            policy = self.policies.for_address(address)
            targets = self.registry.targets_for(message)
            refuses = policy.send_fail_if_no_space and address.is_queue and not dead_letter
            routed.append((message, targets, refuses))
            if refuses and targets:
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
                _refuse_if_full(queue, count)
        lsn = 0
        if adds or acks or archived or commit_key is not None:
            lsn = store_transaction(self.store, adds, acks, archived=archived, commit_key=commit_key)
        if commit_key is not None:
            self._remember_commit(commit_key, lsn)
        congested: dict[Queue, None] = {}
        for message, targets, refuses in routed:
            if dead_letter:
                self.stats.dead_lettered += 1
            else:
                self.stats.messages_in += 1
            # A full queue under send_fail_if_no_space refuses the next SEND instead of holding this one.
            if _put(message, targets) and producer is not None and not refuses and not dead_letter:
                congested.update((q, None) for q in targets if q.waiters is not None)
        if congested and producer is not None and producer.hold(list(congested)):
            self.stats.producer_holds += 1
        return lsn

    def _dead_letter(self, queue: Queue, message: Message, reason: str) -> None:
        """Move a message that keeps failing, or expired, to the dead-letter
        queue, saying where it came from and why: through the door, as one
        store record with the original's ack (a queue's dead-letter routing,
        set by the registry)."""
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
        # Atomically: in the DLQ and out of its queue, or neither.
        stored = message.persistent and message.location >= 0 and queue.key is not None
        self.publish(copy, acks=[(queue.key, message)] if stored else (), dead_letter=True)  # type: ignore[list-item]
        queue.stats.discarded += 1

    def retained_for(self, pattern: Address, limit: int = 0) -> list[Message]:
        """Retained messages a new subscription to ``pattern`` gets, flagged:
        at most ``limit`` (0: all), what its queue can hold (more would be
        copied only to be dropped, on the event loop, per SUBSCRIBE)."""
        return [message.retained_copy() for message in self.retained.matching(pattern, limit)]

    def _remember_commit(self, key: str, lsn: int) -> None:
        keys = self.commit_keys
        keys[key] = lsn
        while len(keys) > self.settings.commit_keys:
            oldest = next(iter(keys))
            del keys[oldest]
            self.store.forget_commit_key(oldest)

    # -- destinations --------------------------------------------------------

    def queue(self, address: Address) -> Queue | None:
        return self.queues.get(address)

    def all_queues(self) -> list[Queue]:
        """Every queue that holds messages: each destination's, each durable
        subscription's and each shared group's (not topic subscribers' own buffers)."""
        return [*self.queues.values(), *(d.queue for d in self.durables.values()), *(g.queue for g in self.shared.values())]

    def remove_queue(self, address: Address, *, force: bool = False) -> int:
        """Delete a queue nobody consumes; one that still holds messages only
        with ``force``, and they go with it, in the store too.  Returns how
        many went."""
        return self.registry.remove(address, force=force)

    def remove_durable(self, key: str) -> int:
        """An administrator's removal of an offline durable subscription,
        whoever owns it; returns the LSN of the removal."""
        return self.durables.remove(key)

    def sweep_expired(self) -> int:
        """Remove expired messages from every queue; returns how many."""
        return sum(queue.sweep() for queue in self.all_queues())

    def next_redelivery_ms(self) -> int | None:
        """When the earliest held redelivery is due (epoch ms), if any."""
        return self.registry.next_redelivery_ms()

    def release_redeliveries(self, now_ms: int) -> int:
        """Put back every held redelivery that is due; returns how many."""
        return self.registry.release_redeliveries(now_ms)

    # -- recovery ------------------------------------------------------------

    def restore_commit_keys(self, keys: list[str]) -> None:
        """Idempotency keys remembered from before a restart, oldest first."""
        for key in keys[-self.settings.commit_keys :]:
            self.commit_keys[key] = 0

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
            self.durables.restore(key, client_id, name, pattern, selector, owner)
        for key, messages in queues.items():
            durable = self.durables.get(key)
            if durable is not None:
                target = durable.queue
            else:
                address = messages[0].address if messages else None
                if address is None or not address.is_queue or address.text != key:
                    continue  # messages of a subscription that no longer exists
                target = self.registry.get(address)
            target.restore(messages)
        for message in retained:  # all of them, even past a lowered limit: nothing kept is lost
            self.retained.put(message)

    def statistics(self) -> dict[str, Any]:
        return {
            "clients": self.stats.clients,
            "messages_in": self.stats.messages_in,
            "messages_discarded": self.stats.messages_discarded,
            "producer_holds": self.stats.producer_holds,
            "dead_lettered": self.stats.dead_lettered,
            "queues": {q.address.text: (q.depth, len(q.consumers)) for q in self.queues.values()},
            "durable_subscriptions": {d.key: (d.queue.depth, d.active is not None) for d in self.durables.values()},
            "shared_subscriptions": {g.key: (g.queue.depth, len(g.queue.consumers)) for g in self.shared.values()},
        }


def _refuse_if_full(queue: Queue, count: int) -> None:
    """Under send_fail_if_no_space: refuse (:class:`LimitExceeded`)
    ``count`` more messages for a queue that is full or that they would fill."""
    if queue.waiters is not None or (queue.high_water and queue.depth + count > queue.high_water):
        raise LimitExceeded(f"destination {queue.address.text!r} is full (send_fail_if_no_space)")


def _put(message: Message, targets: list[Queue]) -> bool:
    """Put ``message`` in each target; whether any of them is congested."""
    congested = False
    for queue in targets:
        queue.put(message)
        if queue.waiters is not None:
            congested = True
    return congested
