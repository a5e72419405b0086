"""The broker's long-running tasks, each started once by :mod:`gateway.app`
in the main nursery: group commit, maintenance (expiry, checkpoints,
garbage collection, compaction, archive retention), the redelivery timer,
the disk watch, the console's history, password checks in worker threads, TLS
reload and signals (SIGINT and SIGTERM stop, SIGHUP reloads the configuration)."""

from __future__ import annotations

import errno
import signal
import ssl
import time
from collections.abc import Callable
from typing import Any, Protocol

import trio

from core import names
from core.broker import Broker
from core.ports import Clock
from gateway import auth
from gateway.admin import metrics
from gateway.transports.server import Server
from gateway.transports.tls import TlsSettings, files_version, load_files
from persistence.journal import Batch
from persistence.store import Store

# After a failed write (disk full, I/O error) wait this long before the next
# attempt, so a full disk is not hammered in a tight loop.
STORE_RETRY_S = 0.5
# Write errors that mean "full": the disk alarm (min_free_bytes) holds the
# producers and the write is tried again once space is back.  Any other
# (EROFS, EIO, ...) means the disk cannot be trusted to write: after a failed
# fsync Linux may drop the dirty pages and report the next fsync clean, so
# retrying proves nothing.  An HA primary steps down on those.
FULL_ERRNOS = frozenset((errno.ENOSPC, errno.EDQUOT))
# How often a store_stats line is logged at INFO.
STATS_INTERVAL_S = 10.0
# A password check waiting for a worker thread: passcode, stored hash, and
# what to call with the answer.
Check = tuple[str, str, Callable[[bool], None]]


class Watch(Protocol):
    """The disk alarm (app.DiskWatch): looks at the free space and raises or
    clears the alarm (0: no alarm, the free space still looked at)."""

    min_free_bytes: int

    def check(self) -> None: ...


class BatchSink(Protocol):
    """Where the committer hands each written batch: an HA primary's
    :class:`app.Replication`, whose replicator (gateway/ha/replicator.py)
    streams it to the backups."""

    def publish(self, batch: Batch) -> None: ...


def password_checks(gate: auth.Gatekeeper, door: str, backlog: int) -> trio.MemoryReceiveChannel[Check]:
    """Make ``gate`` hand the password checks of ``door`` (auth.MESSAGING,
    auth.ADMIN) to a channel of ``backlog`` of its own (past it a login there
    is answered "busy") for :func:`verify_passwords`."""
    send, receive = trio.open_memory_channel[Check](backlog)

    def verifier(passcode: str, stored: str, done: Callable[[bool], None]) -> bool:
        try:
            send.send_nowait((passcode, stored, done))
        except trio.WouldBlock:
            return False
        return True

    gate.verifiers[door] = verifier
    return receive


async def verify_passwords(checks: trio.MemoryReceiveChannel[Check], threads: trio.CapacityLimiter | None,
                           share: float = 1.0) -> None:
    """The hashes (PBKDF2, slow on purpose) in worker threads, never on the
    event loop.  With ``share`` below 1 this worker rests after each hash for
    as long as the hash took times (1 - share) / share, so its door gets at
    most that share of a core however many checks wait (the rest of the
    machine is for the clients)."""
    async for passcode, stored, done in checks:
        started = trio.current_time()
        done(await trio.to_thread.run_sync(auth.verify_password, passcode, stored, limiter=threads))
        if share < 1.0:
            await trio.sleep((trio.current_time() - started) * (1.0 - share) / share)


async def commit(
    store: Store, server: Server, lot: trio.lowlevel.ParkingLot, log: Any, writes: metrics.Histogram,
    threads: trio.CapacityLimiter, disk: Watch | None = None, replicator: BatchSink | None = None,
    on_broken: Callable[[str], None] | None = None,
) -> None:
    """Group commit: write (and fsync) whatever accumulated while the last
    write ran, in a worker thread, then release the receipts it covers.
    After each write the free space is looked at too: a fast producer fills
    more than ``min_free_bytes`` between two maintenance ticks (seen filling
    a 20 MB tmpfs), and one statvfs per batch is nothing beside its fsync.
    With a ``replicator`` every written batch goes to it, in LSN order, before
    the receipts are looked at (they may also wait for its confirmations).
    A write that fails for anything but a full disk (:data:`FULL_ERRNOS`)
    is also told to ``on_broken`` (an HA primary's: it steps down)."""
    while True:
        batch = store.take_batch()
        if batch is None:
            await lot.park()
            continue
        # Shielded: a batch taken is always finished (written or failed)
        # before shutdown closes the store behind it.
        with trio.CancelScope(shield=True):
            started = time.monotonic()
            try:
                await trio.to_thread.run_sync(store.write_batch, batch, limiter=threads)
                writes.observe(time.monotonic() - started)
            except OSError as exc:
                failed: OSError | None = exc
            else:
                failed = None
                store.batch_written(batch)
                if replicator is not None:
                    replicator.publish(batch)
                server.durable_advanced()
        if disk is not None and batch.runs and disk.min_free_bytes:  # the alarm's quick look; the watch task's otherwise
            disk.check()
        if failed is not None:
            first, last = store.batch_failed(batch, failed)
            reason = failed.strerror or str(failed)
            log.error("store_write_failed", reason=reason, first_lsn=first, last_lsn=last)
            if on_broken is not None and failed.errno not in FULL_ERRNOS:
                on_broken(reason)  # holds every receipt at once, before the ERRORs below
            server.durable_failed(first, last, reason)
            await trio.sleep(STORE_RETRY_S)


async def maintain(
    store: Store, broker: Broker, interval_s: float, commit_lot: trio.lowlevel.ParkingLot, log: Any
) -> None:
    """Sweep expired messages; checkpoint, delete dead segments and compact,
    a bounded step at a time."""
    next_stats = trio.current_time() + STATS_INTERVAL_S
    while True:
        await trio.sleep(interval_s)
        expired = broker.sweep_expired()
        if expired:
            log.info("messages_expired", count=expired)
        commit_lot.unpark_all()  # acks made outside any client call get written too
        if store.checkpoint_due():
            store.checkpoint()  # prepared here; the next batch writes it
            commit_lot.unpark_all()
        deleted = store.collect_garbage()
        if deleted:
            log.info("store_segments_deleted", segments=deleted)
        archive_retention(store, broker, log)
        while store.compact_step():
            await trio.sleep(0)  # let clients in between steps
        if trio.current_time() >= next_stats:
            next_stats = trio.current_time() + STATS_INTERVAL_S
            log.info("store_stats", **store.stats())


async def watch_disk(disk: Watch, interval_s: float) -> None:
    # Its own task: statvfs is cheap, and a long compaction must not delay
    # the alarm.
    while True:
        await trio.sleep(interval_s)
        disk.check()


async def sample_history(history: Any, clock: Clock) -> None:
    """The console's history (gateway/admin/history.py): one sample every
    interval, on the event loop (it only reads counters), until cancelled."""
    while True:
        history.sample(clock.wall_ms())
        await trio.sleep(history.interval_s)


def archive_retention(store: Store, broker: Broker, log: Any) -> None:
    """Drop whole archive segments beyond each topic's retention policy."""
    archive = store.archive
    if archive is None:
        return
    for topic in list(archive.topics):
        address = names.parse("/topic/" + topic)
        if isinstance(address, str):
            continue
        policy = broker.policies.for_address(address)
        dropped = archive.apply_retention(topic, policy.archive_retention_s, policy.archive_retention_bytes)
        if dropped:
            log.info("archive_retention_dropped", topic=topic, offsets=dropped, earliest=archive.topics[topic].bases[0])


class RedeliveryTimer:
    """Sleeps until the core's earliest held redelivery is due, then releases
    what is due; woken early when a session's call made an earlier one."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._scope: trio.CancelScope | None = None
        self._scheduled: int | None = None

    def reschedule(self) -> None:
        due = self.broker.next_redelivery_ms()
        if due is not None and (self._scheduled is None or due < self._scheduled) and self._scope is not None:
            self._scope.cancel()

    async def run(self) -> None:
        while True:
            due = self._scheduled = self.broker.next_redelivery_ms()
            with trio.CancelScope() as self._scope:
                if due is None:
                    await trio.sleep_forever()
                await trio.sleep(max(0.0, (due - self.broker.clock.wall_ms()) / 1000))
            self.broker.release_redeliveries(self.broker.clock.wall_ms())


class DeadlineTimer:
    """Sleeps until ``next_due()`` (ms since the epoch, on ``clock``), then
    calls ``run`` with the time; woken early (:meth:`reschedule`) when an
    earlier deadline is added.  The MQTT sessions' ends and delayed wills
    (gateway.mqtt.lifetime): the sessions only add deadlines, never await."""

    def __init__(self, clock: Clock, next_due: Callable[[], int | None], run: Callable[[int], None]) -> None:
        self.clock = clock
        self.next_due = next_due
        self.due_now = run
        self._scope: trio.CancelScope | None = None
        self._scheduled: int | None = None

    def reschedule(self) -> None:
        due = self.next_due()
        if due is not None and (self._scheduled is None or due < self._scheduled) and self._scope is not None:
            self._scope.cancel()

    async def run(self) -> None:
        while True:
            due = self._scheduled = self.next_due()
            with trio.CancelScope() as self._scope:
                if due is None:
                    await trio.sleep_forever()
                await trio.sleep(max(0.0, (due - self.clock.wall_ms()) / 1000))
            self.due_now(self.clock.wall_ms())


async def reload_tls(context: ssl.SSLContext, settings: TlsSettings, log: Any) -> None:
    """Load a rotated certificate (and key and CA) for new handshakes once its
    files change; a set that does not load (a half-written pair, say) is
    logged and tried again, and the running one stays."""
    version = files_version(settings)
    while True:
        await trio.sleep(settings.reload_interval_s)
        current = files_version(settings)
        if current == version:
            continue
        try:
            load_files(context, settings)
        except ValueError as exc:
            log.warning("tls_reload_failed", reason=str(exc), detail="the previous certificate stays in use")
            continue
        version = current
        log.info("tls_reloaded", cert=settings.cert)


async def stop_on_signal(server: Server, log: Any) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("shutdown_requested", signal=signal.Signals(signum).name)
            server.stop()


async def reload_on_signal(reload: Callable[[str], Any]) -> None:
    """SIGHUP reloads the configuration (gateway/reload.py, which logs what
    it did); it never ends the process.  The reload reads a file or two of a
    few KB and hashes nothing, so it runs here, between two client inputs."""
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            reload("SIGHUP")
