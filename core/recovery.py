"""From what the store recovered to the broker's state, and back at a clean
stop: the one place where stored records become queues, durable
subscriptions and retained messages (``core.storage`` has the records)."""

from __future__ import annotations

from collections.abc import Iterable

from core import names
from core.broker import Broker
from core.destinations import Queue
from core.durables import parse_durable_key
from core.messages import Message
from core.selectors import SelectorError, compile_selector
from core.shared import GROUP_PREFIX, MEMBER_PREFIX, RESERVED_NOTES, split_key
from core.storage import Recovered, StoredMessage, StoredSubscription


def restore(broker: Broker, recovered: Recovered) -> int:
    """Rebuild ``broker`` from ``recovered``, before any client connects;
    returns how many records were unusable and skipped.

    After a crash nobody knows which stored messages were on their way to a
    consumer, so every one comes back marked redelivered (JMS allows a false
    "redelivered", never a false "not redelivered").
    """
    skipped = 0
    subscriptions: dict[str, tuple[str, str, names.Address, str | None, str | None]] = {}
    shared = []
    for subscription in recovered.subscriptions:
        if subscription.key.startswith((GROUP_PREFIX, MEMBER_PREFIX)):
            shared.append(subscription)
            continue
        named = parse_durable_key(subscription.key)
        address = names.parse(subscription.pattern)
        if named is None or isinstance(address, str):
            skipped += 1
            continue
        subscriptions[subscription.key] = (named[0], named[1], address, subscription.selector, subscription.owner)
    at_least = 0 if recovered.clean else 1
    queues: dict[str, list[Message]] = {}
    for key, records in recovered.queues.items():
        messages = []
        for record in records:
            message = _message(record, max(record.delivery_count, at_least))
            if message is None:
                skipped += 1
                continue
            messages.append(message)
        queues[key] = messages
    retained = []
    for kept in recovered.retained:
        message = _message(kept.message, 0)
        if message is not None:
            message.qos = kept.qos
            retained.append(message)
    skipped += _restore_shared(broker, shared, queues, recovered.kv.get(RESERVED_NOTES, {}))  # takes its groups' messages out of ``queues``
    broker.restore(subscriptions, queues, retained)
    broker.restore_commit_keys(recovered.commit_keys)
    return skipped


def _restore_shared(
    broker: Broker, records: list[StoredSubscription], queues: dict[str, list[Message]], reserved: dict[str, bytes]
) -> int:
    """Durable shared subscription groups, their messages, then their
    persistent memberships (a group whose last membership went is dropped)
    and what is reserved for them; returns how many records were unusable."""
    skipped = 0
    groups = broker.shared
    for record in records:
        named = split_key(record.key, GROUP_PREFIX)
        pattern = names.parse(record.pattern)
        if named is None or isinstance(pattern, str):
            continue  # a membership, or unusable (counted with the memberships' below)
        try:
            selector = compile_selector(record.selector) if record.selector else None
        except SelectorError:  # compiled once already: keep everything rather than lose anything
            selector = None
        group = groups.restore_group(record.key, named[0], pattern, selector, record.owner)
        group.queue.restore(queues.pop(record.key, []))
    for record in records:
        if split_key(record.key, GROUP_PREFIX) is not None and record.key in groups:
            continue
        member = split_key(record.key, MEMBER_PREFIX)
        if member is None or not groups.restore_member(record.key, member[0], member[1], record.pattern, record.owner):
            skipped += 1
    groups.settle_restored()
    groups.restore_reserved(reserved)
    return skipped


def _message(record: StoredMessage, redeliveries: int) -> Message | None:
    address = names.parse(record.destination)
    if isinstance(address, str):
        return None
    return Message(
        record.id, address, record.headers, record.body, persistent=True, priority=record.priority,
        expires=record.expires, timestamp=record.timestamp, redeliveries=redeliveries, location=record.location,
    )


def delivered(queues: Iterable[Queue]) -> list[tuple[str, int]]:
    """At a clean stop: ``(message id, deliveries)`` of the stored messages
    delivered in this run, for the store to note (it keeps no count per
    delivery; that would cost a record per message)."""
    out = []
    for queue in queues:
        for message in queue.pending:
            # Only those delivered in this run: they were loaded to go out,
            # so they have a body.  (A stub marked redelivered by a crash
            # recovery and never sent since is not worth a record each;
            # there may be millions.)
            if message.redeliveries and message.location >= 0 and message.body is not None:
                out.append((message.id, message.redeliveries))
    return out
