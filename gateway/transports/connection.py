"""One accepted connection: its tasks over a protocol-agnostic session, and
the write at the end of each pass.

A connection is a reader, run in the task that accepted it, that feeds the
session whatever bytes arrive, and a writer task (in the server's handler
nursery) that drains the session's outbox with one ``send_all`` per batch
when the socket cannot take it at once (over a plain socket it exists only
while it has such work).  Each has a cancel scope bearing the closing bound.
The session's deadlines (heart-beats, keepalive, login timeout) are fired by
the server's one :class:`~gateway.transports.timers.Timers` task, so an idle plain connection is one
task, no nursery.

Whatever a pass produces (a reader's bytes handled, a deadline fired, a
batch written, the store's fsync) is written once per connection at the end
of that pass, straight to the socket when it takes it whole: for a
synchronous producer that is the receipt and the consumer's MESSAGE, each in
one ``send``, with no task woken.  The writer task runs only when the socket
is full, output waits for the store (the outbox's LSN gate), the session
closes, or the stream is not a plain socket (TLS, WebSocket).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

import trio

from gateway.session.skeleton import Skeleton
from gateway.transports.timers import Timers

# One read may return this much: enough to parse hundreds of small frames per
# wake-up, so per-message cost is not dominated by task switches (a pass's
# time budget, session.skeleton.PASS_BUDGET_S, bounds what handling it costs).
RECEIVE_BYTES = 64 * 1024
# After an ERROR or DISCONNECT the connection has this long to flush its
# outbox and see the peer's EOF; a peer that neither reads nor closes cannot
# keep the connection (and its memory) alive past it.
CLOSING_TIMEOUT_S = 5.0
# After sending our last bytes and EOF, how long we keep reading (and
# discarding) so that unread input does not make the kernel answer with a
# reset that destroys the ERROR frame before the client reads it.
LINGER_S = 1.0


class Session(Protocol):
    """What the server needs from a protocol session (STOMP, MQTT): its
    skeleton, which takes the bytes read, holds the outbox to write and names
    the next deadline, and the protocol's own word when the broker stops, the
    store fails or the connection is lost."""

    # The connection sets ``skeleton.outbox.wakeup`` and ``skeleton.gate.wake_reader``.
    skeleton: Skeleton

    def shutdown(self, reason: str) -> None: ...

    def storage_failed(self, first_lsn: int, last_lsn: int, reason: str, *, stored: bool = False) -> None: ...

    def close(self, reason: str) -> None: ...


class Pass:
    """The connections given output while one pass runs (server-wide: a
    producer's pass fills its consumers' outboxes too), used as ``with
    writes:`` around whatever handles input, a deadline or an fsync.  Passes
    never await, so one is open at a time; a nested one joins the outer, and
    the outermost writes each dirty connection's output once at its end."""

    __slots__ = ("depth", "dirty", "after_output", "first")

    def __init__(self, after_output: Callable[[], None] | None = None) -> None:
        self.depth = 0
        self.dirty: list[Connection] = []
        # The connection whose input the pass handles: written first, so a
        # producer waiting on its receipt is answered before the deliveries
        # its message made to others go out (ActiveMQ's producer thread also
        # writes the receipt before the dispatch).
        self.first: Connection | None = None
        # What to call when writing resumed deliveries (which may have acked
        # stored messages, so the store has work): the server's after_input.
        self.after_output = after_output

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc_info: object) -> None:
        self.depth -= 1
        if not self.depth:
            if self.dirty:
                self._flush()
            self.first = None

    def _flush(self) -> None:
        """Output that writing produces (deliveries it resumed) goes to
        writer tasks, so one pass cannot drain a whole queue without yielding."""
        dirty = self.dirty
        self.dirty = []
        first = self.first
        if first is not None and len(dirty) > 1 and dirty[0] is not first and first in dirty:
            dirty.remove(first)
            dirty.insert(0, first)
        resumed = False
        for connection in dirty:
            try:
                resumed = connection.write_now() or resumed
            except Exception:
                connection.failed()  # a bug met by that connection costs it, not this pass's owner
        if resumed and self.after_output is not None:
            self.after_output()


class Connection:
    """One accepted socket and its session.

    Its reader runs in the task that calls :meth:`run`, under the
    connection's own cancel scope (the closing bound); its writer, while it
    has one, is a task in ``tasks`` (the server's handler nursery) under a
    scope of its own with the same bound, so an idle plain connection is one
    task and no nursery."""

    __slots__ = (
        "stream", "session", "io", "log", "protocol", "peer", "opened_ms", "bytes_in", "ended",
        "_durable_lsn", "_gated", "_after_input", "_pass", "_fd", "_writer_idle", "_unsent",
        "_writer_lot", "_reader_lot", "_reading", "_reader_end", "_own_timers", "_timers", "_armed",
        "_tasks", "_scope", "_writer_scope", "_writing", "_bound",
    )

    def __init__(
        self,
        stream: trio.abc.Stream,
        session: Session,
        log: Any,
        durable_lsn: Callable[[], int],
        gated: set[Connection] | None = None,
        after_input: Callable[[], None] | None = None,
        writes: Pass | None = None,
        timers: Timers | None = None,
        tasks: trio.Nursery | None = None,
    ) -> None:
        self.stream = stream
        self.session = session
        self.io = session.skeleton
        self.log = log
        self.protocol = ""
        self.peer = ""
        self.opened_ms = int(time.time() * 1000)
        self.bytes_in = 0
        self._durable_lsn = durable_lsn
        # Connections whose writer waits for the store (shared, server-wide),
        # and what to call once a session has acted (to start a store write).
        self._gated = gated if gated is not None else set()
        self._after_input = after_input
        self._pass = writes if writes is not None else Pass(after_input)
        # A plain TCP socket is read and written on its file descriptor (no
        # Stream wrappers, no checkpoint per call); -1: use the stream.
        self._fd = stream.socket.fileno() if type(stream) is trio.SocketStream else -1
        # True while no writer task has anything of its own to send: only
        # then may a pass write to the socket itself.  On a plain socket the
        # writer task exists only while it has work; over other streams it
        # parks when idle.
        self._writer_idle = False
        self._unsent = b""  # what a pass's write left for the writer task
        # Made when first parked on (most connections never are).
        self._writer_lot: trio.lowlevel.ParkingLot | None = None
        self._reader_lot: trio.lowlevel.ParkingLot | None = None
        self._reading = True  # until the reader ends
        self._reader_end: trio.Event | None = None  # made by a writer that lingers for the reader's end
        # Without the server's timers (a test's lone connection), its own.
        self._own_timers = timers is None
        self._timers = Timers() if timers is None else timers
        self._armed = math.inf  # the earliest deadline this connection has in the heap
        self.ended = False
        self._tasks = tasks if timers is not None else None  # the writer's nursery; None: its own
        self._scope: trio.CancelScope | None = None  # the reader's (the connection's)
        self._writer_scope: trio.CancelScope | None = None
        self._writing = False  # a writer task is started or running
        self._bound = math.inf  # the closing bound, once the session closed
        self.io.outbox.wakeup = self._output_ready
        self.io.gate.wake_reader = self._wake_reader

    async def run(self) -> None:
        if self._tasks is None:
            # A lone connection (a test's, a WebSocket's): its writer (and
            # timers) in a nursery of its own, as the server's would be.
            async with trio.open_nursery() as nursery:
                self._tasks = nursery
                if self._own_timers:
                    nursery.start_soon(self._timers.run)
                await self.run()
                nursery.cancel_scope.cancel()
            return
        try:
            with trio.CancelScope(deadline=self._bound) as self._scope:
                self._rearm()
                if self._fd < 0:
                    self._start_writer()
                else:
                    self._writer_idle = True
                    if self.io.outbox or self.io.closed:
                        self.wake_writer()
                await self._reader()
                if self._writing:  # closed: the writer flushes, sends EOF, ends us (within the bound)
                    await trio.sleep_forever()
        finally:
            # The socket is closed after this; nothing may write to its fd.
            self._fd = -1
            self._writer_idle = False
            self.ended = True
            self._timers.forget()
            if self._writer_scope is not None:
                self._writer_scope.cancel()

    def failed(self) -> None:
        """A bug met by this connection (its reader, its writer task, a
        shared pass or timer): log it, close the session, end the connection;
        never the broker and its other clients."""
        self.log.exception("connection_failed")
        self.session.close("internal error")
        if self._scope is not None:
            self._scope.cancel()

    def shutdown(self, reason: str) -> None:
        self.session.shutdown(reason)
        self._after_session_call()

    def closed_elsewhere(self) -> None:
        """Its session was closed by something outside its own input (a
        reload's revocation): flush, then end within the closing bound."""
        self._after_session_call()

    def wake_writer(self) -> None:
        if self._writer_idle:
            self._writer_idle = False
            if self._writing:  # a writer task waits: over TLS/WebSocket, or closing
                assert self._writer_lot is not None
                self._writer_lot.unpark_all()
            else:
                self._start_writer()

    def _start_writer(self) -> None:
        assert self._tasks is not None
        self._writing = True
        self._tasks.start_soon(self._write_task)

    def _wake_reader(self) -> None:
        if self._reader_lot is not None:
            self._reader_lot.unpark_all()

    def _output_ready(self) -> None:
        """The outbox went from empty to not: write it at the end of the
        pass, or (outside one) wake the writer."""
        writes = self._pass
        if writes.depth:
            writes.dirty.append(self)
        else:
            self.wake_writer()

    def write_now(self) -> bool:
        """At the end of a pass: put the outbox on the socket if it takes it
        whole; else leave it (or the rest) to the writer task.  True if
        writing it resumed deliveries (which may have acked stored messages)."""
        if not self._writer_idle or self._fd < 0 or self.io.closed:
            self.wake_writer()  # the writer sends (or flushes and closes) itself
            return False
        outbox = self.io.outbox
        data = outbox.drain(self._durable_lsn())
        if not data:
            if outbox:
                self._gated.add(self)  # held for the store: written when it is durable
            return False
        try:
            sent = os.write(self._fd, data)
        except OSError:
            # Full (EAGAIN), or broken: the writer's send_all waits for room,
            # or meets the same error and closes the session.
            sent = 0
        if sent < len(data):
            self._unsent = data[sent:]
            self.wake_writer()
            return False
        resumed = self._drained()
        if outbox:
            self.wake_writer()  # more than one batch, or gated behind a receipt
        return resumed

    def _drained(self) -> bool:
        """After a write: the session's bookkeeping, and reading resumes if
        it waited for room.  True if deliveries were paused (and may resume)."""
        io = self.io
        paused = io.paused
        io.on_drained()
        if not io.outbox.full and self._reader_lot:
            self._reader_lot.unpark_all()
        return paused

    def _after_session_call(self) -> None:
        """Re-arm the timer and, once the session is closed, bound the rest."""
        if self._after_input is not None:
            self._after_input()
        self._rearm()
        if self.io.closed:
            self.wake_writer()
            self._wake_reader()
            if self._bound == math.inf:
                self._bound = bound = trio.current_time() + CLOSING_TIMEOUT_S
                for scope in (self._scope, self._writer_scope):
                    if scope is not None:
                        scope.deadline = min(scope.deadline, bound)

    async def _reader(self) -> None:
        session = self.session
        io = self.io
        stream = self.stream
        writes = self._pass
        fd = self._fd
        # Whether a read may find data without waiting: after a full read
        # more may be queued; after a short one the kernel buffer is empty.
        ready = True
        try:
            while True:
                # Back-pressure: while our own replies are not being read, or
                # the core holds this producer back, stop reading.  A pass
                # that ran out of its time budget left input buffered: every
                # other task gets a turn, then the rest, before more is read.
                while (io.backlogged or not io.wants_input) and not io.closed:
                    if io.wants_input:
                        await trio.lowlevel.checkpoint()
                    else:
                        if self._reader_lot is None:
                            self._reader_lot = trio.lowlevel.ParkingLot()
                        await self._reader_lot.park()
                    writes.first = self
                    with writes:
                        io.resume_input()
                        self._after_session_call()
                try:
                    if fd < 0:
                        data = await stream.receive_some(RECEIVE_BYTES)
                    else:
                        # Every pass yields once: a wait for input, or (after
                        # a full read) a checkpoint, so a flood starves no one.
                        if ready:
                            await trio.lowlevel.checkpoint()
                        else:
                            await trio.lowlevel.wait_readable(fd)
                        try:
                            data = os.read(fd, RECEIVE_BYTES)
                        except BlockingIOError:
                            ready = False
                            continue
                        ready = len(data) == RECEIVE_BYTES
                # OSError: what the stream would have wrapped (a reset on the fd).
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    session.close(f"connection lost: {exc.__cause__ or exc}")
                    self._after_session_call()
                    return
                self.bytes_in += len(data)
                if io.closed:
                    if not data:
                        return
                    continue  # lingering: discard input after we closed
                writes.first = self
                with writes:
                    io.receive_data(data)
                    self._after_session_call()
                if not data:
                    return
        finally:
            self._reading = False
            if self._reader_end is not None:
                self._reader_end.set()

    async def _write_task(self) -> None:
        """The writer, in the tasks nursery: under the closing bound, and a
        bug in it costs this connection only (as one in the reader does)."""
        try:
            if self.ended:
                return  # started as the connection ended
            with trio.CancelScope(deadline=self._bound) as self._writer_scope:
                try:
                    await self._writer()
                except Exception:
                    self.failed()
        finally:
            self._writer_scope = None
            self._writing = False
            if not self._reading and self._scope is not None:
                self._scope.cancel()  # run() waits for the writer once reading ended

    async def _writer(self) -> None:
        session = self.session
        io = self.io
        outbox = io.outbox
        stream = self.stream
        writes = self._pass
        while True:
            data = self._unsent or outbox.drain(self._durable_lsn())
            self._unsent = b""
            if not data:
                if io.closed and not outbox:
                    break
                if outbox:
                    self._gated.add(self)  # held for the store: wake me when it writes
                self._writer_idle = True
                if self._fd >= 0 and not io.closed:
                    return  # passes write from here on; wake_writer starts another
                # Else wait here: a closing connection ends only once what it
                # owes (a receipt held for the store) is flushed, or at its bound.
                if self._writer_lot is None:
                    self._writer_lot = trio.lowlevel.ParkingLot()
                await self._writer_lot.park()
                continue
            try:
                await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                session.close(f"connection lost: {exc.__cause__ or exc}")
                self._after_session_call()
                break
            with writes:
                if self._drained() and self._after_input is not None:
                    self._after_input()  # deliveries it resumed may have acked stored messages
        # Closed and flushed: send EOF, give the peer a moment to read it and
        # close its side, then end the connection.
        if self._reading:
            try:
                if isinstance(stream, trio.abc.HalfCloseableStream):
                    await stream.send_eof()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the peer is already gone; nothing left to tell it
            if self._reading:
                self._reader_end = trio.Event()
                with trio.move_on_after(LINGER_S):
                    await self._reader_end.wait()
        assert self._scope is not None
        self._scope.cancel()

    def _rearm(self) -> None:
        # Only ever earlier: at the older deadline the connection finds a
        # later one itself (an early look per heart-beat interval costs less
        # than moving a timer on every pass).
        deadline = self.io.next_deadline()
        if deadline is not None and deadline < self._armed:
            self._armed = deadline
            self._timers.arm(self, deadline)

    def deadline_passed(self, deadline: float, now: float) -> None:
        """An entry of ours in the timers' heap is due."""
        if deadline != self._armed or self.ended or self.io.closed:
            return  # superseded by an earlier one, or nothing left to time
        self._armed = math.inf
        with self._pass:
            self.io.on_deadline(now)
            self._after_session_call()
