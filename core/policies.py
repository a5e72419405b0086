"""Per-destination policies, ActiveMQ style: entries matched by destination
pattern (``*`` one segment, ``>`` the rest), the more specific overriding the
more general, on top of the broker-wide defaults.

    [[broker.policies]]
    destination = "/queue/orders.>"
    max_redeliveries = 3
    queue_high_water = 5000
    send_fail_if_no_space = true
"""

from __future__ import annotations

import dataclasses
from typing import Any

from core import names
from core.names import Address

# The settings a policy entry may set for its destinations.
POLICY_FIELDS = frozenset(
    {
        "default_prefetch", "topic_buffer_limit", "topic_high_water", "resident_messages", "max_redeliveries",
        "dead_letter_queue", "dead_letter_per_destination", "queue_high_water", "send_fail_if_no_space",
        "expired_to_dlq", "redelivery_delay_ms", "redelivery_backoff", "max_redelivery_delay_ms",
        "archive", "archive_retention_s", "archive_retention_bytes",
    }
)
CACHE_ENTRIES = 4096


def check_entries(base: Any, entries: list[dict[str, Any]]) -> list[tuple[Address, dict[str, Any]]]:
    """Validated ``(pattern, overrides)`` pairs; ValueError names what is wrong."""
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "destination" not in entry:
            raise ValueError(f"broker.policies[{i}] needs a destination pattern")
        pattern = names.parse(str(entry["destination"]))
        if isinstance(pattern, str):
            raise ValueError(f"broker.policies[{i}].destination: {pattern}")
        overrides = {k: v for k, v in entry.items() if k != "destination"}
        for key, value in overrides.items():
            if key not in POLICY_FIELDS:
                raise ValueError(f"broker.policies[{i}]: {key!r} is not a per-destination setting")
            expected = type(getattr(base, key))
            if type(value) is not expected and not (expected is float and type(value) is int):
                raise ValueError(f"broker.policies[{i}].{key}: expected {expected.__name__}, got {value!r}")
        out.append((pattern, overrides))
    return out


def _specificity(pattern: Address) -> tuple[int, int, int]:
    literal = sum(1 for s in pattern.segments if s not in (names.ANY_SEGMENT, names.ANY_REST))
    return (0 if pattern.is_pattern else 1, literal, len(pattern.segments))


class Policies:
    """Resolves the effective settings of a destination, cached per address."""

    def __init__(self, base: Any) -> None:
        self.base = base
        entries = check_entries(base, base.policies)
        # Least specific first, so that applying in order lets the specific win.
        self._entries = sorted(entries, key=lambda e: _specificity(e[0]))
        # No per-destination entries: every address has ``base`` (the publish
        # path reads this rather than call for_address per message).
        self.uniform = not self._entries
        self._cache: dict[Address, Any] = {}

    def for_address(self, address: Address) -> Any:
        if not self._entries:
            return self.base
        found = self._cache.get(address)
        if found is not None:
            return found
        merged: dict[str, Any] = {}
        for pattern, overrides in self._entries:
            if pattern.kind is address.kind and names.matches(pattern.segments, address.segments):
                merged.update(overrides)
        # policies=[]: the derived settings need not (and must not, per miss)
        # validate every entry again in BrokerSettings.__post_init__.
        found = dataclasses.replace(self.base, policies=[], **merged) if merged else self.base
        if len(self._cache) >= CACHE_ENTRIES:
            self._cache.clear()
        self._cache[address] = found
        return found
