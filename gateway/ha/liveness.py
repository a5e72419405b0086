"""A replication link's liveness, as deadline math (pure: no I/O, no Trio).

Each end of a link (gateway/ha/link.py) sends a Ping when it has sent
nothing for ``heartbeat_s`` and drops the link when it has heard nothing for
``timeout_s``.  Both ends do both, independently of their disk work (a
heartbeat task of its own, not the task that writes), so a silent link is
noticed within ``timeout_s`` at each end; before, only the primary pinged and
a backup that waits on a dead link noticed it only by its own, longer timer
(issue 30, "flapping links").  A backup that lost its link reconnects after
:func:`backoff`, never more than ``timeout_s / 4`` apart, and gives up an
attempt whose connection and handshake are not done within ``timeout_s``
(one begun during a cut), so that after a heal it is following again within
about ``timeout_s`` plus a backoff.
"""

from __future__ import annotations

from dataclasses import dataclass

HEARTBEAT_S = 0.5
TIMEOUT_S = 2.0
FIRST_BACKOFF_S = 0.1


@dataclass
class Liveness:
    """When to ping and when the link is dead, from the last send and the last receive."""

    heartbeat_s: float
    timeout_s: float
    sent_at: float
    heard_at: float

    @classmethod
    def start(cls, now: float, heartbeat_s: float = HEARTBEAT_S, timeout_s: float = TIMEOUT_S) -> Liveness:
        return cls(heartbeat_s, timeout_s, now, now)

    def sent(self, now: float) -> None:
        self.sent_at = max(self.sent_at, now)

    def heard(self, now: float) -> None:
        self.heard_at = max(self.heard_at, now)

    def ping_at(self) -> float:
        """When a Ping is due unless something else is sent first."""
        return self.sent_at + self.heartbeat_s

    def dead_at(self) -> float:
        """When the link is dead unless something is heard first."""
        return self.heard_at + self.timeout_s

    def ping_due(self, now: float) -> bool:
        return now >= self.ping_at()

    def dead(self, now: float) -> bool:
        return now >= self.dead_at()


def backoff(failures: int, timeout_s: float = TIMEOUT_S) -> float:
    """The pause before a backup's next connection attempt after ``failures``
    failed ones in a row: doubling from 0.1 s, at most ``timeout_s / 4``."""
    return min(FIRST_BACKOFF_S * 2 ** min(max(0, failures - 1), 16), timeout_s / 4)
