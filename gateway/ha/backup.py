"""A backup's side of the replication stream (Trio): connects to the
primary (bounded attempts, each within the link's timeout, with a short
backoff: gateway/ha/liveness.py), says Hello with its follower's state
(persistence/replica/follower.py), checks the primary's Hello (an older epoch than it
accepted is refused: the fencing rule), applies Batch frames (the disk part in
a worker thread, as the committer's write) and acks them, keeping the last
ones applied (:class:`Recent`: a promoted backup's first window), installs snapshots
(persistence/replica/catchup.py) and answers Pings.  Between writes, after each Ack
and whenever the link is idle, the follower's index catches up with what was
written (bounded per call, in a worker thread), so that a promotion finds it
ready.

Group commit, as the primary's committer does: a task reads frames ahead
while a write runs, and the Batch frames that arrived meanwhile go to disk
together, with one fdatasync and one Ack of the last (on a quiet disk
mostly one frame: the primary's batches come one fsync apart).

It tells whether it is at the live edge, as the primary counts it toward
``sync_replicas``: ``on_caught_up`` when the primary's InSync frame says it
acked a batch that was the newest when sent (after a tail or a snapshot),
``on_behind`` when that stops being so (a snapshot begins, a gap, the link
ends).  Refusals both ways (a stale
epoch, a gap, a bad batch) are reported through ``on_refused``; a gap or a
bad batch is followed by a new connection, whose Hello sorts it out (tail or
snapshot); a stale or refusing primary is not followed any more."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

import trio

from gateway.ha.link import IDLE_TIMEOUT_S, LINK_ERRORS, Link, LinkDead, ignore
from gateway.ha.liveness import HEARTBEAT_S, backoff
from gateway.ha.window import Recent
from persistence.replica import replication as r
from persistence.replica.catchup import Refusal
from persistence.replica.follower import Follower
from persistence.replica.handshake import AuthenticationError

CONNECT_ATTEMPTS = 10
# Frames read ahead of the writer.  Batch frames are bounded in bytes by the
# primary's unacked_bytes too, but a snapshot's FileChunks (1 MiB each) are
# not acked one by one: this bound keeps them to a few MiB here, the rest
# waiting in TCP's buffers as before.
READ_AHEAD_FRAMES = 8
# The journal the follower's index applies beyond what a write brought, after
# its Ack (and per call while the link is idle): enough to drain a lag soon,
# little enough that the next write never waits long (a few ms of replay).
CATCH_UP_BYTES = 256 * 2**10


class Stop(Exception):
    """The backup stops following this primary (it is stale, or refused us)."""


class Backup:
    """Follows the primary at ``host:port`` into ``follower`` until it is
    cancelled, refused, or the primary stays unreachable."""

    def __init__(
        self, follower: Follower, node_id: str, host: str, port: int, *,
        on_refused: Callable[[str], None] = ignore, on_caught_up: Callable[[], None] = ignore,
        on_behind: Callable[[], None] = ignore, connect_attempts: int = CONNECT_ATTEMPTS,
        backoff_s: float | None = None, idle_timeout_s: float = IDLE_TIMEOUT_S, heartbeat_s: float = HEARTBEAT_S,
        threads: trio.CapacityLimiter | None = None, recent: Recent | None = None, log: Any = ignore,
        secret: bytes = b"", ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.follower = follower
        # The group's cluster secret: the primary proves it holds it before
        # this backup sends its Hello or applies anything the primary sends.
        self._secret = secret
        self.ssl_context = ssl_context  # [ha] link_tls: the primary's certificate checked against [tls] ca
        self.node_id = node_id
        self.host = host
        self.port = port
        self.on_refused = on_refused  # every refusal, both ways (stale epoch, gap, bad batch)
        self.on_caught_up = on_caught_up
        self.on_behind = on_behind
        self.connect_attempts = connect_attempts
        self.backoff_s = backoff_s  # a fixed pause between attempts (tests); None: liveness.backoff
        self.idle_timeout_s = idle_timeout_s
        self.heartbeat_s = heartbeat_s
        self.threads = threads
        self.log = log
        self.connected = False
        self.in_sync = False  # the primary counts this backup toward sync_replicas
        self.snapshots = 0  # installed
        # The batches applied last, for this node's window should it lead
        # (gateway/ha/window.py); the node's own, kept across its links.
        self.recent = Recent() if recent is None else recent
        self._catch_up_failed = False  # the last catch-up raised: not tried while idle until the next write

    async def run(self) -> str:
        """Follow until stopped; returns why it stopped."""
        failures = 0
        while True:
            # The whole attempt is bounded by the link's timeout: a connection
            # begun during a cut (a SYN lost, or a handshake nobody answers)
            # is given up and tried again soon, not waited on for TCP's own
            # retries, so that a healed link is used within about that bound.
            deadline = trio.current_time() + self.idle_timeout_s
            stream: trio.abc.Stream | None = None
            try:
                with trio.move_on_at(deadline):
                    stream = await trio.open_tcp_stream(self.host, self.port)
                if stream is None:
                    raise OSError(f"no connection within {self.idle_timeout_s:g} s")
                if self.ssl_context is not None:
                    stream = trio.SSLStream(stream, self.ssl_context, server_hostname=self.host)
            except OSError as exc:
                reason = f"primary {self.host}:{self.port} unreachable: {exc.strerror or exc}"
            else:
                try:
                    link = Link(stream, r.Role.BACKUP, heartbeat_s=self.heartbeat_s, timeout_s=self.idle_timeout_s)
                    if await self._follow(link, deadline):
                        failures = 0  # it got as far as streaming: a fresh start
                    reason = "the primary closed the link"
                except Stop as exc:
                    return str(exc)
                except AuthenticationError as exc:
                    # Not our group's primary (an impostor named in ZooKeeper, a
                    # wrong secret): its store untouched, tried again later.
                    reason = f"the primary failed authentication: {exc.reason}"
                    self.log("replication_primary_refused", primary=f"{self.host}:{self.port}", reason=exc.reason)
                except LINK_ERRORS as exc:
                    reason = str(exc) or type(exc).__name__
                finally:
                    self.connected = False
                    self._behind()
                    await trio.aclose_forcefully(stream)
            failures += 1
            self.log("replication_link_down", primary=f"{self.host}:{self.port}", reason=reason, failures=failures)
            if failures >= self.connect_attempts:
                return f"gave up after {failures} attempts: {reason}"
            await trio.sleep(backoff(failures, self.idle_timeout_s) if self.backoff_s is None else self.backoff_s)

    def _behind(self) -> None:
        if self.in_sync:
            self.in_sync = False
            self.on_behind()

    async def _thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=self.threads)

    async def _refuse(self, link: Link, reason: str, *, stop: bool) -> None:
        self.log("replication_refused", reason=reason)
        self.on_refused(reason)
        await link.send(r.Refused(self.follower.epoch, reason))
        if stop:
            raise Stop(reason)

    async def _follow(self, link: Link, deadline: float) -> bool:
        """One connection; True once it streamed."""
        f = self.follower
        primary = await link.authenticate("backup", self.node_id, self._secret,
                                          timeout_s=max(0.0, deadline - trio.current_time()))
        await link.send(f.hello(self.node_id))
        hello = await link.receive()
        if hello is None:
            return False
        if isinstance(hello, r.Refused):
            self.on_refused(hello.reason)
            raise Stop(f"refused by the primary: {hello.reason}")
        assert isinstance(hello, r.Hello)  # the codec lets nothing else through first
        if hello.node_id != primary:
            raise AuthenticationError(f"authenticated as {primary!r}, says Hello as {hello.node_id!r}")
        try:
            await self._thread(f.accept_primary, hello)
        except Refusal as exc:
            await self._refuse(link, exc.reason, stop=True)
        self.connected = True
        self.log("replication_following", primary=hello.node_id, epoch=hello.epoch, lsn=f.last_lsn)
        send, frames = trio.open_memory_channel[r.Frame | Exception | None](READ_AHEAD_FRAMES)
        error: Exception | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_ahead, link, send)
            nursery.start_soon(self._keep_alive, link, send.clone())
            try:
                await self._stream(link, frames)
            except Exception as exc:  # raised here, not as a group from the nursery
                error = exc
            nursery.cancel_scope.cancel()
        if error is not None:
            raise error
        return True

    async def _read_ahead(self, link: Link, send: trio.MemorySendChannel[r.Frame | Exception | None]) -> None:
        """The link's only reader: frames (then None at EOF, or the error
        that ended the link) for :meth:`_stream`."""
        async with send:
            try:
                while (frame := await link.receive()) is not None:
                    await send.send(frame)
            except LINK_ERRORS as exc:
                await send.send(exc)
            else:
                await send.send(None)

    async def _keep_alive(self, link: Link, send: trio.MemorySendChannel[r.Frame | Exception | None]) -> None:
        """The link's heartbeat; a failed send ends the link through :meth:`_stream`."""
        async with send:
            try:
                await link.keep_alive()
            except LINK_ERRORS as exc:
                await send.send(exc)

    async def _stream(self, link: Link, frames: trio.MemoryReceiveChannel[r.Frame | Exception | None]) -> None:
        f = self.follower
        # A frame read while grouping but not part of the group: handled next.
        # (None is the stream's end, so "nothing held" is a list of none.)
        held: list[r.Frame | Exception | None] = []
        while True:
            if held:
                frame = held.pop()
            else:
                try:
                    frame = frames.receive_nowait()
                except trio.WouldBlock:
                    if f.index_behind and not self._catch_up_failed:  # idle: the index's turn
                        await self._catch_up(CATCH_UP_BYTES)
                        continue
                    frame = await frames.receive()
            if isinstance(frame, Exception):
                raise frame
            if frame is None:
                return
            if isinstance(frame, r.Batch):
                if frame.epoch < f.epoch:
                    await self._refuse(link, f"stale epoch {frame.epoch}: epoch {f.epoch} is accepted here", stop=True)
                group = [frame]
                while True:  # what arrived while the last write ran (at most the read-ahead)
                    try:
                        next_frame = frames.receive_nowait()
                    except trio.WouldBlock:
                        break
                    if not (isinstance(next_frame, r.Batch) and next_frame.epoch == frame.epoch):
                        held.append(next_frame)
                        break
                    group.append(next_frame)
                if not await self._write(link, group):
                    return
            elif isinstance(frame, r.InSync):
                if frame.epoch == f.epoch and frame.lsn <= f.last_lsn and not self.in_sync:
                    self.in_sync = True
                    self.log("replication_in_sync", lsn=frame.lsn)
                    self.on_caught_up()
            elif isinstance(frame, r.SnapshotBegin | r.FileChunk | r.SnapshotEnd):
                if isinstance(frame, r.SnapshotBegin):
                    self._behind()
                    self.recent.clear()  # the folder is about to be replaced
                await self._snapshot_frame(link, frame)
            elif isinstance(frame, r.Ping):
                await link.send(r.Pong(frame.token))
            elif isinstance(frame, r.Refused):
                self.on_refused(frame.reason)
                raise Stop(f"refused by the primary: {frame.reason}")

    async def _write(self, link: Link, group: list[r.Batch]) -> bool:
        """Write ``group`` with one fdatasync and ack its last LSN; False when
        refused (a new Hello sorts it out)."""
        f = self.follower
        try:
            step = f.receive(*group)
        except Refusal as exc:  # a gap or a bad batch
            self._behind()
            await self._refuse(link, exc.reason, stop=False)
            return False
        try:
            await self._thread(f.write, step)
        except BaseException:
            # The write failed, or never began: cancelled (told to stop
            # following) while waiting for a worker thread.  Either way
            # nothing of the step is acked; the follower must not stay
            # "writing" it, or its next batch, snapshot or close raises.
            f.failed(step)
            raise
        ack = f.written(step)
        for frame in group:
            self.recent.add(frame)
        await link.send(ack)
        self._catch_up_failed = False
        if f.checkpoint_due():
            # Its own checkpoint and dead segments, between writes (the
            # read-ahead goes on meanwhile): what bounds its disk and a
            # crash's recovery.
            try:
                deleted = await self._thread(f.upkeep)
            except OSError as exc:  # tried again once due again; the batches go on
                self.log("checkpoint_failed", reason=exc.strerror or str(exc))
            else:
                if deleted:
                    self.log("store_segments_deleted", segments=len(deleted))
        else:
            # What this write brought and a little more: the index keeps pace
            # with a busy link and a lag drains, without starving the next write.
            await self._catch_up(CATCH_UP_BYTES + sum(len(data) for _seg, _offset, data in step.frame.runs))
        return True

    async def _catch_up(self, max_bytes: int) -> None:
        try:
            await self._thread(self.follower.catch_up, max_bytes)
        except OSError as exc:  # tried again after the next write; a promotion then recovers from disk
            self._catch_up_failed = True
            self.log("index_catch_up_failed", reason=exc.strerror or str(exc))

    async def _snapshot_frame(self, link: Link, frame: r.SnapshotBegin | r.FileChunk | r.SnapshotEnd) -> None:
        f = self.follower
        try:
            if isinstance(frame, r.SnapshotBegin):
                self.log("snapshot_receiving", lsn=frame.lsn, files=len(frame.files))
                await self._thread(f.begin_snapshot, frame)
            elif isinstance(frame, r.FileChunk):
                await self._thread(f.file_chunk, frame)
            else:
                ack = await self._thread(f.end_snapshot, frame)
                self.snapshots += 1
                await link.send(ack)
        except Refusal as exc:
            await self._refuse(link, exc.reason, stop=exc.reason.startswith("stale epoch"))
            raise LinkDead(exc.reason) from None
