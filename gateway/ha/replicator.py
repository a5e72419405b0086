"""The replication stream's primary end (Trio): a primary's :class:`Replicator`
serves its backups.  Roles are given (the coordinator decides them); the
frames are persistence/replica/replication.py's, the catch-up rule
persistence/replica/catchup.py's, the backup's store persistence/replica/follower.py's.

Replicator, per backup connection: the backup's Hello is answered by
:func:`catchup.plan` (the tail from its next LSN, a snapshot, or Refused);
then one task sends frames and one reads Acks.

- **The window.**  The committer hands every written batch to
  :meth:`Replicator.publish`, which keeps it (as Batch frames of at most
  ``piece_bytes`` of records) in one window shared by every backup, bounded by
  ``window_bytes`` and ``window_batches``.  Each backup has only a cursor into
  it (the next LSN to send), so memory does not grow with the number of
  backups nor with how far one lags.  A backup whose cursor falls behind the
  window (too slow, or away too long) is cut to a snapshot, read from disk in
  chunks; a briefly disconnected one resumes by tail from the window.  A
  new primary's window starts with the batches it applied last as a backup
  (:meth:`Replicator.seed`, gateway/ha/window.py), so a failover too leaves the
  backups a little behind on the tail.
- **Flow control.**  At most ``unacked_bytes`` of Batch frames are sent and
  not yet acked per backup; past that the sender waits for Acks.  So a slow
  backup's lag shows up as a cursor falling behind the window (then a
  snapshot), not as megabytes piling up in socket buffers.
- **Confirmation.**  A backup is *in sync* once it has acked a batch that was
  the newest when it was sent (it caught up with the live stream); it stops
  being in sync when its link ends or it is cut to a snapshot.  It is told
  with an InSync frame, so that its role (backup_in_sync) says what the
  primary counts.
  :meth:`Replicator.confirmed_lsn` is the ``sync_replicas``-th highest LSN acked
  by in-sync backups, a watermark that only rises (the local durable LSN when
  ``sync_replicas`` is 0).  The receipt gate is :meth:`Replicator.receipt_lsn`,
  ``min(local durable, confirmed)``.
- **Sync timeout.**  A batch not confirmed ``sync_timeout_s`` after it was
  written locally is failed: ``on_failed(first, last, reason)``, the path a
  failed disk write takes (``Server.durable_failed``: the receipts waiting on
  those LSNs are withdrawn and the client gets an ERROR naming them).
- **Liveness.**  Each end sends a Ping when it sent nothing for
  ``ping_interval_s`` ([ha] link_heartbeat_s) and drops the link when it heard
  nothing for ``idle_timeout_s`` ([ha] link_timeout_s), snapshot or not: the
  backup's heartbeat does not wait for its disk (gateway/ha/liveness.py).

The other end, a backup's :class:`Backup`, is gateway/ha/backup.py; the
connection both use gateway/ha/link.py.
"""

from __future__ import annotations

import collections
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from gateway.admin.cluster import Lag
from gateway.ha.link import IDLE_TIMEOUT_S, LINK_ERRORS, Handshakes, Link, LinkDead, ignore, peer_address, peer_host
from gateway.ha.liveness import HEARTBEAT_S
from gateway.ha.status import Marks
from gateway.ha.window import WINDOW_BATCHES, WINDOW_BYTES, seeding, size_of
from gateway.transports.server import open_listeners
from persistence.journal import Batch
from persistence.replica import epochs
from persistence.replica import replication as r
from persistence.replica.catchup import Answer, SnapshotSource, plan
from persistence.replica.epochs import History
from persistence.replica.handshake import AuthenticationError
from persistence.store import Store

__all__ = ["Peer", "Replicator"]

# Batch frames sent to one backup and not yet acked: enough to keep a fast
# link busy while the backup fsyncs the previous batches.
UNACKED_BYTES = 4 * 2**20
# A group-commit batch larger than this goes out as several frames.
PIECE_BYTES = 4 * 2**20
PING_INTERVAL_S = HEARTBEAT_S
SYNC_TIMEOUT_S = 10.0


# -- the primary's side ----------------------------------------------------------------


@dataclass(eq=False)
class Peer:
    """A connected backup, as the primary sees it."""

    node_id: str
    cursor: int  # the next LSN to send
    acked: int = 0
    sync_point: int | None = None  # a batch sent live: in sync once acked up to it
    in_sync: bool = False
    tell_in_sync: int | None = None  # an InSync(lsn) for the sender to send
    snapshots: int = 0  # snapshots sent on this link
    unacked: collections.deque[tuple[int, int]] = field(default_factory=collections.deque)  # (last lsn, bytes)
    unacked_bytes: int = 0
    pong: int | None = None
    snapshotting: bool = False
    wake: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)
    scope: trio.CancelScope | None = None


class SnapshotRequest:
    """A snapshot a sender waits for while a batch is being written."""

    def __init__(self) -> None:
        self.source: SnapshotSource | None = None
        self.error: OSError | None = None
        self.done = trio.Event()


class Replicator:
    """Streams the batches of ``store`` (whose epoch history is ``history``;
    its last entry is this primary's epoch) to the backups that connect."""

    def __init__(
        self, store: Store, history: History, *, node_id: str, sync_replicas: int = 1,
        sync_timeout_s: float = SYNC_TIMEOUT_S,
        on_confirmed: Callable[[], None] = ignore, on_failed: Callable[[int, int, str], None] = ignore,
        on_refused: Callable[[str, str], None] = ignore,
        window_bytes: int = WINDOW_BYTES, window_batches: int = WINDOW_BATCHES,
        unacked_bytes: int = UNACKED_BYTES, piece_bytes: int = PIECE_BYTES,
        ping_interval_s: float = PING_INTERVAL_S, idle_timeout_s: float = IDLE_TIMEOUT_S, log: Any = ignore,
        secret: bytes = b"",
    ) -> None:
        self.store = store
        # The group's cluster secret (b"": none configured, a laptop trial on
        # loopback): a peer proves it holds it before anything is sent.
        self._secret = secret
        self.history = history
        self.epoch = epochs.current(history)
        self.node_id = node_id
        self.sync_replicas = sync_replicas
        self.sync_timeout_s = sync_timeout_s
        self.on_confirmed = on_confirmed  # the server's durable_advanced
        self.on_failed = on_failed  # the server's durable_failed
        self.on_refused = on_refused  # (node id, reason): a backup refused us (a newer epoch exists)
        self.window_bytes = window_bytes
        self.window_batches = window_batches
        self.unacked_bytes = unacked_bytes
        self.piece_bytes = piece_bytes
        self.ping_interval_s = ping_interval_s
        self.idle_timeout_s = idle_timeout_s
        self.log = log
        self.last_lsn = store.durable_lsn  # the last LSN published
        self.peers: dict[str, Peer] = {}
        self.handshakes = Handshakes()  # the links still proving membership
        self.window_held = 0  # bytes of records in the window
        self.window_peak = 0
        self._window: collections.deque[r.Batch] = collections.deque()
        self._by_first: dict[int, r.Batch] = {}
        self._confirmed = 0
        # Batches written here and not yet confirmed: (first lsn, last lsn, written at).
        self._unconfirmed: collections.deque[tuple[int, int, float]] = collections.deque()
        self._failed_upto = 0
        self._sync_lot = trio.lowlevel.ParkingLot()
        self._snapshot_requests: list[SnapshotRequest] = []
        self.marks = Marks(self.last_lsn, trio.current_time(), window_batches)  # for lags()

    def seed(self, frames: Sequence[r.Batch]) -> None:
        """Before the first publish: start the window with the batches this
        node applied last as a backup (gateway/ha/window.py), so that a peer
        whose history agrees with ours and is a little behind resumes by tail."""
        kept, why = seeding(frames, self.last_lsn, self.epoch, max_bytes=self.window_bytes,
                            max_batches=self.window_batches)
        if self._window or not kept:
            self.log("replication_window_empty", reason=why or "batches were published before")
            return
        for frame in kept:
            self._window.append(frame)
            self._by_first[frame.first_lsn] = frame
            self.window_held += size_of(frame)
        self.window_peak = max(self.window_peak, self.window_held)
        self.log("replication_window_seeded", first_lsn=kept[0].first_lsn, last_lsn=self.last_lsn,
                 batches=len(kept), bytes=self.window_held)

    # -- what the broker asks --------------------------------------------------------

    def confirmed_lsn(self) -> int:
        if self.sync_replicas == 0:
            return self.store.durable_lsn
        return self._confirmed

    def receipt_lsn(self) -> int:
        """The receipt gate: fsynced here and confirmed by the backups."""
        return min(self.store.durable_lsn, self.confirmed_lsn())

    def in_sync(self) -> list[str]:
        return sorted(p.node_id for p in self.peers.values() if p.in_sync)

    def lags(self) -> list[Lag]:
        """Each connected backup: what it acked and how far behind that is."""
        now = trio.current_time()
        out = []
        for peer in sorted(self.peers.values(), key=lambda p: p.node_id):
            lsns, nbytes, seconds, exact = self.marks.behind(peer.acked, now)
            out.append(Lag(peer.node_id, peer.acked, epochs.epoch_of(self.history, peer.acked), peer.in_sync,
                           lsns, nbytes, seconds, exact))
        return out

    def publish(self, batch: Batch) -> None:
        """The committer wrote ``batch`` (main thread, between batches)."""
        if batch.runs:
            runs = tuple((seg, offset, bytes(data)) for seg, offset, data in batch.runs)
            size = sum(len(data) for _, _, data in runs)
            pieces = (r.split_runs(batch.first_lsn, runs, self.piece_bytes) if size > self.piece_bytes
                      else [(batch.first_lsn, batch.last_lsn, runs)])
            for first, last, piece in pieces:
                frame = r.Batch(self.epoch, first, last, piece)
                self._window.append(frame)
                self._by_first[first] = frame
                self.window_held += sum(len(data) for _, _, data in piece)
            # The newest batch always stays (the live edge every backup is sent):
            # the bound is window_bytes or that one batch, whichever is larger.
            while (self._window[0].first_lsn < batch.first_lsn
                   and (self.window_held > self.window_bytes or len(self._window) > self.window_batches)):
                old = self._window.popleft()
                del self._by_first[old.first_lsn]
                self.window_held -= sum(len(data) for _, _, data in old.runs)
            self.window_peak = max(self.window_peak, self.window_held)
            self.last_lsn = batch.last_lsn
            now = trio.current_time()
            self.marks.add(batch.last_lsn, size, now)
            if self.sync_replicas:
                self._unconfirmed.append((batch.first_lsn, batch.last_lsn, now))
                self._sync_lot.unpark_all()
            for peer in self.peers.values():
                peer.wake.unpark_all()
        # Between two batches: the moment a snapshot may be taken.
        requests, self._snapshot_requests = self._snapshot_requests, []
        for request in requests:
            try:
                request.source = SnapshotSource(self.store, self.epoch, self.history)
            except OSError as exc:
                request.error = exc
            request.done.set()

    # -- serving -----------------------------------------------------------------------

    async def run(self, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                  task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on ``host:port`` (reports the bound port), over TLS with
        ``ssl_context`` ([ha] link_tls), and watch the sync timeout."""
        async with trio.open_nursery() as nursery:
            listeners = await open_listeners("replication", host, port)
            if ssl_context is not None:
                # The TLS handshake happens inside the link's handshake, under its time bound.
                listeners = [trio.SSLListener(listener, ssl_context) for listener in listeners]
            await nursery.start(trio.serve_listeners, self.serve_backup, listeners)
            nursery.start_soon(self.watch_sync)
            first = listeners[0].transport_listener if ssl_context is not None else listeners[0]
            task_status.started(first.socket.getsockname()[1])

    async def serve_backup(self, stream: trio.abc.Stream) -> None:
        link = Link(stream, r.Role.PRIMARY, heartbeat_s=self.ping_interval_s, timeout_s=self.idle_timeout_s)
        peer: Peer | None = None
        backup = "?"
        host = peer_host(stream)
        refusal = self.handshakes.enter(host)
        if refusal is not None:
            if self.handshakes.first_refusal(host):
                self.log("replication_peer_refused", address=peer_address(stream), reason=refusal)
            await trio.aclose_forcefully(stream)
            return
        try:
            try:
                member = await link.authenticate("primary", self.node_id, self._secret)
            except AuthenticationError as exc:
                # Once per connection; nothing of the journal was sent, nothing it sent was read.
                self.log("replication_peer_refused", address=peer_address(stream), reason=exc.reason)
                return
            finally:
                self.handshakes.leave(host)
            hello = await link.receive()
            if not isinstance(hello, r.Hello):
                return
            backup = hello.node_id
            if hello.node_id != member:
                # It proved membership as one node: it may not speak for another.
                self.log("replication_peer_refused", address=peer_address(stream),
                         reason=f"authenticated as {member!r}, says Hello as {hello.node_id!r}")
                return
            decision = plan(hello, self.history, self.last_lsn, self._oldest())
            await link.send(r.Hello(self.node_id, self.epoch, self.last_lsn, self.history))
            if decision.answer is Answer.REFUSE:
                self.log("replication_refused", backup=hello.node_id, reason=decision.reason)
                await link.send(r.Refused(self.epoch, decision.reason))
                self.on_refused(hello.node_id, decision.reason)
                return
            peer = Peer(hello.node_id, cursor=decision.from_lsn if decision.answer is Answer.TAIL else 0,
                        acked=hello.last_lsn if decision.answer is Answer.TAIL else 0)
            self.log("backup_connected", backup=peer.node_id, answer=decision.answer.value, lsn=hello.last_lsn,
                     reason=decision.reason)
            old = self.peers.get(peer.node_id)
            if old is not None and old.scope is not None:
                old.scope.cancel()  # the same node again: its old link is dead
            self.peers[peer.node_id] = peer
            async with trio.open_nursery() as nursery:
                peer.scope = nursery.cancel_scope
                nursery.start_soon(self._guarded, nursery.cancel_scope, peer, self._send_loop, peer, link,
                                   decision.answer is Answer.SNAPSHOT)
                nursery.start_soon(self._guarded, nursery.cancel_scope, peer, self._read_loop, peer, link)
                nursery.start_soon(self._guarded, nursery.cancel_scope, peer, link.keep_alive)
        except LINK_ERRORS as exc:
            self.log("backup_link_ended", backup=backup, reason=str(exc) or type(exc).__name__)
        finally:
            if peer is not None and self.peers.get(peer.node_id) is peer:
                del self.peers[peer.node_id]
            await trio.aclose_forcefully(stream)

    async def _guarded(self, scope: trio.CancelScope, peer: Peer, fn: Callable[..., Any], *args: Any) -> None:
        """Run one half of a link; whatever ends it ends the other half too."""
        try:
            await fn(*args)
        except LINK_ERRORS as exc:
            self.log("backup_link_ended", backup=peer.node_id, reason=str(exc) or type(exc).__name__)
        finally:
            peer.in_sync = False
            scope.cancel()

    def _oldest(self) -> int:
        return self._window[0].first_lsn if self._window else self.last_lsn + 1

    def _frame_from(self, lsn: int) -> r.Batch | None:
        """The frame starting at ``lsn``; None when the window no longer holds it."""
        frame = self._by_first.get(lsn)
        if frame is not None or not self._window or lsn < self._window[0].first_lsn:
            return frame
        for held in self._window:  # a backup that kept part of a batch (a crash mid-write)
            if held.first_lsn <= lsn <= held.last_lsn:
                pieces = [p for p in r.split_runs(held.first_lsn, held.runs, 1) if p[0] >= lsn]
                return r.Batch(held.epoch, lsn, held.last_lsn, tuple(run for p in pieces for run in p[2]))
        return None

    async def _send_loop(self, peer: Peer, link: Link, snapshot_first: bool) -> None:
        if snapshot_first:
            await self._send_snapshot(peer, link)
        while True:
            if peer.pong is not None:
                await link.send(r.Pong(peer.pong))
                peer.pong = None
            if peer.tell_in_sync is not None:
                lsn, peer.tell_in_sync = peer.tell_in_sync, None
                await link.send(r.InSync(self.epoch, lsn))
            if peer.cursor <= self.last_lsn and peer.unacked_bytes < self.unacked_bytes:
                frame = self._frame_from(peer.cursor)
                if frame is None:
                    self.log("backup_cut_to_snapshot", backup=peer.node_id, lsn=peer.cursor, oldest=self._oldest())
                    await self._send_snapshot(peer, link)
                    continue
                size = sum(len(data) for _, _, data in frame.runs)
                if frame.last_lsn == self.last_lsn and peer.sync_point is None:
                    self._caught_up(peer, frame.last_lsn)  # the live edge
                peer.cursor = frame.last_lsn + 1
                peer.unacked.append((frame.last_lsn, size))
                peer.unacked_bytes += size
                await link.send(frame)
                continue
            if peer.cursor > self.last_lsn and peer.sync_point is None:
                self._caught_up(peer, self.last_lsn)  # all sent (a tail at our end, or a snapshot of it)
                if peer.tell_in_sync is not None:
                    continue
            await peer.wake.park()  # idle: the link's heartbeat task pings meanwhile

    async def _snapshot(self) -> SnapshotSource:
        try:
            return SnapshotSource(self.store, self.epoch, self.history)
        except RuntimeError:
            pass  # a batch is being written: publish() takes it when it is done
        request = SnapshotRequest()
        self._snapshot_requests.append(request)
        await request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.source is not None
        return request.source

    async def _send_snapshot(self, peer: Peer, link: Link) -> None:
        peer.in_sync = False
        peer.sync_point = peer.tell_in_sync = None
        peer.snapshots += 1
        peer.snapshotting = True
        source = await self._snapshot()
        try:
            peer.cursor = source.lsn + 1  # every batch after the copy's end follows it
            peer.unacked.clear()
            peer.unacked_bytes = 0
            await link.send(source.begin)
            chunks = source.chunks()
            while (chunk := await trio.to_thread.run_sync(next, chunks, None)) is not None:
                await link.send(chunk)
            await link.send(source.end)
            self.log("snapshot_sent", backup=peer.node_id, lsn=source.lsn, files=len(source.begin.files))
        finally:
            source.close()
            peer.snapshotting = False

    async def _read_loop(self, peer: Peer, link: Link) -> None:
        while True:
            # No exception while it installs a snapshot: its heartbeat does not wait for its disk.
            frame = await link.receive()
            if frame is None:
                return
            if isinstance(frame, r.Ack):
                self._acked(peer, frame)
            elif isinstance(frame, r.Refused):
                self.log("replication_refused_by_backup", backup=peer.node_id, reason=frame.reason)
                self.on_refused(peer.node_id, frame.reason)
                return
            elif isinstance(frame, r.Ping):
                peer.pong = frame.token
                peer.wake.unpark_all()

    def _acked(self, peer: Peer, ack: r.Ack) -> None:
        if ack.epoch != self.epoch:
            # It accepted a newer epoch since (we are stale): never a confirmation.
            raise LinkDead(f"an ack of epoch {ack.epoch}, ours is {self.epoch}")
        peer.acked = max(peer.acked, ack.lsn)
        while peer.unacked and peer.unacked[0][0] <= ack.lsn:
            peer.unacked_bytes -= peer.unacked.popleft()[1]
        peer.wake.unpark_all()
        self._check_sync(peer)

    def _caught_up(self, peer: Peer, lsn: int) -> None:
        """Everything up to ``lsn``, the newest we hold, is sent to ``peer``:
        once it acks that far it is in sync."""
        peer.sync_point = lsn
        self._check_sync(peer)

    def _check_sync(self, peer: Peer) -> bool:
        """Mark ``peer`` in sync if it is; advance the confirmation watermark.
        True when the peer counts toward confirmations."""
        if not peer.in_sync and peer.sync_point is not None and peer.acked >= peer.sync_point:
            peer.in_sync = True
            peer.tell_in_sync = peer.acked
            peer.wake.unpark_all()
            self.log("backup_in_sync", backup=peer.node_id, lsn=peer.acked)
        if not peer.in_sync or self.sync_replicas == 0:
            return False
        acked = sorted((p.acked for p in self.peers.values() if p.in_sync), reverse=True)
        if len(acked) >= self.sync_replicas and acked[self.sync_replicas - 1] > self._confirmed:
            self._confirmed = acked[self.sync_replicas - 1]
            self._sync_lot.unpark_all()
            self.on_confirmed()
        return True

    async def watch_sync(self) -> None:
        """Fail what waits on confirmations longer than ``sync_timeout_s``."""
        waiting = self._unconfirmed
        while True:
            while waiting and waiting[0][1] <= self._confirmed:
                waiting.popleft()
            if not waiting:
                await self._sync_lot.park()
                continue
            now = trio.current_time()
            due = waiting[0][2] + self.sync_timeout_s
            if now < due:
                with trio.move_on_at(due):
                    await self._sync_lot.park()
                continue
            first = max(waiting[0][0], self._confirmed + 1, self._failed_upto + 1)
            last = 0
            while waiting and waiting[0][2] + self.sync_timeout_s <= now:
                last = waiting.popleft()[1]
            self._failed_upto = last
            in_sync = len(self.in_sync())
            reason = (f"not confirmed by {self.sync_replicas} in-sync backup{'s' if self.sync_replicas > 1 else ''} "
                      f"within {self.sync_timeout_s:g} s ({in_sync} in sync)")
            self.log("replication_sync_timeout", first_lsn=first, last_lsn=last, in_sync=in_sync)
            self.on_failed(first, last, reason)
