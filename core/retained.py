"""Retained messages (MQTT's retain flag): the last one of each topic, with
their count and body bytes for the broker's bounds, indexed by name segment so
a wildcard subscription visits only the branches it can match instead of every
retained topic (a narrow filter must not cost what the whole set costs)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from core.messages import Message
from core.names import ANY_REST, ANY_SEGMENT, Address, Kind
from core.settings import BrokerSettings, BrokerStatistics
from core.storage import MessageStore
from core.tally import UNKNOWN_HOLDER, Holder, Shares


class Keeper(Protocol):
    """What of a producer (a core.clients.Client) :meth:`RetainedMessages.keep` uses."""

    holder: Holder

    def refused_retain(self, reason: str) -> None: ...


class _Node:
    __slots__ = ("children", "message")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.message: Message | None = None


class RetainedMessages:
    """Topic address -> its retained message, and whose share of the bounds
    each takes: the holder (core.tally) that last set it."""

    def __init__(self, settings: BrokerSettings | None = None, stats: BrokerStatistics | None = None) -> None:
        self.settings = settings or BrokerSettings()  # the bounds of refused()
        self.stats = stats or BrokerStatistics()  # what counts what refused() refuses
        self._messages: dict[Address, Message] = {}
        self._holders: dict[Address, Holder] = {}
        self._roots: dict[Kind, _Node] = {}
        self.nbytes = 0  # bodies held, what max_retained_bytes bounds
        self.shares = Shares("retained messages")  # by holder: max_retained_*_per_user

    def __len__(self) -> int:
        return len(self._messages)

    def __contains__(self, address: Address) -> bool:
        return address in self._messages

    def __iter__(self) -> Iterator[Message]:
        return iter(list(self._messages.values()))

    def node_count(self) -> int:
        """Index nodes below the roots: every one leads to a retained message
        (pops prune the rest), so it is 0 once all are gone.  A walk of the
        index: for tests and statistics, not publishes."""
        count, stack = 0, [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            count += 1
            stack.extend(node.children.values())
        return count

    def get(self, address: Address) -> Message | None:
        return self._messages.get(address)

    def refusal(self, message: Message, max_messages: int, max_bytes: int, holder: Holder = UNKNOWN_HOLDER,
                share_messages: int = 0, share_bytes: int = 0) -> str | None:
        """Why keeping ``message`` would pass the bounds (``max_bytes`` 0: no
        byte limit) or ``holder``'s share of them (``share_*``; 0: none), or
        None.  Replacing a kept topic's value with one no larger, or clearing
        it, is never refused by the broker's bounds; by a holder's share only
        when the value was another holder's (it becomes this one's)."""
        previous = self._messages.get(message.address)
        if previous is None and len(self._messages) >= max_messages:
            return f"too many retained messages (limit {max_messages})"
        size = len(message.body or b"")
        before = len(previous.body or b"") if previous is not None else 0
        growth = size - before
        if max_bytes and growth > 0 and self.nbytes + growth > max_bytes:
            return f"retained messages would pass {max_bytes} bytes (max_retained_bytes)"
        if previous is not None and self._holders.get(message.address) == holder:
            items, nbytes = 0, growth  # the holder's own value, replaced
        else:
            items, nbytes = 1, size
        return self.shares.refusal(holder, share_messages, share_bytes, items=items, nbytes=nbytes,
                                   bytes_setting="max_retained_bytes_per_user")

    def refused(self, message: Message, holder: Holder) -> str | None:
        """Why ``message`` may not be kept for ``holder`` under the broker's
        bounds and the holder's share of them (counted if so), or None."""
        if not message.body:
            return None  # clearing is never refused
        s = self.settings
        reason = self.refusal(message, s.max_retained_messages, s.max_retained_bytes, holder,
                              s.max_retained_messages_per_user, s.max_retained_bytes_per_user)
        self.stats.retained_refused += reason is not None
        return reason

    def keep(self, message: Message, store: MessageStore, producer: Keeper | None = None,
             holder: Holder | None = None) -> int:
        """Keep ``message`` as its topic's retained value (an empty body
        clears it [MQTT-3.3.1-10]) within the broker-wide bounds and
        ``holder``'s share (by default ``producer``'s): clients choosing topic
        names must not grow the process (and the store) without bound, nor
        one take every other's room; past them it is not kept, ``producer``
        is told and it is counted.  Kept on disk whatever its QoS: a retained
        value is state, not traffic.  Returns the LSN that makes it durable."""
        address = message.address
        if not message.body:
            if self.pop(address) is None:
                return 0
            return store.retain(address.text, None)
        if holder is None:
            holder = producer.holder if producer is not None else UNKNOWN_HOLDER
        reason = self.refused(message, holder)
        if reason is not None:
            if producer is not None:
                producer.refused_retain(reason)
            return 0
        self.put(message, holder)
        return store.retain(address.text, message.record(), message.qos)

    def put(self, message: Message, holder: Holder = UNKNOWN_HOLDER) -> None:
        """Keep ``message`` as its topic's value, in ``holder``'s share
        (UNKNOWN_HOLDER: restored from the store, which does not say)."""
        address = message.address
        self.pop(address)
        self._messages[address] = message
        size = len(message.body or b"")
        self.nbytes += size
        self._holders[address] = holder
        self.shares.take(holder, size)
        node = self._roots.setdefault(address.kind, _Node())
        for segment in address.segments:
            child = node.children.get(segment)
            if child is None:
                child = node.children[segment] = _Node()
            node = child
        node.message = message

    def pop(self, address: Address) -> Message | None:
        message = self._messages.pop(address, None)
        if message is None:
            return None
        size = len(message.body or b"")
        self.nbytes -= size
        self.shares.give_back(self._holders.pop(address), size)
        path = [self._roots[address.kind]]
        for segment in address.segments:
            path.append(path[-1].children[segment])
        path[-1].message = None
        # Prune empty branches so the index does not grow with churn.
        for depth in range(len(address.segments), 0, -1):
            node = path[depth]
            if node.message is not None or node.children:
                break
            del path[depth - 1].children[address.segments[depth - 1]]
        return message

    def matching(self, pattern: Address, limit: int = 0) -> list[Message]:
        """The retained messages whose topic ``pattern`` matches, in no
        particular order, at most ``limit`` of them (0: all); a root wildcard
        skips ``$`` topics [MQTT-4.7.2-1]."""
        root = self._roots.get(pattern.kind)
        if root is None:
            return []
        if not pattern.is_pattern:
            found = self._messages.get(pattern)
            return [] if found is None else [found]
        out: list[Message] = []
        _collect(root, pattern.segments, 0, out, limit or len(self._messages))
        return out


def _collect(node: _Node, pattern: tuple[str, ...], i: int, out: list[Message], limit: int) -> None:
    if i == len(pattern):
        if node.message is not None:
            out.append(node.message)
        return
    part = pattern[i]
    if part == ANY_REST:  # this level (zero more segments) and everything below
        if i > 0 and node.message is not None:
            out.append(node.message)
        stack = [child for segment, child in node.children.items() if i > 0 or not segment.startswith("$")]
        while stack and len(out) < limit:
            below = stack.pop()
            if below.message is not None:
                out.append(below.message)
            stack.extend(below.children.values())
    elif part == ANY_SEGMENT:
        for segment, child in node.children.items():
            if len(out) >= limit:
                return
            if i > 0 or not segment.startswith("$"):
                _collect(child, pattern, i + 1, out, limit)
    else:
        named = node.children.get(part)
        if named is not None:
            _collect(named, pattern, i + 1, out, limit)
