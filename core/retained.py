"""Retained messages (MQTT's retain flag): the last one of each topic, with
their count and body bytes for the broker's bounds, indexed by name segment so
a wildcard subscription visits only the branches it can match instead of every
retained topic (a narrow filter must not cost what the whole set costs)."""

from __future__ import annotations

from collections.abc import Iterator

from core.messages import Message
from core.names import ANY_REST, ANY_SEGMENT, Address, Kind


class _Node:
    __slots__ = ("children", "message")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.message: Message | None = None


class RetainedMessages:
    """Topic address -> its retained message."""

    def __init__(self) -> None:
        self._messages: dict[Address, Message] = {}
        self._roots: dict[Kind, _Node] = {}
        self.nbytes = 0  # bodies held, what max_retained_bytes bounds

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

    def refusal(self, message: Message, max_messages: int, max_bytes: int) -> str | None:
        """Why keeping ``message`` would pass the bounds (``max_bytes`` 0: no
        byte limit), or None.  Replacing a kept topic's value with one no
        larger, or clearing it, is never refused."""
        previous = self._messages.get(message.address)
        if previous is None and len(self._messages) >= max_messages:
            return f"too many retained messages (limit {max_messages})"
        growth = len(message.body or b"") - (len(previous.body or b"") if previous is not None else 0)
        if max_bytes and growth > 0 and self.nbytes + growth > max_bytes:
            return f"retained messages would pass {max_bytes} bytes (max_retained_bytes)"
        return None

    def put(self, message: Message) -> None:
        address = message.address
        self.pop(address)
        self._messages[address] = message
        self.nbytes += len(message.body or b"")
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
        self.nbytes -= len(message.body or b"")
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
        child = node.children.get(part)
        if child is not None:
            _collect(child, pattern, i + 1, out, limit)
