"""Retrying dead letters: an operator moves messages from a dead-letter
queue back to the destination each came from (the ``originalDestination``
header the broker set when it dead-lettered it), as ActiveMQ's console's
"retry" does.  Each move is one store record, the copy's add with the dead
letter's ack, so a crash leaves the message in one place or the other."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from core import names
from core.destinations import Queue
from core.errors import LimitExceeded
from core.messages import Message

# The headers the broker adds when it dead-letters a message (broker._dead_letter):
# a retried message arrives as it was first sent, without them.
DEAD_LETTER_HEADERS = ("originalDestination", "originalMessageId", "dlqDeliveryFailureCause")


@dataclasses.dataclass(frozen=True)
class Retried:
    """What a retry did: ``moved`` messages went back, ``skipped`` had no
    original queue (sent to the DLQ directly, or a topic subscriber's) and stay, ``reason`` says why the retry
    stopped early (a full destination), or is empty."""

    moved: int
    skipped: int
    reason: str = ""


def retry(broker: Any, queue: Queue, message_ids: Collection[str] | None = None) -> Retried:
    """Move the pending messages of ``queue`` (those in ``message_ids``, or
    all) back to their original destinations, in delivery order.  Those with
    no original destination, and the rest once a destination refuses one
    (send_fail_if_no_space), stay where they were, in their order."""
    waiting = queue.pending.clear()
    kept: list[Message] = []
    moved = skipped = 0
    reason = ""
    for message in waiting:
        if reason or (message_ids is not None and message.id not in message_ids):
            kept.append(message)
            continue
        copy = _original(broker, queue, message)
        if copy is None:
            skipped += 1
            kept.append(message)
            continue
        stored = message.persistent and message.location >= 0 and queue.key is not None
        try:
            broker.publish(copy, None, [(queue.key, message)] if stored else ())
        except LimitExceeded as exc:
            reason = exc.reason
            kept.append(message)
            continue
        moved += 1
        queue.stats.dequeued += 1
    for message in kept:
        queue.pending.push(message)
    if queue.waiters is not None:
        queue.relieve()
    queue.dispatch()  # what stays may have consumers waiting
    return Retried(moved, skipped, reason)


def _original(broker: Any, queue: Queue, message: Message) -> Message | None:
    """A fresh copy of ``message`` bound for where it came from, or None
    when it says nowhere valid (a message sent to the DLQ directly)."""
    headers, body = message.headers, message.body
    if body is None and message.location >= 0:  # a stub: read a copy, leave the queue's alone
        loaded = message.stub()
        if queue.store is None or not loaded.load(queue.store):
            return None
        headers, body = loaded.headers, loaded.body
    headers = dict(headers or {})
    target = names.parse(headers.get("originalDestination", ""))
    # A topic's dead letter failed at one subscriber; publishing it to the
    # topic again would reach every subscriber, so it is not retried.
    if isinstance(target, str) or target.is_pattern or not target.is_queue:
        return None
    for name in DEAD_LETTER_HEADERS:
        headers.pop(name, None)
    # A new id (the store knows the dead letter by its own until the move
    # commits) and a fresh redelivery count: it gets max_redeliveries again.
    copy: Message = broker.message(target, headers, body or b"", message.persistent, message.priority, message.expires)
    copy.timestamp, copy.qos = message.timestamp, message.qos
    return copy
