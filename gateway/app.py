"""Wiring: the store, one broker core, its listeners and sessions, the store's
committer and maintenance tasks, and signal handling."""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from functools import partial
from collections.abc import Callable
from typing import Any, Protocol

import trio

from core.authorization import ANONYMOUS_PRINCIPAL, Authorizer, Principal, parse_entries
from core import recovery, revocation
from core.broker import Broker
from core.clients import Client
from core.storage import Recovered
from gateway import reload, startup, tasks
from gateway.auth import ADMIN, MESSAGING, Gatekeeper, Transport
from gateway.admin import cluster, metrics
from gateway.admin.server import AdminSlots, serve_admin, serve_probes
from gateway.admin.api import AdminApi, load_users
from gateway.admin.history import History
from gateway.config import Config
from gateway.mqtt import session as mqtt_session
from gateway.transports.server import REFUSAL_SLOTS, Limits, ListenerSpec, Server, TrioClock
from gateway.stomp.session import StompSession
from gateway.transports.websocket import Upgrades
from gateway.transports.tls import CertificateUsers, server_context
from persistence.journal import Batch
from persistence.recovery import Seed
from persistence.store import Store

# Worker threads by purpose, each with its own bound, so no one of them can
# take the threads another needs: a burst of password checks (PBKDF2) cannot
# hold up the store's group commit (and with it every receipt), and archive
# downloads on the admin port cannot either.  Password checks have a budget
# per door, threads hashing at once and checks waiting (past it, "busy"):
# STOMP/MQTT logins (and their WebSockets) and the admin API's Basic auth,
# so no amount of guessing admin passwords delays a client's login, nor the
# other way round.  One admin thread, hashing at most half the time: an
# operator logs in now and then (and the answer is cached), while a flood of
# guesses gets half a core at most, the clients' logins the rest.
PASSWORD_THREADS = 2
PASSWORD_BACKLOG = 256
ADMIN_PASSWORD_THREADS = 1
ADMIN_PASSWORD_BACKLOG = 32
ADMIN_PASSWORD_SHARE = 0.5
# door: (threads, checks waiting, share of a core each thread may hash)
PASSWORD_BUDGETS = {
    MESSAGING: (PASSWORD_THREADS, PASSWORD_BACKLOG, 1.0),
    ADMIN: (ADMIN_PASSWORD_THREADS, ADMIN_PASSWORD_BACKLOG, ADMIN_PASSWORD_SHARE),
}
STORE_THREADS = 1  # one batch is written at a time
ADMIN_THREADS = 4
# File descriptors beyond the connections: the store's segments, the
# listeners, the archive's open files, logs.
FILE_HEADROOM = 256
GC_YOUNG_ALLOCATIONS = 10_000  # see tune_collector


def _report(log: Any, event: str, **fields: Any) -> None:
    """The store's events: corruption and failures are worth an operator's
    attention (the store says which with its event name), the rest is INFO."""
    (log.warning if any(word in event for word in ("corrupt", "fail", "gap", "refused")) else log.info)(event, **fields)


def disk_free_bytes(path: str) -> int:
    """Bytes still free for the broker on ``path``'s filesystem (not counting
    root's reserve).  A module function so tests can make the disk look full."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class DiskWatch:
    """The disk alarm: looks at the data folder's free space and tells the
    core when it falls below ``min_free_bytes`` and when it is back, logging
    each change once (``disk_alarm``).  Acting before ENOSPC means a full disk
    holds producers instead of failing their writes."""

    def __init__(self, path: str, min_free_bytes: int, broker: Broker, log: Any) -> None:
        self.path = path
        self.min_free_bytes = min_free_bytes
        self.broker = broker
        self.log = log
        self.free_bytes = -1  # last seen; -1 until looked at (or when it cannot be)

    def check(self) -> None:
        # Looked at with the alarm off too: gateway_disk_free_bytes has its sample either way.
        try:
            free = disk_free_bytes(self.path)
        except OSError as exc:
            if self.free_bytes != -1:
                self.log.warning("disk_free_unknown", data_dir=self.path, reason=exc.strerror or str(exc))
            self.free_bytes = -1
            return  # not knowing is no reason to stop producers
        self.free_bytes = free
        if not self.min_free_bytes:
            return
        on = free < self.min_free_bytes
        if self.broker.set_disk_alarm(on):
            # Both at warning: a log that shows the alarm set must show it cleared.
            self.log.warning(
                "disk_alarm", state="set" if on else "cleared", free_bytes=free, min_free_bytes=self.min_free_bytes,
                data_dir=self.path,
            )


class Replication(Protocol):
    """What the broker asks of an HA primary's replication (its
    :class:`PrimaryRole`, gateway/ha/primary_role.py; absent single-node):
    the committer hands it batches, the server waits on its receipt gate,
    and it runs the replication listener."""

    def attach(self, store: Store) -> None: ...

    def publish(self, batch: Batch) -> None: ...

    def receipt_lsn(self) -> int: ...

    def store_failed(self, reason: str) -> None: ...  # the committer's: a write failed, not for a full disk

    def serving(self, server: Server) -> None: ...

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None: ...

    @property
    def cluster(self) -> cluster.Source: ...  # /api/v1/cluster and the gateway_ha_* metrics


@dataclasses.dataclass
class Running:
    """What a started broker reports: its real ports (useful with port 0) and handles to stop it."""

    ports: dict[str, int]
    server: Server
    broker: Broker
    store: Store

    def stop(self) -> None:
        self.server.stop()


async def serve(
    config: Config, log: Any, *, handle_signals: bool = True, task_status: Any = trio.TASK_STATUS_IGNORED,
    primary: Replication | None = None, reread: Callable[[Config], Config] | None = None, seed: Seed | None = None,
) -> None:
    """Recover the store, run the broker until SIGINT/SIGTERM (or
    :meth:`Running.stop`), then drain, close the store and return.  Startup
    is the steps below in this order; shutdown runs it the other way round.
    With ``primary`` (an HA primary) batches replicate and receipts wait for
    the backups' confirmations.  ``reread(running)`` loads the configuration
    again for a reload (SIGHUP, POST /api/v1/reload); without it (an HA
    node, a broker run in-process) a reload is refused and says so.
    ``seed``: a promoted backup's index, which the store opens from
    (persistence/recovery.py's :class:`Seed`)."""
    wiring = await _open_and_recover(config, log, seed)  # the core as the store left it, before anyone can reach it
    wiring.reread = reread
    if primary is not None:
        primary.attach(wiring.store)
        wiring.replicator = primary
    wiring.build_server()  # the listeners' server, waking the committer and the redelivery timer
    wiring.build_gatekeeper()  # logins, their password checks in worker threads
    wiring.build_listeners()  # the sessions and the ports; a TLS certificate that does not load stops here
    wiring.watch_disk()  # the disk alarm, looked at before anyone connects
    wiring.build_admin_api()  # locked (403) without admin users
    wiring.build_reloader()  # what a reload may change: users, the authorization map, admin users, policies
    try:
        async with trio.open_nursery() as nursery:
            wiring.start_tasks(nursery, handle_signals=handle_signals)  # the committer, before any client writes
            if primary is not None:
                primary.serving(wiring.server)
                await nursery.start(primary.run)  # the backups' port, before any client's
            ports = await nursery.start(wiring.run_listeners)  # bound, and serving until stopped
            await wiring.start_admin(nursery, ports)  # after the ports it reports on
            wiring.listening = True  # ready, last
            log.info("broker_started", ports=ports, data_dir=config.data_dir)
            task_status.started(Running(ports, wiring.server, wiring.broker, wiring.store))
            await wiring.finished.wait()
            wiring.listening = False
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await wiring.close_store()  # after every task and connection has stopped
    log.info("broker_stopped")


async def _open_and_recover(config: Config, log: Any, seed: Seed | None = None) -> _Wiring:
    """Open the store, replay it (in a worker thread: recovery reads every
    segment) and restore the core from it, before any listener exists, so
    no client ever sees a half-restored broker."""
    await trio.to_thread.run_sync(startup.prepare_data_dir, config, log)  # walks the folder: off the loop
    _raise_file_limit(config, log)
    store = Store.in_data_dir(config.data_dir, config.store, partial(_report, log))
    started = time.monotonic()
    store_threads = trio.CapacityLimiter(STORE_THREADS)
    recovered = await trio.to_thread.run_sync(partial(store.open, seed), limiter=store_threads)
    if config.store.sync == "never":
        log.warning("store_sync_never", detail="persistent messages are NOT safe from a crash; for tests only")
    clock = TrioClock()
    acl = parse_entries(config.auth.acl, groups=config.auth.groups)
    # The OS's randomness: message ids and temporary names differ from the last run's.
    broker = Broker(clock, config.broker, store=store, authorizer=Authorizer(acl) if acl else None,
                    entropy=os.urandom)
    skipped = recovery.restore(broker, recovered)
    store.forget_redeliveries()
    for durable in broker.durables.values():  # persistent MQTT sessions keep their bound
        if durable.client_id.startswith(mqtt_session.OWNER_PREFIX):
            durable.queue.configure(limit=config.mqtt.max_queued_messages)
    log.info(
        "store_recovered",
        clean=recovered.clean,
        messages=sum(len(q) for q in recovered.queues.values()),
        durable_subscriptions=len(recovered.subscriptions),
        replayed_records=recovered.replayed_records,
        corrupt_records=recovered.corrupt_records,
        torn_bytes=recovered.torn_bytes,
        skipped=skipped,
        seconds=round(time.monotonic() - started, 3),
    )
    return _Wiring(config, log, store, store_threads, recovered, clock, broker)


class _Wiring:
    """One broker's parts around its recovered core, built and started by
    :func:`serve` a step at a time in the order it lists them; each step
    sets the attributes later ones use."""

    def __init__(
        self, config: Config, log: Any, store: Store, store_threads: trio.CapacityLimiter, recovered: Recovered,
        clock: TrioClock, broker: Broker,
    ) -> None:
        self.config, self.log, self.clock, self.broker = config, log, clock, broker
        self.store, self.store_threads, self.recovered = store, store_threads, recovered
        self.finished = trio.Event()  # set when the listeners have stopped
        self.listening = False  # readiness: true from broker_started until shutdown
        self.replicator: Replication | None = None
        self.reread: Callable[[Config], Config] | None = None  # None: a reload is refused

    def build_server(self) -> None:
        """The listeners' server.  After each client's input it wakes the
        committer (if that input wrote anything) and the redelivery timer (if
        it held a message back), so neither polls."""
        config, store = self.config, self.store
        limits = Limits(config.max_connections, config.max_connections_per_address, config.tls.handshake_timeout_s)
        self.server = server = Server(
            self.log, durable_lsn=(lambda: store.durable_lsn) if self.replicator is None else self.replicator.receipt_lsn, grace_s=config.shutdown_grace_s, limits=limits,
            certificate_user=CertificateUsers(config.tls).user,
        )
        self.commit_lot = commit_lot = trio.lowlevel.ParkingLot()
        self.redelivery = redelivery = tasks.RedeliveryTimer(self.broker)

        def after_input() -> None:
            if store.appended_lsn > store.durable_lsn:
                commit_lot.unpark_all()
            redelivery.reschedule()

        server.after_input = after_input

    def build_gatekeeper(self) -> None:
        """Logins.  Password hashes (PBKDF2, slow on purpose) are computed in worker
        threads, so a burst of logins cannot stall every other client; hashlib
        releases the GIL while it works.  Each door has its own threads and
        bounded backlog (PASSWORD_BUDGETS): past it, "busy"."""
        self.gatekeeper = gatekeeper = Gatekeeper(self.config.auth)
        # With users, durable state is owned: anonymous clients hold none.
        self.broker.secured = bool(gatekeeper.users)
        self.password_checks = [
            (tasks.password_checks(gatekeeper, door, backlog), threads, trio.CapacityLimiter(threads), share)
            for door, (threads, backlog, share) in PASSWORD_BUDGETS.items()
        ]
        startup.announce_access(self.config, self.log)

    def stomp_session(self, conn_id: str, conn_log: Any, transport: Transport) -> StompSession:
        return StompSession(
            self.broker, self.clock, self.config.stomp, conn_id=conn_id, log=conn_log,
            admit=partial(self.gatekeeper.admit, transport=transport), source=transport.host,
        )

    def mqtt_session(self, conn_id: str, conn_log: Any, transport: Transport) -> mqtt_session.MqttSession:
        return mqtt_session.MqttSession(
            self.broker, self.clock, self.config.mqtt, self.registry, conn_id=conn_id, log=conn_log,
            admit=partial(self.gatekeeper.admit, transport=transport), source=transport.host,
        )

    def build_listeners(self) -> None:
        """The MQTT sessions' registry as the store left it (who owns durable
        state, QoS 2 ids awaiting PUBREL, when kept v5 sessions end, with the
        timer that ends them), and which ports to bind: plain, TLS
        or both, the TLS context loaded here so a bad certificate stops startup."""
        config = self.config
        broker, kv = self.broker, self.recovered.kv
        self.registry = registry = mqtt_session.Registry()
        kept = [(d.client_id, d.owner) for d in broker.durables.values()]
        kept += [(m.client_id, m.owner) for m in broker.shared.memberships.values() if m.client_id is not None]
        registry.restore(kv.get(mqtt_session.QOS2_NOTES, {}), kept)
        # Kept v5 sessions end on time across restarts; the overdue end here, before anyone connects.
        registry.restore_lifetimes(broker, kv.get(mqtt_session.EXPIRY_NOTES, {}), self.log)
        commit_lot = self.commit_lot

        def lifetimes_due(now_ms: int) -> None:
            registry.expire_due(broker, now_ms, self.log)
            commit_lot.unpark_all()  # what ended is written without waiting for a client's input

        self.lifetimes = tasks.DeadlineTimer(broker.clock, registry.lifetimes.next_due, lifetimes_due)
        registry.lifetimes.on_earlier = self.lifetimes.reschedule
        self.tls = tls = server_context(config.tls) if config.tls.enabled else None
        self.specs = []
        if config.tls.plain:
            self.specs += [
                ListenerSpec("stomp", config.bind, config.stomp_port, self.stomp_session),
                ListenerSpec("mqtt", config.bind, config.mqtt_port, self.mqtt_session),
            ]
        if tls is not None:
            self.specs += [
                ListenerSpec("stomp-tls", config.bind, config.stomp_tls_port, self.stomp_session, tls),
                ListenerSpec("mqtt-tls", config.bind, config.mqtt_tls_port, self.mqtt_session, tls),
            ]

    def watch_disk(self) -> None:
        """The disk alarm, looked at once before anyone connects."""
        self.disk = DiskWatch(self.config.data_dir, self.config.store.min_free_bytes, self.broker, self.log)
        self.disk.check()

    def build_admin_api(self) -> None:
        """The admin API; without admin users it is locked (403), said once."""
        config, server = self.config, self.server
        self.writes = metrics.Histogram()
        self.admins = users = load_users(config.admin)
        if not users:
            self.log.warning("admin_api_locked", detail=startup.no_admin_detail())
        store = self.store
        self.history = History(self.broker, server, store, config.data_dir, config.admin.history_interval_s)
        group = self.replicator.cluster if self.replicator is not None else cluster.Single(lambda: store.durable_lsn)
        self.api = AdminApi(
            self.broker, server, users=users, ready=lambda: self.listening and not server.stopping,
            metrics=lambda: metrics.render(self.broker, server, store, self.writes, self.gatekeeper, self.disk,
                                           group.view(), self.registry),
            archive=store.archive, origins=config.admin.allowed_origins + config.admin.websocket_origins,
            gate=self.gatekeeper, cluster=group, history=self.history,
            reload=lambda: self.reloader.reload("api"),
        )

    def build_reloader(self) -> None:
        self.reloader = reload.Reloader(self.config, self.admins, self.reread, self, self.log)

    def apply(self, config: Config, admins: dict[str, tuple[str, str]]) -> None:
        """A reloaded configuration's live part, for the operations that
        follow: logins and their groups, the authorization map (the next
        SUBSCRIBE or SEND of every client is decided by it), the admin
        users, and the per-destination policies.  Clients already connected
        are checked again (core.revocation): a removed user's connections
        close, and so does one holding a subscription the new map no longer
        grants; the others go on with their user's groups as listed now."""
        gatekeeper = self.gatekeeper
        before = set(gatekeeper.users)
        gatekeeper.reconfigure(config.auth)
        self.broker.secured = bool(gatekeeper.users)
        acl = parse_entries(config.auth.acl, groups=config.auth.groups)

        def principal_of(client: Client) -> Principal | None:
            # Listed: its groups as now.  Anonymous: while anonymous logins
            # from its address are let in (the holder of an anonymous
            # client's pool share is its source address).  Unlisted before
            # and now (a certificate's user with no entry): as it logged in.
            principal = client.principal
            if principal.name in gatekeeper.users:
                return gatekeeper.principal(principal.name)
            if principal == ANONYMOUS_PRINCIPAL:
                return principal if gatekeeper.admits_anonymous(client.holder[1]) else None
            return None if principal.name in before else principal

        self.broker.authorizer = Authorizer(acl) if acl else None  # a new object: no remembered decision is reused
        clients = [c.io.client for c in self.server.connections.values() if c.io.client is not None]
        done = self.server.act(partial(revocation.recheck, clients, principal_of))
        self.log.info("access_rechecked", connections=done.clients, subscriptions=done.subscriptions,
                      subscriptions_ended=done.ended, connections_closed=len(done.revocations),
                      users_removed=sorted(before - gatekeeper.users.keys()))
        self.broker.replace_policies(config.broker.policies)
        self.api.access.replace(admins)
        startup.announce_access(config, self.log)

    def start_tasks(self, nursery: trio.Nursery, *, handle_signals: bool) -> None:
        """The store's group commit, the timers and the password workers,
        before any listener, so the first client's writes have a committer."""
        config, log = self.config, self.log
        nursery.start_soon(tasks.commit, self.store, self.server, self.commit_lot, log, self.writes, self.store_threads, self.disk,
                           self.replicator, self.replicator.store_failed if self.replicator is not None else None)
        nursery.start_soon(self.redelivery.run)
        nursery.start_soon(self.lifetimes.run)  # kept MQTT 5 sessions' ends, delayed wills
        if self.tls is not None and config.tls.reload_interval_s > 0:
            nursery.start_soon(tasks.reload_tls, self.tls, config.tls, log)
        for checks, workers, threads, share in self.password_checks:  # each door's own
            for _ in range(workers):
                nursery.start_soon(tasks.verify_passwords, checks, threads, share)
        nursery.start_soon(tasks.maintain, self.store, self.broker, config.store.maintenance_interval_s, self.commit_lot, log)
        nursery.start_soon(tasks.watch_disk, self.disk, config.store.maintenance_interval_s)
        nursery.start_soon(tasks.sample_history, self.history, self.broker.clock)  # the console's charts
        if handle_signals:
            nursery.start_soon(tasks.stop_on_signal, self.server, log)
            nursery.start_soon(tasks.reload_on_signal, self.reloader.reload)

    async def run_listeners(self, *, task_status: Any) -> None:
        """Bind every listener, report the ports, serve until stopped and drained."""
        try:
            await self.server.run(self.specs, task_status=task_status)
        finally:
            self.finished.set()

    async def start_admin(self, nursery: trio.Nursery, ports: dict[str, int]) -> None:
        """The admin port (plain and/or TLS) with its own threads and slots and
        the WebSocket doors to the sessions (/stomp, /mqtt), and the probe
        port if configured, added to ``ports``."""
        config, log = self.config, self.log
        admin_threads = trio.CapacityLimiter(ADMIN_THREADS)
        admin_slots = AdminSlots(self.server, config.admin.max_connections, config.admin.max_connections_per_address)
        upgrades = Upgrades.for_broker(self.server, config, self.stomp_session, self.mqtt_session)  # /stomp, /mqtt
        for endpoint in upgrades.endpoints.values():  # their /metrics samples from zero, as the listeners'
            self.server.accepted.setdefault(endpoint.name, 0)
        admin = partial(serve_admin, upgrades=upgrades, threads=admin_threads, slots=admin_slots)
        if config.tls.plain:
            ports["admin"] = await nursery.start(admin, self.api, config.admin, config.bind, config.admin_port, log)
        if self.tls is not None:
            ports["admin-tls"] = await nursery.start(
                partial(admin, ssl_context=self.tls), self.api, config.admin, config.bind, config.admin_tls_port, log
            )
        if config.admin.probe_port >= 0:  # Kubernetes' probes, on a listener of their own
            ports["probe"] = await nursery.start(serve_probes, self.api, config.bind, config.admin.probe_port, log)

    async def close_store(self) -> None:
        """Last, after every task has stopped: note which stored messages went
        out (so they come back marked redelivered), then close the store."""
        broker = self.broker
        self.store.remember_redeliveries(recovery.delivered(broker.all_queues()))
        try:
            await trio.to_thread.run_sync(self.store.close, limiter=self.store_threads)
        except OSError as exc:
            # A disk that stopped writing (read-only, I/O errors): closed as a
            # crash would, so the next open recovers from what was fsynced.
            self.log.error("store_close_failed", reason=exc.strerror or str(exc), data_dir=self.config.data_dir)
            self.store.abandon()


def _raise_file_limit(config: Config, log: Any) -> None:
    """Every connection is a file descriptor: take the soft limit up to the
    hard one (a default 1024 would refuse connections long before
    max_connections), and say what it is and whether it covers the limits."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("file_limit_not_raised", soft=soft, hard=hard, reason=str(exc))
    needed = config.max_connections + config.admin.max_connections + REFUSAL_SLOTS + FILE_HEADROOM
    if config.max_connections and soft != resource.RLIM_INFINITY and soft < needed:
        log.warning("file_limit_low", limit=soft, needed=needed,
                    detail="max_connections plus the admin port's and the store's files need more; raise ulimit -n")
    else:
        log.info("file_limit", limit=soft)


def run(config: Config, log: Any, reread: Callable[[Config], Config] | None = None) -> None:
    """Run the broker in this (main) thread until a signal stops it."""
    tune_collector()
    trio.run(partial(serve, config, log, reread=reread))


def tune_collector() -> None:
    """The broker process's cyclic garbage collector: what start-up made
    (modules, settings) is never scanned again, and young collections run
    every GC_YOUNG_ALLOCATIONS container allocations instead of 700.  Each
    connection holds about a hundred tracked objects, so with the defaults a
    connect storm spends as long in the collector as in the broker (full
    scans of every connection, hundreds of ms each at 5,000 connections).
    Memory stays bounded: garbage is freed by reference counting as before;
    only cycles wait a little longer."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_ALLOCATIONS, *gc.get_threshold()[1:])


