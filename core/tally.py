"""Counting things by who holds them (durable subscriptions by owner, say),
for limits per user: a key is kept only while its count is above zero, so the
map is never larger than what it counts, however many owners come and go.

:class:`Shares` is the one mechanism behind every per-user share of a
broker-wide pool (shared subscription groups, retained messages, delayed
wills): what each holder holds, in items and bytes, with the totals, and why
one more would pass a bound.  A holder is a user, or, for anonymous clients,
their source address (:func:`holder_of`): one anonymous client must not take a
pool from every other anonymous device, nor should all of them share one
share."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

from core.authorization import ANONYMOUS_PRINCIPAL, Principal

K = TypeVar("K", bound=Hashable)

# Who holds a share: ("user", name) or ("anonymous", source address).  A pair,
# so no user name (which may contain "@" or anything else) can be taken for
# an anonymous address.  State restored from the store that does not say its
# holder is held by (RESTORED, ""): counted broker-wide, in no one's share.
Holder = tuple[str, str]
USER, ANONYMOUS, RESTORED = "user", "anonymous", "restored"
UNKNOWN_HOLDER: Holder = (RESTORED, "")


def holder_of(principal: Principal, source: str | None) -> Holder:
    """Whose share ``principal``'s connection from ``source`` (its peer's
    host) draws on."""
    if principal is ANONYMOUS_PRINCIPAL:
        return ANONYMOUS, source or "unknown"
    return USER, principal.name


def holder_of_owner(owner: str | None) -> Holder:
    """The holder of state stored with ``owner`` (core.durables.owner_of: ""
    anonymous, None before owners were recorded): a user's is theirs; an
    anonymous one's source address was not stored, so it is no one's."""
    return (USER, owner) if owner else UNKNOWN_HOLDER


def describe(holder: Holder) -> str:
    """``holder`` as a refusal names it."""
    kind, name = holder
    if kind == USER:
        return f"user {name!r}"
    if kind == ANONYMOUS:
        return f"anonymous clients from {name}"
    return "state restored from the store"


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

    def add(self, key: K, amount: int = 1) -> int:
        """``amount`` more for ``key``; returns its count."""
        count = self._counts.get(key, 0) + amount
        if count > 0:
            self._counts[key] = count
        else:
            self._counts.pop(key, None)
        return max(count, 0)

    def remove(self, key: K, amount: int = 1) -> int:
        """``amount`` fewer for ``key`` (never below zero); returns its count."""
        count = self._counts.pop(key, 0) - amount
        if count > 0:
            self._counts[key] = count
        return max(count, 0)


class Shares:
    """What each holder holds of one pool, in items and bytes, and the pool's
    totals.  ``what`` names the items in refusals ("retained messages")."""

    __slots__ = ("what", "items", "bytes", "total_items", "total_bytes")

    def __init__(self, what: str) -> None:
        self.what = what
        self.items: Tally[Holder] = Tally()
        self.bytes: Tally[Holder] = Tally()
        self.total_items = 0
        self.total_bytes = 0

    def take(self, holder: Holder, nbytes: int = 0, items: int = 1) -> None:
        self.items.add(holder, items)
        self.bytes.add(holder, nbytes)
        self.total_items += items
        self.total_bytes += nbytes

    def give_back(self, holder: Holder, nbytes: int = 0, items: int = 1) -> None:
        self.items.remove(holder, items)
        self.bytes.remove(holder, nbytes)
        self.total_items -= items
        self.total_bytes -= nbytes

    def refusal(self, holder: Holder, max_items: int, max_bytes: int = 0, *, items: int = 1, nbytes: int = 0,
                bytes_setting: str = "") -> str | None:
        """Why ``holder`` may not take ``items`` more holding ``nbytes`` more
        past its share (``max_items``, ``max_bytes``; 0: no limit), or None.
        Taking nothing more (a replacement no larger) is never refused; state
        restored without a holder has no share to pass."""
        if holder == UNKNOWN_HOLDER:
            return None
        if max_items and items > 0 and self.items[holder] + items > max_items:
            return f"too many {self.what} for {describe(holder)} (limit {max_items})"
        if max_bytes and nbytes > 0 and self.bytes[holder] + nbytes > max_bytes:
            return f"{self.what} of {describe(holder)} would pass {max_bytes} bytes ({bytes_setting or 'limit'})"
        return None

    def total_refusal(self, max_items: int, max_bytes: int = 0, *, items: int = 1, nbytes: int = 0,
                      bytes_setting: str = "") -> str | None:
        """Why the pool as a whole may not take ``items`` more holding
        ``nbytes`` more (0: no limit), or None."""
        if max_items and items > 0 and self.total_items + items > max_items:
            return f"too many {self.what} on the broker (limit {max_items})"
        if max_bytes and nbytes > 0 and self.total_bytes + nbytes > max_bytes:
            return f"{self.what} on the broker would pass {max_bytes} bytes ({bytes_setting or 'limit'})"
        return None
