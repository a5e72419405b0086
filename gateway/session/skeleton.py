"""The protocol-independent half of a session: bytes in, events to the
protocol's handler table, outbox out, deadlines as data.

Sans-IO and synchronous, like the codec it drives.  The server feeds it
bytes (:meth:`Skeleton.receive_data`), drains :attr:`Skeleton.outbox`, asks
for :meth:`Skeleton.next_deadline` and calls :meth:`Skeleton.on_deadline`
when it passes.  A protocol session (STOMP, MQTT) holds one and hands it a
:class:`Dialect`: which events each state accepts and their handlers (the
transition table), and how its errors reach the peer.  The protocol session
keeps for itself what only the protocol knows: its handlers and how a
delivery is encoded.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from core.clients import Client
from core.ports import Clock
from gateway.session.flow import InputGate, report_slow_consumers
from gateway.session.outbox import Outbox
from gateway.session.timers import Beat, Silence


class State(enum.Enum):
    AWAITING_CONNECT = "awaiting-connect"
    CONNECTED = "connected"
    CLOSED = "closed"


# Read once per frame in the input loop: one global lookup, not two.
_CLOSED = State.CLOSED
_AWAITING_CONNECT = State.AWAITING_CONNECT

# How long one pass over a connection's input may hold the loop before the
# rest waits, buffered, for the next (every other connection gets its turn
# between): what bounds a client whose every frame is as costly as the limits
# allow (MQTT 5 packets of 1,024 User Properties are ~2 ms each), whatever
# one read held.  A pass of small frames does a few hundred in this time, as
# a read's worth did, so batching is kept.
PASS_BUDGET_S = 0.002


class Codec(Protocol):
    """What the skeleton needs of a sans-IO codec (both have it)."""

    @property
    def buffered_bytes(self) -> int: ...

    def receive_data(self, data: bytes) -> None: ...

    def events(self) -> Iterator[Any]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Dialect:
    """What a protocol hands its skeleton."""

    # The transition table: per state (all three), the events it accepts and
    # their handlers.  Anything else goes to ``reject``.
    # Each handler takes (event), or (owner, event) when ``owner`` is set.
    handlers: Mapping[State, Mapping[type, Callable[..., None]]]
    reject: Callable[[Any], None]
    # What a handler or the codec raises about the peer, and the one place
    # that answers it (the event being handled, or None before the first).
    errors: tuple[type[Exception], ...]
    on_error: Callable[[Exception, Any], None]
    # A deadline passed (no CONNECT in time, a silent peer): say so, close.
    fail: Callable[[str], None]
    # The peer closed its side.
    on_eof: Callable[[], None]
    # What the protocol calls its silence limit, for the reason: "heart-beat".
    silence: str
    # Room for more deliveries beyond the outbox's (MQTT: its in-flight window).
    room: Callable[[], bool] = lambda: True
    # Events still handled while the core holds this producer back: those that
    # add nothing to a queue (a DISCONNECT), so a client that has what it
    # needed (a COMMIT's receipt) can still leave.  Reading goes on, one event
    # at most: the first other one is held back (``deferred``) until release.
    while_held: frozenset[type] = frozenset()
    # If set, ``handlers`` holds plain functions of (owner, event), one table
    # for every session of a protocol (no bound methods per session).
    owner: Any = None


class Skeleton:
    """One connection's lifecycle, whatever its protocol."""

    __slots__ = (
        "codec", "clock", "log", "dialect", "outbox", "state", "handlers", "client", "close_reason",
        "login_deadline", "silence", "beat", "gate", "deferred", "paused", "backlog", "timer",
    )

    def __init__(
        self,
        codec: Codec,
        clock: Clock,
        log: Any,
        dialect: Dialect,
        *,
        outbox_high_water_bytes: int,
        connect_timeout_s: float,
        heartbeat: bytes = b"",
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.codec = codec
        self.clock = clock
        self.log = log
        self.dialect = dialect
        self.outbox = Outbox(outbox_high_water_bytes)
        self.state = State.AWAITING_CONNECT
        # The current state's row of the transition table (read per event).
        self.handlers = dialect.handlers[self.state]
        # Set once, by :meth:`connected`.
        self.client: Client | None = None
        self.close_reason: str | None = None
        now = clock.monotonic()
        self.login_deadline = now + connect_timeout_s
        self.silence = Silence(now)
        self.beat = Beat(now, heartbeat)
        self.gate = InputGate()
        # An event held back and handled again first on release: a CONNECT
        # waiting for its password check, a SEND waiting out the disk alarm.
        self.deferred: Any = None
        # Set while the core holds deliveries back because we had no room.
        self.paused = False
        # Set when a pass ran out of PASS_BUDGET_S with input still buffered;
        # ``timer`` measures it: the real time the loop is held, not the
        # clock's (an autojump clock stands still while a pass runs).
        self.backlog = False
        self.timer = timer

    # -- the server's side -------------------------------------------------

    @property
    def closed(self) -> bool:
        """No more input will be processed; flush the outbox and close."""
        return self.state is _CLOSED

    @property
    def wants_input(self) -> bool:
        """False while reading more would only buffer: the outbox is not being
        read, an event is held back, or the core is holding this producer back
        and the protocol handles nothing meanwhile (``Dialect.while_held``)."""
        if self.outbox.full:
            return False
        return not self.gate.blocked or (self.deferred is None and bool(self.dialect.while_held))

    def receive_data(self, data: bytes | bytearray) -> None:
        if self.state is _CLOSED:
            return
        self.silence.last_heard = self.clock.monotonic()
        self.codec.receive_data(bytes(data))  # a stream may hand a bytearray; codecs keep bytes
        if data:
            self.process()
        else:
            self.dialect.on_eof()

    @property
    def backlogged(self) -> bool:
        """A pass stopped at its time budget with input left: the reader
        yields once, then :meth:`resume_input`, before it reads more."""
        return self.backlog and self.state is not _CLOSED

    def resume_input(self) -> None:
        """Handle what arrived before reading stopped (or a pass's budget ran
        out): the held-back event first, then the frames buffered behind it."""
        if self.state is _CLOSED:
            return
        if self.backlog:
            self.process()  # it minds the gate, as for input just read
        elif not self.gate.blocked:
            if self.deferred is not None:
                event, self.deferred = self.deferred, None
                self.process(event)
            elif self.codec.buffered_bytes:
                self.process()

    def next_deadline(self) -> float | None:
        state = self.state
        if state is _CLOSED:
            return None
        if state is _AWAITING_CONNECT:
            # A CONNECT held back waiting for its own password check is not
            # timed out: the client sent it in time, and the wait is bounded
            # by its door's queue (full: refused "busy" at once).
            return self.login_deadline if self.deferred is None else None
        deadline = min(self.silence.deadline(), self.beat.deadline())
        if self.gate.blocked and self.client is not None:
            deadline = min(deadline, self.client.held_until)
        return None if deadline == math.inf else deadline

    def on_deadline(self, now: float) -> None:
        state = self.state
        if state is _CLOSED:
            return
        if state is _AWAITING_CONNECT:
            if now >= self.login_deadline and self.deferred is None:
                self.dialect.fail("no CONNECT within the connect timeout")
            return
        reading = self.wants_input
        if self.gate.blocked and self.client is not None:
            report_slow_consumers(self.client, now, self.log)
        if not reading:
            self.silence.last_heard = now  # we are not reading: its silence is ours
        if self.silence.expired(now):
            self.dialect.fail(f"{self.dialect.silence} timeout: nothing received from the client in time")
            return
        beat = self.beat
        if beat.due(now):
            # Output already waiting will do as a heart-beat once written.
            if not self.outbox:
                self.outbox.append(beat.data)
            beat.last_sent = now

    def on_drained(self) -> None:
        """Outbox bytes went on the wire (from a pass or the writer task)."""
        if self.beat.interval_s:
            self.beat.last_sent = self.clock.monotonic()
        if self.paused and self.outbox.nbytes < self.outbox.high_water // 2:
            self.resume_deliveries()

    # -- the protocol's side -----------------------------------------------

    def process(self, replay: Any = None) -> None:
        """Hand each buffered event (``replay`` first) to the current state's
        handler, until the session closes, this producer is held back, or
        the pass has had PASS_BUDGET_S (:attr:`backlogged`)."""
        self.backlog = False
        timer = self.timer
        until = timer() + PASS_BUDGET_S
        gate = self.gate
        owner = self.dialect.owner
        while_held = self.dialect.while_held
        held = gate.blocked  # a local, set again below when a handler holds us: one test per event
        event: Any = None
        events = self.codec.events() if replay is None else itertools.chain((replay,), self.codec.events())
        try:
            for event in events:
                if held and type(event) not in while_held:
                    self.deferred = event  # held: handled first on release
                    return
                handler = self.handlers.get(type(event))
                if handler is None:
                    self.dialect.reject(event)
                    return
                if owner is None:
                    handler(event)
                else:
                    handler(owner, event)
                if self.state is _CLOSED:
                    return
                client = self.client
                if gate.blocked or (client is not None and client.blocked_on):
                    gate.blocked = held = True  # producer flow control: stop reading
                    if self.deferred is not None or not while_held:
                        return
                if timer() >= until:
                    self.backlog = self.codec.buffered_bytes > 0  # the rest waits in the codec for the next pass
                    return
        except self.dialect.errors as exc:
            self.dialect.on_error(exc, event)

    def connected(self, client: Client) -> None:
        """CONNECT succeeded: from now on the connected row of the table applies."""
        self.client = client
        self.state = State.CONNECTED
        self.handlers = self.dialect.handlers[State.CONNECTED]

    def defer(self, event: Any) -> None:
        """Stop reading; ``event`` is handled again on :meth:`InputGate.release`."""
        self.deferred = event
        self.gate.blocked = True

    def resume_deliveries(self) -> None:
        """Room again (output drained, or the protocol's window freed): the
        core hands over what waited meanwhile."""
        if self.paused and self.outbox.nbytes < self.outbox.high_water and self.dialect.room():
            self.paused = False
            if self.client is not None:
                self.client.resume()

    def close(self, reason: str) -> bool:
        """Stop processing input (the writer flushes the outbox, then the
        server closes).  False if it was closed already."""
        if self.state is _CLOSED:
            return False
        self.close_reason = reason
        self.state = _CLOSED
        self.handlers = self.dialect.handlers[_CLOSED]
        if self.outbox.wakeup is not None:
            self.outbox.wakeup()  # let the writer see we are closed
        return True
