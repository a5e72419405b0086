"""One HA node's run (:class:`HaNode`; the process, node after node, is
gateway/ha/process.py).

It joins the group in ZooKeeper (gateway/ha/coordinator.py) with what its
data folder holds, and plays the role gateway/ha/node.py's table gives it.
As a backup it follows the lock holder (a :class:`Backup` into a
:class:`Follower` over the data folder) and serves only the admin port's
/healthz (200), /readyz (503), /metrics and /api/v1/cluster
(gateway/admin/standby.py).  When nobody holds the lock it stops following,
publishes its last LSN as final for that vacancy and tries to lead (decided
once every node has: gateway/ha/election.py); the winner
closes its follower, records its new epoch in the folder, and runs the
broker (gateway/app.py) on that folder as the primary: the replication
listener, receipts gated on the backups' confirmations, the client
listeners, ready.

A primary whose ZooKeeper connection is suspended keeps its clients but
releases no receipt (:meth:`PrimaryRole.hold`, gateway/ha/primary_role.py) until it is connected again
(the same session: it releases them) or its fence is due (the timing is
gateway/ha/coordinator.py's): then it stops accepting and closes its
clients.  Once the session is lost (or back: either way another
node may lead meanwhile), or another node holds the lock, or a backup
refuses it as stale, its node's run ends (the broker and its store closed,
the session closed) and the process (gateway/ha/process.py) starts a fresh
:class:`HaNode` after :data:`REJOIN_PAUSE_S`: a new session, the data folder
reopened as a follower, which joins as a backup (catch-up copies it again if
it holds records the new primary never had).

A primary whose store cannot write (gateway/tasks.py's commit) steps down:
receipts held, clients closed, lock and session released (gateway/ha/stepdown.py).
So does one cut off from its backups while ZooKeeper still sees enough of
them to elect one (gateway/ha/isolation.py); its fresh node stands aside.

kazoo's callbacks reach the Trio loop through ``TrioToken.run_sync_soon``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio

from gateway import app, startup
from gateway.admin import metrics
from gateway.admin.api import load_users
from gateway.admin.server import AdminSlots, serve_admin, serve_probes
from gateway.admin.standby import StandbyApi
from gateway.auth import Gatekeeper
from gateway.config import Config
from gateway.ha.coordinator import CoordinationError, Coordinator, LockUnreadable, StateCallbacks
from gateway.ha import election
from gateway.ha.election import NodeRecord, PrimaryRecord, Role
from gateway.ha.node import BACKUPS, Action, Event, State, step
from gateway.ha.backup import Backup
from gateway.ha import isolation, stepdown
from gateway.ha.primary_role import PrimaryRole, split_host_port
from gateway.ha.status import NodeStatus
from gateway.ha.window import Recent
from gateway.transports.server import Limits
from gateway.transports.tls import link_contexts
from persistence.replica import epochs
from persistence.replica.follower import Follower

EXIT_NO_ZOOKEEPER = 1  # at the first start only: a fresh node after a deposal keeps trying
# What a fenced or deposed primary's clients are told as it closes them: not a
# shutdown; the group goes on, with another primary (or this one, later).
DEPOSED = "this node is no longer the primary: reconnect to the group"
DEPOSED_FLUSH_S = 0.5  # for those ERROR frames to go out; then the connections are cut
# Between a deposed node's run and the next: the next one's first look at the
# lock comes after the old session's end has reached the others, and a node
# that keeps failing to rejoin (ZooKeeper away) tries at most this often.
REJOIN_PAUSE_S = 1.0
# A primary stepped down for a store that cannot write tells its clients so.
STORE_BROKEN = "this node's store cannot write; it stepped down: reconnect to the group"
POLL_S = 0.5  # looking at the lock between notices; also the record's update pace
LEADING = (State.PRIMARY, State.SUSPENDED)


class HaNode:
    """One node: its coordinator, its follower while a backup, the broker once primary."""

    def __init__(self, config: Config, log: Any, *, incarnation: int = 1, stand_aside_until: float | None = None) -> None:
        assert config.ha is not None
        self.config, self.ha = config, config.ha
        self.incarnation = incarnation  # this process's how-many-th node (a deposal starts the next)
        self.log = log.bind(node_id=self.ha.node_id)
        self.state = State.STARTING
        self.events: list[Event] = []
        self.changed = trio.Event()
        self.looking = trio.CancelScope()  # the look at the lock in flight
        self.lock: PrimaryRecord | None = None
        self.epoch = 0  # the epoch this node leads in
        self.published: NodeRecord | None = None
        self.vacancy: int | None = None  # the vacancy this node's LSN is final for (election.py)
        self.published_at = -POLL_S
        self.ended = False  # deposed (or not joined again): the process starts a fresh node
        self.stopping = False  # SIGINT or SIGTERM: the process ends once this run does
        self.following: str | None = None  # the advertise address followed
        self.backup_scope: trio.CancelScope | None = None
        self.backup_done: trio.Event | None = None
        self.backup: Backup | None = None  # the one following, while it does
        self.running: app.Running | None = None
        self.primary: PrimaryRole | None = None
        self.fence_timer = trio.CancelScope()  # the armed FENCE_DUE, while suspended
        self.failovers = 0
        self.sick: str | None = None  # why its store cannot write, once it failed as the primary
        self.isolated: str | None = None  # why it stepped down, cut off from its backups (gateway/ha/isolation.py)
        self.stand_aside_until = stand_aside_until  # (trio's clock) set by the process after such a step-down
        self.waiting_told: tuple[int, int] | None = None  # the shortfall last logged (ha_waiting_for_nodes)
        self.recent = Recent()  # the batches applied last (gateway/ha/window.py), kept across links
        # [ha] link_tls: the replication link's (server, client) TLS contexts, from [tls].
        self.link_tls = link_contexts(config.tls) if self.ha.link_tls else None
        # What each of the table's actions does (:meth:`act`): one method each.
        self.acts: dict[Action, Callable[[trio.Nursery], Awaitable[None]]] = {
            Action.FOLLOW: self.follow_holder, Action.STOP_FOLLOWING: self.stop_following,
            Action.PUBLISH_LSN: self.publish_lsn, Action.TRY_LEAD: self.try_lead, Action.PROMOTE: self.promote,
            Action.START_PRIMARY: self.start_primary, Action.REJOIN: self.rejoin,
            Action.HOLD_RECEIPTS: self.hold_receipts, Action.ARM_FENCE_TIMER: self.arm_fence_timer,
            Action.RELEASE_RECEIPTS: self.release_receipts, Action.STOP_ACCEPTING: self.stop_accepting,
            Action.RESTART_AS_BACKUP: self.restart_as_backup, Action.STEP_DOWN: self.step_down,
        }

    # -- news from kazoo and the stream, onto the loop -------------------------------

    def notice(self, event: Event | None = None) -> None:
        if event is not None:
            self.events.append(event)
            # An event is handled now, not after a look at the lock that may
            # wait a whole session timeout for a ZooKeeper that is away: a
            # primary's FENCE must hold its receipts at once, and its
            # FENCE_DUE stop its clients before its session can expire (the
            # look is made again next round).
            self.looking.cancel()
        self.changed.set()

    def refused(self, reason: str) -> None:
        self.notice(Event.REFUSED_STALE if "stale" in reason else Event.GAP)

    # -- the process -------------------------------------------------------------------

    async def run(self) -> int | None:
        """This node's run: an exit code if the process should end with it
        (0 after :meth:`stop`), None if a fresh node should rejoin (:attr:`ended`)."""
        token = trio.lowlevel.current_trio_token()
        callbacks = StateCallbacks(on_fence=partial(self.notice, Event.FENCE), on_lost=partial(self.notice, Event.LOST),
                                   on_reconnect=partial(self.notice, Event.RECONNECT))
        self.coordinator = Coordinator(self.ha.zookeeper, self.ha.node_id,
                                       session_timeout_s=self.ha.zookeeper_session_timeout_s, callbacks=callbacks,
                                       log=self.log, deliver=token.run_sync_soon,
                                       quorum=election.quorum(self.ha.replicas, self.ha.sync_replicas),
                                       auth=self.ha.zookeeper_auth)
        try:
            await trio.to_thread.run_sync(self.coordinator.connect)
        except CoordinationError as exc:
            if self.incarnation == 1:
                self.log.error("ha_start_failed", reason=f"{exc}: check [ha] zookeeper ({self.ha.zookeeper}) and that "
                                                         "the ensemble is up; the node exits (a supervisor restarts it)")
                return EXIT_NO_ZOOKEEPER
            # Rejoining: ZooKeeper may be what deposed it; keep trying.
            self.log.warning("ha_rejoin_failed", reason=str(exc))
            self.ended = True
            return None
        try:
            await trio.to_thread.run_sync(startup.prepare_data_dir, self.config, self.log)  # walks the folder: off the loop
            self.follower = Follower.in_data_dir(self.config.data_dir, self.config.store, self.log.info)
            await trio.to_thread.run_sync(self.follower.open)
            try:
                await trio.to_thread.run_sync(self.coordinator.join, self.record(Role.BACKUP))
            except CoordinationError as exc:
                # ZooKeeper blinked between connecting and joining: as a failed
                # connect, a fresh node tries again (the first start too, since
                # ZooKeeper did answer once).
                self.log.warning("ha_rejoin_failed", reason=str(exc))
                self.ended = True
                return None
            self.coordinator.watch(self.notice)
            if not self.stopping:
                await self.as_backup()
            if self.state == State.PRIMARY and not (self.stopping or self.ended):
                await self.as_primary()
        finally:
            with trio.CancelScope(shield=True):
                self.follower.close()  # (a no-op once promoted)
                await trio.to_thread.run_sync(self.coordinator.close)  # its session, and any lock, gone
        if self.sick is not None and not self.stopping:
            await stepdown.stand_down(self)
        return None if self.ended and not self.stopping else 0

    def stop(self) -> None:
        """SIGINT or SIGTERM: a primary's broker drains its clients; a backup
        stops at once.  Either way the run ends and so does the process."""
        self.stopping = True
        if self.running is not None:
            self.running.stop()
        self.notice()

    def record(self, role: Role) -> NodeRecord:
        f = self.follower
        if self.state == State.BACKUP_IN_SYNC:
            self.stand_aside_until = None  # caught up with a new primary: an ordinary backup
        if role is Role.BACKUP and f.copying:
            role = Role.SYNCING  # a folder being replaced by a snapshot may not lead
        elif role is Role.BACKUP and isolation.standing_aside(self.stand_aside_until, trio.current_time()):
            role = Role.STANDING_ASIDE
        # Following a primary with no link to it: said, so that a primary cut
        # off from its backups knows a live node could lead (isolation.py).
        unlinked = None
        if self.state in BACKUPS and self.lock is not None and not (self.backup and self.backup.connected):
            unlinked = self.lock.epoch
        return NodeRecord(self.ha.node_id, self.ha.advertise, epochs.epoch_of(f.history, f.last_lsn), f.last_lsn, role,
                          self.vacancy, unlinked)

    async def handle(self, event: Event, nursery: trio.Nursery) -> None:
        before = self.state
        self.state, actions = step(self.state, event)
        if self.state != before:
            self.log.info("ha_transition", on=event.value, state=self.state.value, before=before.value,
                          actions=[a.value for a in actions])
        for action in actions:
            try:
                await self.act(action, nursery)
            except CoordinationError as exc:
                # ZooKeeper did not answer: the next look at the lock (every
                # POLL_S) brings the event that retries it.
                self.log.warning("ha_action_failed", action=action.value, reason=str(exc))
                break

    async def act(self, action: Action, nursery: trio.Nursery) -> None:
        """Carry out one of the table's actions (gateway/ha/node.py) through
        :attr:`acts`; ``nursery`` holds what an action starts."""
        await self.acts[action](nursery)

    # -- the actions, one method each (:attr:`acts` maps them) ---------------------------

    async def follow_holder(self, nursery: trio.Nursery) -> None:
        assert self.lock is not None
        if self.following != self.lock.advertise or self.backup_done is None or self.backup_done.is_set():
            await self.stop_following()
            await nursery.start(self.follow, self.lock.advertise)

    async def publish_lsn(self, _nursery: trio.Nursery) -> None:
        if self.state == State.CANDIDATE:
            # Nobody leads and this node follows nobody (the table stopped
            # its following first): its LSN is final for the vacancy /epoch names.
            assert self.backup_scope is None
            self.vacancy = await trio.to_thread.run_sync(self.coordinator.epoch)
        record = self.record(Role.BACKUP)
        if record != self.published:
            await trio.to_thread.run_sync(self.coordinator.update, record)
            self.published, self.published_at = record, trio.current_time()

    async def try_lead(self, _nursery: trio.Nursery) -> None:
        epoch = await trio.to_thread.run_sync(self.coordinator.try_lead, self.record(Role.BACKUP))
        if epoch is not None:
            self.epoch = epoch
        self.tell_waiting()
        self.notice(Event.LEAD_TAKEN if epoch is not None else Event.LEAD_NOT_TAKEN)

    async def promote(self, _nursery: trio.Nursery) -> None:
        f = self.follower
        await trio.to_thread.run_sync(f.promote, self.epoch)  # the epoch saved, the index kept for the store's open (f.seed)
        self.history = f.history
        self.log.info("ha_promoted", epoch=self.epoch, lsn=f.last_lsn, index_handed_over=f.seed is not None)
        self.notice(Event.PROMOTED)

    async def start_primary(self, _nursery: trio.Nursery) -> None:
        """Nothing here: as_backup's loop ends on the PRIMARY state and
        :meth:`run` goes on to :meth:`as_primary`."""

    async def rejoin(self, _nursery: trio.Nursery) -> None:
        await trio.to_thread.run_sync(self.coordinator.join, self.record(Role.BACKUP))

    async def hold_receipts(self, _nursery: trio.Nursery) -> None:
        if self.primary is not None:
            self.primary.hold()

    async def arm_fence_timer(self, nursery: trio.Nursery) -> None:
        self.fence_timer.cancel()
        self.fence_timer = trio.CancelScope()
        nursery.start_soon(self.fence_when_due, self.fence_timer, self.coordinator.fence_deadline())

    async def release_receipts(self, _nursery: trio.Nursery) -> None:
        self.fence_timer.cancel()
        if self.primary is not None:
            self.primary.release()
        self.log.info("ha_resumed", detail="ZooKeeper connected again, same session: held receipts released")

    async def stop_accepting(self, _nursery: trio.Nursery) -> None:
        self.close_clients()

    async def restart_as_backup(self, _nursery: trio.Nursery) -> None:
        self.end_run()

    async def step_down(self, _nursery: trio.Nursery) -> None:
        if self.sick is not None:
            self.log.error("ha_stepped_down", epoch=self.epoch, reason=self.sick,
                           detail="the store cannot write: clients closed, receipts held, lock released so a "
                                  "backup leads; this node rejoins (as a backup) once its data folder takes a "
                                  "write again")
        else:
            self.log.error("ha_stepped_down", epoch=self.epoch, reason=self.isolated,
                           stand_aside_s=isolation.stand_aside_s(self.ha.zookeeper_session_timeout_s),
                           detail="cut off from its backups: clients closed, receipts held, lock released so a "
                                  "backup that ZooKeeper sees leads; this node rejoins as a backup and stands "
                                  "aside (may not lead) until it caught up with the new primary, or for "
                                  "stand_aside_s")
        self.ended = True
        await trio.to_thread.run_sync(self.coordinator.step_down)  # at once; closing the session at the run's end releases it too

    def store_failed(self, reason: str) -> None:
        """The committer's (through :class:`PrimaryRole`): a write failed, not for a full disk."""
        if self.sick is None:
            self.sick = reason
        self.notice(Event.STORE_FAILED)

    def cut_off(self, reason: str) -> None:
        """The primary role's isolation watch (:meth:`PrimaryRole.watch_isolation`):
        too few backups linked, enough others to lead."""
        self.isolated = reason
        self.notice(Event.ISOLATED)

    def waiting_for(self) -> tuple[int, int] | None:
        """(nodes seen, nodes needed) while this candidate cannot lead for too few nodes."""
        return self.coordinator.shortfall if self.state == State.CANDIDATE else None

    def tell_waiting(self) -> None:
        """Said once when a candidate starts waiting for nodes, and again when the count changes."""
        waiting = self.waiting_for()
        if waiting is not None and waiting != self.waiting_told:
            seen, needed = waiting
            self.log.warning("ha_waiting_for_nodes", nodes_seen=seen, nodes_needed=needed, replicas=self.ha.replicas,
                             sync_replicas=self.ha.sync_replicas,
                             detail=f"no primary, and an election needs {needed} node(s) that may lead "
                                    f"(replicas - sync_replicas) in ZooKeeper; this node sees {seen}: start the "
                                    "others (a node of a confirmed batch may be among the missing)")
        self.waiting_told = waiting

    async def fence_when_due(self, timer: trio.CancelScope, deadline: float) -> None:
        """FENCE_DUE at ``deadline`` (time.monotonic), unless disarmed or re-armed meanwhile."""
        with timer:
            self.log.warning("ha_suspended", detail="ZooKeeper connection lost: receipts held until it is back",
                             fence_in_s=round(max(0.0, deadline - time.monotonic()), 2))
            await trio.sleep(max(0.0, deadline - time.monotonic()))
            if timer is self.fence_timer:  # a stale timer never fences a later suspension
                self.notice(Event.FENCE_DUE)

    def end_run(self) -> None:
        self.log.error("ha_deposed", detail="no longer primary; this node's run ends and a fresh one rejoins as a backup",
                       epoch=self.epoch)
        self.ended = True
        self.close_clients()

    def close_clients(self) -> None:
        """Stop accepting and close every client, telling it why.  Receipts are
        held first, so the moment its ERROR frames take to go out (not a drain)
        releases none."""
        reason = STORE_BROKEN if self.sick is not None else DEPOSED
        if self.primary is not None:
            self.primary.hold()
            self.primary.withdraw(reason)
        if self.running is not None:
            self.running.server.stop(reason, grace_s=DEPOSED_FLUSH_S)

    async def follow(self, advertise: str, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        host, port = split_host_port(advertise)
        backup = Backup(self.follower, self.ha.node_id, host, port, on_refused=self.refused, log=self.log.info,
                        on_caught_up=partial(self.notice, Event.CAUGHT_UP), on_behind=partial(self.notice, Event.GAP),
                        recent=self.recent, secret=self.ha.cluster_secret, heartbeat_s=self.ha.link_heartbeat_s,
                        idle_timeout_s=self.ha.link_timeout_s, ssl_context=self.link_tls[1] if self.link_tls else None)
        done = trio.Event()
        self.following, self.backup_done, self.backup = advertise, done, backup
        with trio.CancelScope() as self.backup_scope:
            task_status.started()
            try:
                ended = await backup.run()
                self.log.warning("replication_following_ended", primary=advertise, reason=ended)
                self.notice(Event.FOLLOW_ENDED)
            finally:
                done.set()

    async def stop_following(self, _nursery: trio.Nursery | None = None) -> None:
        if self.backup_scope is not None and self.backup_done is not None:
            self.backup_scope.cancel()
            await self.backup_done.wait()
        self.backup_scope = self.backup_done = self.backup = None
        self.following = None

    async def look(self) -> None:
        """Who holds the lock, as an event (nothing when ZooKeeper cannot say)."""
        with trio.CancelScope() as self.looking:
            try:
                # Abandoned when cancelled: a read, its answer no longer wanted.
                lock = await trio.to_thread.run_sync(self.coordinator.primary, abandon_on_cancel=True)
            except LockUnreadable:
                # Someone holds the lock but its record does not parse (logged
                # once by the coordinator): no news; its holder rewrites it,
                # or its session ends and the lock with it.
                return
            except CoordinationError as exc:
                self.log.warning("ha_lock_unknown", reason=str(exc))
                return
        if self.looking.cancelled_caught:
            return
        # Queued, not noticed: serve_events handles it right after this look,
        # and a notice would wake its wait at once for another look, a busy
        # loop of reads (a following backup sees the primary at every look).
        if lock is None:
            self.events.append(Event.PRIMARY_GONE)
        elif lock.node_id != self.ha.node_id or (self.state in LEADING and lock.epoch != self.epoch):
            self.lock = lock
            self.events.append(Event.PRIMARY_SEEN)

    async def serve_events(self, nursery: trio.Nursery, until: Any) -> None:
        """Handle news until ``until()``; look at the lock at every notice and every POLL_S."""
        while not until():
            self.changed = trio.Event()
            if not self.events:  # news first (a FENCE at once); the look comes next round
                await self.look()
            while self.events and not until():
                await self.handle(self.events.pop(0), nursery)
            if until():
                return
            with trio.move_on_after(POLL_S):
                await self.changed.wait()
            # So an election sees what a backup holds; at most every POLL_S,
            # as every update wakes every node's watch.
            if (self.state in BACKUPS
                    and trio.current_time() >= self.published_at + POLL_S):
                try:
                    await self.act(Action.PUBLISH_LSN, nursery)
                except CoordinationError as exc:
                    # The connection dropped under the update (a ZooKeeper
                    # server restarted): tried again next round, as in handle.
                    self.log.warning("ha_action_failed", action=Action.PUBLISH_LSN.value, reason=str(exc))

    async def serve_standby(self, nursery: trio.Nursery, not_ready: Any) -> int:
        """A non-primary's admin port (and probe port): its port."""
        admin, group = self.config.admin, NodeStatus(self)
        status = StandbyApi(group, users=load_users(admin), metrics=lambda: metrics.render_standby(group.view()),
                            not_ready=not_ready, gate=Gatekeeper(self.config.auth),
                            limits=Limits(self.config.max_connections, self.config.max_connections_per_address, 10.0))
        port: int = await nursery.start(partial(serve_admin, status, admin, self.config.bind, self.config.admin_port,
                                                self.log, slots=AdminSlots(status, admin.max_connections,
                                                                           admin.max_connections_per_address),
                                                passwords=status.gate))
        if admin.probe_port >= 0:  # a backup's probes answer on the same port as a primary's
            await nursery.start(serve_probes, status, self.config.bind, admin.probe_port, self.log)
        return port

    async def as_backup(self) -> None:
        async with trio.open_nursery() as nursery:
            port = await self.serve_standby(nursery, lambda: self.state.value)
            self.log.info("ha_backup_started", admin_port=port, data_dir=self.config.data_dir)
            await self.serve_events(nursery, lambda: self.state == State.PRIMARY or self.ended or self.stopping)
            await self.stop_following()
            nursery.cancel_scope.cancel()  # the admin port, reopened by the broker

    async def as_primary(self) -> None:
        self.failovers += 1
        self.primary = role = PrimaryRole(self.ha, self.history, self.log, lambda _node, reason: self.refused(reason),
                                       NodeStatus(self), self.recent,
                                       ssl_context=self.link_tls[0] if self.link_tls else None,
                                       on_store_failed=self.store_failed)
        broker_done = trio.Event()

        async def broker(*, task_status: Any) -> None:
            try:
                await app.serve(self.config, self.log, handle_signals=False, primary=role, task_status=task_status,
                                seed=self.follower.seed)  # the promoted backup's index: nothing replayed twice
            finally:
                broker_done.set()

        async with trio.open_nursery() as nursery:
            self.running = await nursery.start(broker)
            nursery.start_soon(role.watch_isolation, self.coordinator.nodes, self.epoch,
                               election.quorum(self.ha.replicas, self.ha.sync_replicas), self.cut_off)
            if self.stopping:  # a signal while the broker was starting
                self.running.stop()
            await self.serve_events(nursery, lambda: self.ended or broker_done.is_set())
            await broker_done.wait()
            if self.state == State.FENCED and not (self.ended or self.stopping):
                # Fenced, its clients gone: whether the session comes back or
                # is lost, a fresh node is how it rejoins; bounded, as
                # ZooKeeper may stay away.
                with trio.move_on_after(self.ha.zookeeper_session_timeout_s):
                    await self.serve_events(nursery, lambda: self.ended or self.stopping)
                if not (self.ended or self.stopping):
                    await self.handle(Event.QUIET, nursery)
            nursery.cancel_scope.cancel()
