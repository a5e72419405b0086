"""A session's clocks as data: how long the peer may stay silent, and how
often we must say something to an idle peer.  The skeleton turns them into
:meth:`next_deadline` and acts on them in :meth:`on_deadline`; nothing here
reads a clock."""

from __future__ import annotations

import math


class Silence:
    """How long the peer may say nothing once connected: STOMP's agreed
    heart-beat or MQTT's keep-alive, times a grace; 0 = forever."""

    __slots__ = ("limit_s", "last_heard")

    def __init__(self, now: float) -> None:
        self.limit_s = 0.0
        self.last_heard = now

    def deadline(self) -> float:
        return self.last_heard + self.limit_s if self.limit_s else math.inf

    def expired(self, now: float) -> bool:
        return bool(self.limit_s) and now >= self.last_heard + self.limit_s


class Beat:
    """How often we send ``data`` to a peer we have told nothing: STOMP's
    heart-beat to the client; 0 = never (an MQTT client pings, we answer)."""

    __slots__ = ("interval_s", "last_sent", "data")

    def __init__(self, now: float, data: bytes = b"") -> None:
        self.interval_s = 0.0
        self.last_sent = now
        self.data = data

    def deadline(self) -> float:
        return self.last_sent + self.interval_s if self.interval_s else math.inf

    def due(self, now: float) -> bool:
        return bool(self.interval_s) and now >= self.last_sent + self.interval_s
