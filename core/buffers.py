"""Messages waiting in a queue: by priority (0-9), FIFO within a priority."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from core.messages import MAX_PRIORITY, Message


class PriorityBuffer:
    """Messages by priority (0-9), FIFO within a priority.

    ``pop`` takes the oldest message of the highest priority present.
    """

    __slots__ = ("_levels", "length", "_top")

    def __init__(self) -> None:
        self._levels: list[deque[Message]] = [deque() for _ in range(MAX_PRIORITY + 1)]
        # How many it holds: len() and bool() run Python code, so the hot
        # path reads this instead.
        self.length = 0
        self._top = -1  # highest non-empty level, -1 when empty

    def __len__(self) -> int:
        return self.length

    def __bool__(self) -> bool:
        return self.length > 0

    def __iter__(self) -> Iterator[Message]:
        """In delivery order, without removing anything."""
        for level in reversed(self._levels):
            yield from level

    def push(self, message: Message) -> None:
        p = message.priority
        self._levels[p].append(message)
        self.length += 1
        if p > self._top:
            self._top = p

    def push_front(self, message: Message) -> None:
        p = message.priority
        self._levels[p].appendleft(message)
        self.length += 1
        if p > self._top:
            self._top = p

    def pop(self) -> Message:
        level = self._levels[self._top]
        message = level.popleft()
        self.length -= 1
        if not level:
            self._settle()
        return message

    def lowest_priority(self) -> int:
        for p, level in enumerate(self._levels):
            if level:
                return p
        return MAX_PRIORITY + 1

    def pop_lowest(self) -> Message:
        """The oldest message of the lowest priority: the one to evict first."""
        for level in self._levels:
            if level:
                message = level.popleft()
                self.length -= 1
                if not level:
                    self._settle()
                return message
        raise IndexError("pop from an empty PriorityBuffer")

    def clear(self) -> list[Message]:
        drained = list(self)
        for level in self._levels:
            level.clear()
        self.length = 0
        self._top = -1
        return drained

    def _settle(self) -> None:
        top = self._top
        while top >= 0 and not self._levels[top]:
            top -= 1
        self._top = top
