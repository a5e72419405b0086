"""Counting things by who holds them (durable subscriptions by owner, say),
for limits per user: a key is kept only while its count is above zero, so the
map is never larger than what it counts, however many owners come and go."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Tally(Generic[K]):
    """How many each key holds."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[K, int] = {}

    def __len__(self) -> int:
        """How many keys hold anything (the map's size, not the total)."""
        return len(self._counts)

    def __getitem__(self, key: K) -> int:
        return self._counts.get(key, 0)

    def add(self, key: K) -> int:
        """One more for ``key``; returns its count."""
        count = self._counts[key] = self._counts.get(key, 0) + 1
        return count

    def remove(self, key: K) -> int:
        """One fewer for ``key`` (never below zero); returns its count."""
        count = self._counts.pop(key, 0) - 1
        if count > 0:
            self._counts[key] = count
        return max(count, 0)
