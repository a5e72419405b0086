"""What every protocol session keeps about time and input, in one place:
the login deadline, how long the peer may stay silent, and whether the core
is holding this producer back (flow control).  Sans-IO: the session asks for
its next deadline and is told when it passes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.clients import Client
from core.ports import Clock


class Liveness:
    __slots__ = (
        "clock", "connect_timeout_s", "opened_at", "last_read", "silence_s", "blocked", "wake_reader", "deferred",
    )

    def __init__(self, clock: Clock, connect_timeout_s: float) -> None:
        self.clock = clock
        self.connect_timeout_s = connect_timeout_s
        self.opened_at = self.last_read = clock.monotonic()
        self.silence_s = 0.0  # how long the peer may say nothing once connected; 0 = forever
        # Producer flow control: set while the core holds this client back;
        # frames already received stay in the codec until it lets go.
        self.blocked = False
        self.wake_reader: Callable[[], None] | None = None  # set by the server
        # A CONNECT waiting for its password check (off the loop); reading
        # stops meanwhile, and the session handles it again on release.
        self.deferred: Any = None

    def defer(self, event: Any) -> None:
        self.deferred = event
        self.blocked = True

    def take_deferred(self) -> Any:
        event, self.deferred = self.deferred, None
        return event

    def heard(self) -> None:
        self.last_read = self.clock.monotonic()

    def hold_if_blocked(self, client: Client | None) -> bool:
        """After a frame: should reading stop because the core holds us back?"""
        if client is not None and client.blocked_on:
            self.blocked = True
        return self.blocked

    def release(self) -> None:
        """The core let go (Sink.unblocked): read again."""
        self.blocked = False
        if self.wake_reader is not None:
            self.wake_reader()

    def deadlines(self, connected: bool, client: Client | None) -> list[float]:
        if not connected:
            return [self.opened_at + self.connect_timeout_s]
        out = []
        if self.silence_s:
            out.append(self.last_read + self.silence_s)
        if self.blocked and client is not None:
            out.append(client.held_until)
        return out

    def expired(self, now: float, connected: bool, client: Client | None, reading: bool, log: Any) -> str | None:
        """Why the connection must end at ``now``, if it must: no login in
        time, or a silent peer.  Also lets the core judge slow consumers."""
        if not connected:
            return "no CONNECT within the connect timeout" if now >= self.opened_at + self.connect_timeout_s else None
        if self.blocked and client is not None:
            for queue in client.check_held(now):
                log.warning("slow_consumer", destination=queue.address.text,
                            consumer_client=getattr(queue.owner, "number", None), depth=queue.depth)
        if not reading:
            self.last_read = now  # we are not reading: its silence is ours
        if self.silence_s and now >= self.last_read + self.silence_s:
            return "timeout: nothing received from the client in time"
        return None
