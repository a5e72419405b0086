"""One connected client's side of the broker: what it publishes (held in
transactions until COMMIT), what it consumes (subscriptions, acks, NACKs),
what it is allowed to do (its principal, checked against the authorization
map), and the temporary destinations and producer holds that die with it."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Protocol

from core.attachments import drop_shared, remove_durable, subscribe_durable, subscribe_shared
from core.authorization import ANONYMOUS_PRINCIPAL, DECISION_CACHE, Authorizer, Principal
from core.destinations import Queue
from core.durables import Durables
from core.errors import (
    CoreError, DuplicateSubscription, InvalidDestination, InvalidRequest, LimitExceeded, NotAuthorized, TransactionExists,
    UnknownSubscription, UnknownTransaction,
)
from core.messages import Message
from core.names import Address, is_private
from core.nolocal import Origin, with_no_local
from core.policies import Policies
from core.ports import Clock, Sink
from core.registry import QueueRegistry
from core.settings import BrokerSettings
from core.shared import SharedGroups
from core.subscriptions import AckMode, Subscription
from core.tally import holder_of
from core.temporaries import Temporaries
from core.transactions import Transaction


class Core(Protocol):
    """What a client uses of the broker (a :class:`core.broker.Broker`, which
    imports this module, not the other way round): its parts and its public
    operations, never its internals."""

    authorizer: Authorizer | None
    secured: bool
    settings: BrokerSettings
    policies: Policies
    clock: Clock
    registry: QueueRegistry
    durables: Durables
    shared: SharedGroups
    temporaries: Temporaries
    commit_keys: dict[str, int]

    def publish(
        self,
        messages: Message | Sequence[Message],
        producer: Any = None,
        acks: Sequence[tuple[str, Message]] = (),
        commit_key: str | None = None,
        retain: bool = False,
        dead_letter: bool = False,
        to: Queue | None = None,
    ) -> int: ...

    def retained_for(self, pattern: Address, limit: int = 0) -> list[Message]: ...

    def held_for_disk(self, client: Any, address: Address) -> bool: ...

    def count_denied(self, operation: str) -> None: ...

    def hold_transaction_bytes(self, size: int) -> None: ...

    def release_transaction_bytes(self, size: int) -> None: ...

    def client_closed(self, client: Any) -> None: ...


class Client:
    """One connected client's view of the broker: its subscriptions, transactions and
    temporary destinations, all released by :meth:`close`.  Slotted: one per connection."""
    __slots__ = ("broker", "sink", "number", "client_id", "principal", "_decisions", "_decided_by", "subscriptions", "transactions",
                 "temporaries", "transaction_bytes", "blocked_on", "last_lsn", "retain_refusal", "held_until", "closed",
                 "origin", "holder")

    def __init__(self, broker: Core, sink: Sink, number: int, client_id: str | None,
                 principal: Principal = ANONYMOUS_PRINCIPAL, source: str | None = None) -> None:
        self.broker = broker
        self.sink = sink
        self.number = number
        self.client_id = client_id
        self.principal = principal
        self.holder = holder_of(principal, source)  # whose share of the pools (shared groups, retained) it takes
        self._decisions: dict[tuple[str, Address], bool] = {}
        self._decided_by: Authorizer | None = None  # the map _decisions came from
        self.subscriptions: dict[Any, Subscription] = {}
        self.transactions: dict[str, Transaction] = {}
        # Temporary names this client used -> its private destinations.
        self.temporaries: dict[Address, Address] = {}
        self.transaction_bytes = 0  # held in its open transactions
        # Congested queues this client's messages went to; while non-empty
        # the client should not produce (its connection stops reading).
        # Each maps to its delivered count when last checked (check_held).
        self.blocked_on: dict[Queue, int] = {}
        self.last_lsn = 0
        # Why the last send's retained value was not kept (max_retained_*), or None: routed all the same.
        self.retain_refusal: str | None = None
        self.held_until = 0.0  # when to check_held next, on the broker clock
        self.closed = False
        self.origin = Origin(client_id)  # what its messages carry (core.nolocal)

    # -- producing ---------------------------------------------------------

    def send(self, message: Message, transaction: str | None = None, retain: bool = False) -> int:
        """Publish, or hold until COMMIT when in a transaction.  Returns the LSN
        a durability promise (a receipt) must wait for.  ``retain``: keep it
        as its topic's retained value too (MQTT); if the broker's bounds do
        not allow that, ``retain_refusal`` says why."""
        message.origin = self.origin
        if message.address.is_temporary:
            message.address = self.temporary(message.address)
        if self.broker.authorizer is not None:
            self.authorize("write", message.address)
        if transaction is None:
            if not retain:
                return self.broker.publish(message, self)
            self.retain_refusal = None
            return self.broker.publish(message, self, retain=True)
        if retain:
            raise InvalidRequest("a retained message cannot wait in a transaction")
        tx = self._transaction(transaction)
        self._grow(tx)
        self._hold_bytes(tx, message)
        tx.sends.append((message.address, message))
        return 0

    def authorize(self, operation: str, address: Address) -> None:
        """Refuse (:class:`NotAuthorized`) what the authorization map does not
        grant this client.  Reading from or writing to a queue that does not
        exist yet creates it, which takes ``admin`` too, as in ActiveMQ.
        Temporary destinations are their owner's (see core/temporaries.py)."""
        authorizer = self.broker.authorizer
        if authorizer is None or address.is_temporary:
            return
        if authorizer is not self._decided_by:  # a reloaded map: decide afresh from here on
            self._decisions, self._decided_by = {}, authorizer
        key = (operation, address)
        allowed = self._decisions.get(key)
        if allowed is None:
            allowed = authorizer.allows(self.principal, operation, address)
            if len(self._decisions) >= DECISION_CACHE:
                self._decisions.clear()
            self._decisions[key] = allowed
        if not allowed:
            self.broker.count_denied(operation)
            raise NotAuthorized(f"user {self.principal.name!r} may not {operation} {address.text!r}")
        if address.is_queue and address not in self.broker.registry.queues and operation != "admin":
            self.authorize("admin", address)

    def temporary(self, address: Address) -> Address:
        """Where this client's use of a temporary destination goes: a private name (someone's
        reply-to) as it is; a name of its own to its private destination, made on first use."""
        if is_private(address):
            return address
        private = self.temporaries.get(address)
        return private if private is not None else self.broker.temporaries.claim(address, self)

    def stored_send(self, transaction: str) -> Address | None:
        """Where the first persistent send held in ``transaction`` goes, if it
        has one: a COMMIT that stores it waits out a disk alarm too."""
        tx = self.transactions.get(transaction)
        for address, message in tx.sends if tx is not None else ():
            if message.persistent:
                return address
        return None

    def held_for_disk(self, address: Address) -> bool:
        """Before a persistent message to ``address`` is taken: while the disk
        alarm is on, refuse it (:class:`LimitExceeded`, with
        send_fail_if_no_space) or hold this producer until free space comes
        back (True: the caller keeps the message, stops reading, and offers it
        again once :meth:`Sink.unblocked`).  Nothing is stored meanwhile."""
        return self.broker.held_for_disk(self, address)

    def disk_cleared(self) -> None:
        """The disk alarm is off: go on, unless a congested queue still holds us."""
        if not self.closed and not self.blocked_on:
            self.sink.unblocked()

    def hold(self, queues: list[Queue]) -> bool:
        """Flow control (core.broker.Producer): our messages went to these
        congested queues; stop producing until they drain.  Whether that
        holds us now (the broker counts it)."""
        if not self.blocked_on:
            self.held_until = self.broker.clock.monotonic() + self.broker.settings.slow_consumer_s
        for queue in queues:
            if queue not in self.blocked_on and queue.wait(self):
                self.blocked_on[queue] = queue.stats.delivered
        return bool(self.blocked_on)

    def refused_retain(self, reason: str) -> None:
        """core.broker.Producer: the message went out, its retained value was not kept."""
        self.retain_refusal = reason

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
        start: bool = True,
        no_local: bool = False,
        shared: str | None = None,
    ) -> Subscription:
        """Start consuming.  With ``durable`` = (client id, subscription name)
        a topic subscription outlives the connection.  The LSN that makes a
        new durable subscription durable is left in ``last_lsn``.

        ``no_local``: a topic subscription that never gets what a client with
        this client's id (this one, or without an id, this connection)
        publishes (core.nolocal).  ``shared``: join the shared subscription
        group of that name on ``address`` (core.shared): each message goes
        to one of its members; with ``durable`` the membership outlives the
        connection and the group is durable.  Not both [MQTT-3.8.3-4].

        With ``start=False`` the subscription is in place but nothing is
        delivered to it until :meth:`start`: a protocol that confirms the
        subscription (STOMP RECEIPT, MQTT SUBACK) puts the confirmation on the
        wire first, then lets the backlog flow."""
        self.last_lsn = 0
        if token in self.subscriptions:
            raise DuplicateSubscription(f"subscription {token!r} already exists on this connection")
        if len(self.subscriptions) >= self.broker.settings.max_subscriptions_per_client:
            raise LimitExceeded(f"too many subscriptions (limit {self.broker.settings.max_subscriptions_per_client})")
        if address.is_queue and (address.is_pattern or no_local or shared is not None):
            raise InvalidDestination("wildcards, No Local and shared subscriptions are for topics only")
        if no_local and shared is not None:
            raise InvalidRequest("a shared subscription cannot be No Local")  # [MQTT-3.8.3-4]
        if self.broker.authorizer is not None:
            self.authorize("read", address)
        if address.is_temporary:
            if address.is_pattern:
                # A wildcard would reach into other connections' private replies.
                raise InvalidDestination("wildcards are not allowed on temporary destinations")
            address = self.temporary(address)
            self.broker.temporaries.check_owner(address, self)  # another's private name: only its owner reads it
        policy = self.broker.policies.for_address(address)
        window = prefetch if prefetch and prefetch > 0 else policy.default_prefetch
        if shared is not None:
            subscription = subscribe_shared(self, token, address, ack_mode, window, shared, durable, selector)
        elif durable is not None:
            origin = self.origin if no_local else None
            subscription = subscribe_durable(self, token, address, ack_mode, window, durable, selector, origin)
        else:
            if address.is_queue:
                queue = self.broker.registry.get(address)
                subscription = Subscription(token, address, queue, self.sink, ack_mode, window, private=False, owner=self)
                subscription.selector = selector  # consumers of one queue may each filter
                subscription.priority = priority
                subscription.exclusive = exclusive
            else:
                if no_local:
                    selector = with_no_local(selector, self.origin)
                queue = self.broker.registry.topic_queue(address, self, selector)  # filtered as the topic fans out
                subscription = Subscription(token, address, queue, self.sink, ack_mode, window, private=True, owner=self)
                self.broker.registry.attach(address, subscription)
            self.subscriptions[token] = subscription
            queue.add_consumer(subscription)
        if start:
            self.start(subscription)
        return subscription

    def start(self, subscription: Subscription, *, retained: bool = False) -> None:
        """Deliver what waits for a subscription made with ``start=False``;
        ``retained``: then the retained values of the topics it matches
        (MQTT), as many as its queue can hold."""
        if subscription.shared is not None and subscription.shared.reserved:  # its own first [MQTT-4.8.2-4]
            subscription.queue.hand(subscription, self.broker.shared.take_reserved(subscription.shared))
        subscription.queue.dispatch()
        if retained and subscription.shared is None:  # a group gets none on joining (MQTT 5 §4.8.2)
            queue = subscription.queue
            values = self.broker.retained_for(subscription.address, queue.limit)
            if queue.selector is not None:  # as the topic's fan-out would (No Local, a selector)
                values = [message for message in values if queue.selector.matches(message)]
            self.broker.publish(values, to=queue)

    def unsubscribe(self, token: Any, *, remove_durable: bool = False) -> int:
        """Stop consuming.  A durable subscription or persistent shared membership stays (and
        keeps collecting) unless ``remove_durable``; returns the LSN of its removal."""
        subscription = self.subscriptions.pop(token, None)
        if subscription is None:
            raise UnknownSubscription(f"no subscription {token!r} on this connection")
        lsn = self._detach(subscription, remove_durable)
        if remove_durable and subscription.durable is not None:
            return self.broker.durables.drop(subscription.durable)
        return lsn

    def remove_durable(self, client_id: str, name: str) -> int:
        """Remove the offline durable subscription ``name`` of ``client_id``."""
        return remove_durable(self, client_id, name)

    def drop_shared(self, client_id: str, name: str) -> int:
        """End the offline persistent shared membership ``name`` of
        ``client_id`` (core.shared); its group goes if it was the last."""
        return drop_shared(self, client_id, name)

    def _detach(self, subscription: Subscription, remove: bool = False, reserve: Collection[str] = ()) -> int:
        queue = subscription.queue
        if subscription.durable is not None:
            subscription.durable.active = None
        queue.remove_consumer(subscription)
        unacked = subscription.take_all()
        if subscription.shared is not None and reserve:
            unacked = self.broker.shared.set_aside(subscription.shared, unacked, reserve)
        if subscription.private:
            self.broker.registry.detach(subscription.address, subscription)
            queue.relieve()  # nobody will drain it now; free its producers
        elif unacked:
            queue.requeue(unacked)  # to the queue's other consumers (a shared group's other members)
        if subscription.shared is not None:
            return self.broker.shared.leave(subscription.shared, remove=remove)
        return 0

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
        """Route a transaction's sends and settle its acks as one store record,
        by the rules of a SEND (:meth:`Broker.publish`).  A refused COMMIT
        aborts the transaction: nothing of it is routed or acked."""
        tx = self._transaction(transaction)
        del self.transactions[transaction]
        self._release_bytes(tx)
        acks = [
            (subscription.queue.key, message)
            for subscription, messages in tx.acks
            if subscription.queue.key is not None
            for message in messages
            if message.location >= 0
        ]
        try:
            lsn = self.broker.publish([message for _, message in tx.sends], self, acks=acks, commit_key=key)
        except CoreError:
            self._roll_back(tx)
            raise
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
        self._release_bytes(tx)
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

    def _hold_bytes(self, tx: Transaction, message: Message) -> None:
        """Count a transactional send's bytes against this connection's and the
        broker's limits, so open transactions cannot take the broker's memory."""
        size = len(message.body or b"") + sum(len(k) + len(v) for k, v in (message.headers or {}).items())
        mine = self.broker.settings.max_transaction_bytes_per_client
        if mine and self.transaction_bytes + size > mine:
            raise LimitExceeded(f"open transactions on this connection hold too many bytes (limit {mine})")
        self.broker.hold_transaction_bytes(size)  # refused past the broker-wide limit
        tx.bytes += size
        self.transaction_bytes += size

    def _release_bytes(self, tx: Transaction) -> None:
        self.transaction_bytes -= tx.bytes
        self.broker.release_transaction_bytes(tx.bytes)
        tx.bytes = 0

    # -- leaving -----------------------------------------------------------

    def close(self, reserve: Collection[str] = ()) -> None:
        """Abort open transactions, return unacked messages to their queues (but ``reserve``: ids of a
        shared group's that are this client's alone, core.shared), drop its temporaries.  Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.broker.client_closed(self)
        # Detach first, so rolled-back acks go to the other consumers, not to us.
        subscriptions, self.subscriptions = self.subscriptions, {}
        for subscription in subscriptions.values():
            self._detach(subscription, reserve=reserve)
        transactions, self.transactions = self.transactions, {}
        for tx in transactions.values():
            self._release_bytes(tx)
            self._roll_back(tx)
        self._decisions.clear()
        for private in self.temporaries.values():
            self.broker.temporaries.release(private)
        self.temporaries.clear()
        for queue in self.blocked_on:
            if queue.waiters is not None and self in queue.waiters:
                queue.waiters.remove(self)
        self.blocked_on.clear()
