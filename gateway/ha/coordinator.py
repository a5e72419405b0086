"""HA coordination on ZooKeeper, through kazoo.

A synchronous API for one node: join the group, keep its record current,
watch the group and the lock, try to lead, step down.  Every call waits at
most ``request_timeout_s`` for ZooKeeper; a Trio program calls these through
``trio.to_thread.run_sync``.

kazoo runs its own threads (the connection and the callback worker).  What
they report reaches the caller only through ``deliver(callback)``, a callable
the caller gives: ``TrioToken.run_sync_soon`` hands each callback to the Trio
loop.  ``deliver`` must not block: connection-state callbacks are made from
kazoo's connection thread, which would otherwise stop answering pings.

ZooKeeper layout, under the connect string's chroot (``zk-0:2181/gateway``):

- ``/nodes/<node_id>``  EPHEMERAL, a `NodeRecord` as JSON: who is alive and what it holds.
- ``/epoch``            PERSISTENT, the decimal epoch: the fencing token, only ever
                        bumped by compare-and-set on its znode version.
- ``/primary``          EPHEMERAL, a `PrimaryRecord` as JSON: the lock.  Whoever
                        created it, while its session lives, is the primary.

With the group's ``user:password`` (digest auth) every znode it creates is the
group's alone (no READ for world either: addresses and positions are the
group's business); a tree made open earlier is closed at connect.  What is
read back is checked: gateway/ha/election.py, "Validation".

Fencing timing (T: the session timeout).  The server expires a session no
earlier than T after the last request of it that it received (rounded up to
a tick; an ensemble's leader hears of a follower's touches at most half a
tick late, and ZooKeeper allows T only from 2 ticks, so that is <= T/4).  A
request sent at time s and answered was received after s, so the session
lives until at least s + T - T/4 by any server's clock.  :attr:`contact_at`
is the latest such s (the monotonic time before sending a read that was
answered: the primary looks at the lock every half second).

kazoo's SUSPENDED says only that the connection dropped: a server of the
ensemble stopped (the socket closes: at once, and kazoo reconnects to another
within milliseconds with the same session), or pings went unanswered.  kazoo
sends a ping after T/3 (less up to 0.4 s of jitter) without sending anything
and drops the connection when it stays unanswered for about another T/3;
but every request counts as a ping, so a request sent into a connection that
died silently postpones the ping: SUSPENDED comes about 2/3 T after the last
*send*, which may be later than 2/3 T after the last answer.  So the fence is
timed from :attr:`contact_at`, not from SUSPENDED: a suspended primary holds
its receipts and fences at ``contact_at + FENCE_AFTER * T`` (T/2) unless it
is connected again before (:meth:`fence_deadline`).  That leaves at least T/4
before the earliest expiry (T/2 less a leader's late touch, <= T/4) for the
Trio loop's scheduling delay and the clocks' rates (both monotonic; parts per
million); with the default T of 10 s a primary rides out a disconnection of
about 4.5 s (its last answer is at most half a second old when the socket
closes) and, when pings went unanswered for 2/3 T, fences at once.  A
SUSPENDED that comes later than that, or a process that is itself paused,
cannot fence in time; the epoch every replicated batch carries, the settled
election and its quorum cover that (the README's fencing paragraph).  T must
lie within the servers' [minSessionTimeout, maxSessionTimeout] (2 to 20
ticks by default), or the server negotiates another one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NoAuthError, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType, WatchedEvent
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.security import ACL, make_digest_acl

from gateway.ha import election
from gateway.ha.election import NodeRecord, PrimaryRecord, RecordError, Role

Callback = Callable[[], object]
MAX_NODES = 100  # records read from /nodes; a group this large is a mistake, not a cluster
# Reconnect promptly (0.1 s, doubling to 1 s) for as long as it takes: while
# the session may still live, every attempt is a chance to keep it.
CONNECTION_RETRY = {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0}
FENCE_AFTER = 0.5  # of T, after the last answered request: when a suspended primary fences (docstring)


class CoordinationError(Exception):
    """ZooKeeper could not be reached or refused a request; the message says which."""


class LockUnreadable(CoordinationError):
    """/primary exists (someone holds the lock) but its record does not parse: follow nobody, take nothing."""


def call_now(callback: Callback) -> None:
    """The plainest ``deliver``: run the callback on kazoo's thread (tests)."""
    callback()


def split_connect(connect: str) -> tuple[str, str]:
    """``"h1:2181,h2:2181/gateway"`` -> ``("h1:2181,h2:2181", "/gateway")`` (root ``""``)."""
    hosts, sep, chroot = connect.partition("/")
    root = ("/" + chroot).rstrip("/") if sep else ""
    if not hosts or "//" in root:
        raise CoordinationError(f"bad ZooKeeper connect string: {connect!r}")
    return hosts, root


@dataclasses.dataclass(frozen=True)
class StateCallbacks:
    """What the caller is told about its ZooKeeper session, through ``deliver``."""

    on_fence: Callback  # SUSPENDED: the connection dropped, the session may live; hold receipts, fence when due
    on_lost: Callback  # LOST: the session expired; the lock and /nodes record are gone
    on_reconnect: Callback  # CONNECTED again (after on_fence, or a new session after on_lost: join again)


class Coordinator:
    """One node's view of the HA group in ZooKeeper."""

    def __init__(self, connect: str, node_id: str, *, session_timeout_s: float, callbacks: StateCallbacks,
                 log: Any, deliver: Callable[[Callback], object] = call_now,
                 request_timeout_s: float | None = None, quorum: int = 1, auth: str = "") -> None:
        hosts, root = split_connect(connect)
        self.quorum = quorum  # final records an election needs (election.quorum)
        self.node_id = election.check_node_id(node_id)
        self.nodes_path = f"{root}/nodes"
        self.node_path = f"{root}/nodes/{node_id}"
        self.epoch_path = f"{root}/epoch"
        self.primary_path = f"{root}/primary"
        self.root = root or "/"
        self.chroot = root  # "" without one: then ZooKeeper's own root, which is not the group's to close
        self.session_timeout_s = session_timeout_s
        # A reply later than a session timeout is moot: the session may be gone.
        self.request_timeout_s = session_timeout_s if request_timeout_s is None else request_timeout_s
        self.callbacks = callbacks
        self.log = log.bind(node_id=node_id)
        self.deliver = deliver
        self.closing = False
        self.interrupted = False  # SUSPENDED or LOST seen since the last CONNECTED
        self.on_change: Callback | None = None
        self.lock_record: PrimaryRecord | None = None  # what this node wrote into /primary, while it may hold it
        self.shortfall: tuple[int, int] | None = None  # at the last try_lead: (nodes seen, needed), if too few
        self.refused = election.Refusals(MAX_NODES + 2)  # a corrupt record is read at every look: logged once
        # Monotonic time before sending the last request ZooKeeper answered
        # (written from worker threads; a lost race only makes it older: safe).
        self.contact_at = time.monotonic()
        # No kazoo chroot: it wants the chroot to exist before connecting (and
        # warns otherwise); our paths carry the root instead.
        user, _, password = auth.partition(":")  # "user:password", checked with the configuration
        self.acl: list[ACL] | None = [make_digest_acl(user, password, all=True)] if auth else None
        access = {"auth_data": [("digest", auth)], "default_acl": self.acl} if auth else {}
        self.client = KazooClient(hosts=hosts, timeout=session_timeout_s, connection_retry=CONNECTION_RETRY, **access)
        self.client.add_listener(self.state_changed)

    # -- session -----------------------------------------------------------------

    def connect(self) -> None:
        """Open the session (bounded by the request timeout) and make sure the layout exists."""
        try:
            self.client.start(timeout=self.request_timeout_s)
            sent = time.monotonic()
            self.wait(self.client.ensure_path_async(self.nodes_path), "ensure_path")
            self.answered(sent)
            try:
                self.wait(self.client.create_async(self.epoch_path, election.format_epoch(0)), "create epoch")
            except NodeExistsError:
                pass
            if self.acl is not None:
                self.close_tree()
        except (KazooTimeoutError, KazooException, CoordinationError) as exc:
            self.client.stop()
            self.client.close()
            hint = ": check [ha] zookeeper_auth_file or GATEWAY_ZOOKEEPER_AUTH" if isinstance(exc, NoAuthError) else ""
            raise CoordinationError(f"cannot coordinate on ZooKeeper: {exc!r}{hint}") from exc
        self.log.info("zookeeper_connected", session_timeout_s=self.session_timeout_s, root=self.root)

    def close_tree(self) -> None:
        """The group's ACL on its znodes where they carry another (made open by a node without credentials)."""
        children = self.wait(self.client.get_children_async(self.nodes_path), "acls")[:MAX_NODES]
        paths = [*([self.chroot] if self.chroot else []), self.nodes_path, self.epoch_path, self.primary_path,
                 *(f"{self.nodes_path}/{name}" for name in children)]
        closed = []
        for path in paths:
            try:  # NoNodeError: an ephemeral gone meanwhile, or no lock held
                acl, stat = self.wait(self.client.get_acls_async(path), "acls")
                if list(acl) != self.acl:
                    self.wait(self.client.set_acls_async(path, self.acl, stat.aversion), "acls")
                    closed.append(path)
            except NoNodeError:
                pass
        if closed:
            self.log.warning("zookeeper_acls_set", paths=closed,
                             detail="these znodes were open to anyone; now only the group's identity may use them")

    def close(self) -> None:
        """End the session: ZooKeeper removes this node's record and, if held, the lock at once."""
        self.closing = True  # our own stop is no news to report
        self.client.remove_listener(self.state_changed)
        self.client.stop()
        self.client.close()
        self.log.info("zookeeper_closed")

    def connected(self) -> bool:
        """Is the session connected now?  (If not, a read would only wait out its timeout.)"""
        return bool(self.client.connected)

    def fence_deadline(self) -> float:
        """The monotonic time by which a suspended primary must have fenced itself (module docstring)."""
        return self.contact_at + FENCE_AFTER * self.session_timeout_s

    def answered(self, sent: float) -> None:
        self.contact_at = max(self.contact_at, sent)

    def session_id(self) -> int | None:
        client_id = self.client.client_id
        return None if client_id is None else client_id[0]

    def state_changed(self, state: str) -> None:
        """kazoo's connection thread: hand the news to the caller, never block."""
        if self.closing:
            return
        if state == KazooState.SUSPENDED:
            self.interrupted = True
            self.log.warning("zookeeper_suspended")
            self.deliver(self.callbacks.on_fence)
        elif state == KazooState.LOST:
            self.interrupted = True
            self.log.warning("zookeeper_session_lost")
            self.deliver(self.callbacks.on_lost)
        elif state == KazooState.CONNECTED and self.interrupted:
            self.interrupted = False
            self.log.info("zookeeper_reconnected", session_id=self.session_id())
            self.deliver(self.callbacks.on_reconnect)

    def wait(self, result: Any, what: str) -> Any:
        """The value of a kazoo async call, waiting at most the request timeout."""
        try:
            return result.get(timeout=self.request_timeout_s)
        except KazooTimeoutError:
            raise CoordinationError(f"{what}: no answer from ZooKeeper within {self.request_timeout_s} s") from None

    # -- the node's own record ---------------------------------------------------

    def join(self, record: NodeRecord) -> None:
        """Create this node's ephemeral record (again, after a lost session).

        A record left by an earlier life of this node (a session not yet
        expired) is replaced: node ids are unique, so it can only be ours.
        """
        self.check_own(record)
        try:
            try:
                self.wait(self.client.create_async(self.node_path, record.to_json(), ephemeral=True), "join")
            except NodeExistsError:
                self.replace_record(record)
        except KazooException as exc:
            raise CoordinationError(f"join: {exc!r}") from exc
        self.log.info("node_joined", epoch=record.epoch, lsn=record.lsn, role=record.role.value)

    def replace_record(self, record: NodeRecord) -> None:
        _data, stat = self.wait(self.client.get_async(self.node_path), "join")
        if stat.ephemeralOwner == self.session_id():
            self.wait(self.client.set_async(self.node_path, record.to_json(), stat.version), "join")
            return
        self.log.warning("node_record_replaced", old_session=stat.ephemeralOwner)
        self.wait(self.client.delete_async(self.node_path, stat.version), "join")
        self.wait(self.client.create_async(self.node_path, record.to_json(), ephemeral=True), "join")

    def update(self, record: NodeRecord) -> None:
        """Rewrite this node's record (created if it is missing)."""
        self.check_own(record)
        try:
            self.wait(self.client.set_async(self.node_path, record.to_json()), "update")
        except NoNodeError:
            self.join(record)
        except KazooException as exc:
            raise CoordinationError(f"update: {exc!r}") from exc

    def check_own(self, record: NodeRecord) -> None:
        if record.node_id != self.node_id:
            raise ValueError(f"record of {record.node_id!r} given to the coordinator of {self.node_id!r}")

    # -- reading the group ---------------------------------------------------------

    def nodes(self) -> dict[str, NodeRecord]:
        """The valid records in /nodes, by node id; a malformed one is logged and ignored."""
        return {node_id: record for node_id, (record, _version) in self.read_nodes().items()}

    def read_nodes(self) -> dict[str, tuple[NodeRecord, int]]:
        try:
            children = sorted(self.wait(self.client.get_children_async(self.nodes_path), "nodes"))
            if len(children) > MAX_NODES:
                self.log.error("too_many_node_records", count=len(children), read=MAX_NODES)
                children = children[:MAX_NODES]
            # All requests out at once, then the answers: one round trip, not one per node.
            pending = [(name, self.client.get_async(f"{self.nodes_path}/{name}")) for name in children]
            found: dict[str, tuple[NodeRecord, int]] = {}
            for name, result in pending:
                try:
                    data, stat = self.wait(result, "nodes")
                except NoNodeError:
                    continue  # gone between the listing and the read
                record = self.parse_node(name, data)
                if record is not None:
                    found[name] = (record, stat.version)
            return found
        except KazooException as exc:
            raise CoordinationError(f"nodes: {exc!r}") from exc

    def parse_node(self, name: str, data: bytes) -> NodeRecord | None:
        path = f"{self.nodes_path}/{name}"
        try:
            record = NodeRecord.from_json(data)
        except RecordError as exc:
            self.refuse("node_record_ignored", path, str(exc))
            return None
        if record.node_id != name:
            self.refuse("node_record_ignored", path, f"says it is {record.node_id!r}")
            return None
        self.refuse("node_record_ignored", path, None)
        return record

    def refuse(self, event: str, path: str, reason: str | None) -> None:
        """A record read: refused for ``reason`` (logged once, not at every look), or taken (None)."""
        if reason is None:
            self.refused.clear(path)
        elif self.refused.first(path, reason):
            self.log.warning(event, znode=path, reason=reason)

    def read_epoch(self, what: str) -> tuple[int, Any]:
        """The current epoch (election.current_epoch) and /epoch's stat."""
        data, stat = self.wait(self.client.get_async(self.epoch_path), what)
        epoch, reason = election.current_epoch(data, stat.version)
        self.refuse("epoch_record_ignored", self.epoch_path, reason and f"{reason}; taken as its version {stat.version}")
        return epoch, stat

    def primary(self) -> PrimaryRecord | None:
        """Who holds the lock, or None when nobody does (LockUnreadable: somebody, unreadably)."""
        sent = time.monotonic()
        try:
            data, stat = self.wait(self.client.get_async(self.primary_path), "primary")
            self.answered(sent)
            try:
                record: PrimaryRecord | None = PrimaryRecord.from_json(data)
            except RecordError as exc:
                self.refuse("primary_record_ignored", self.primary_path, str(exc))
                record = None
            mine = self.lock_record
            if mine is not None and record != mine and stat.ephemeralOwner == self.session_id():
                # Ours (this session owns the znode, whatever its text says): write it again.
                self.wait(self.client.set_async(self.primary_path, mine.to_json(), stat.version), "primary")
                self.log.warning("primary_record_rewritten", znode=self.primary_path, epoch=mine.epoch, found=repr(record))
                record = mine
        except NoNodeError:  # nobody holds it
            self.answered(sent)
            return None
        except KazooException as exc:
            raise CoordinationError(f"primary: {exc!r}") from exc
        if record is None:
            raise LockUnreadable("primary: the lock is held but its record does not parse")
        self.refuse("primary_record_ignored", self.primary_path, None)
        return record

    def epoch(self) -> int:
        """The current epoch in /epoch: while nobody leads, the vacancy to settle."""
        try:
            return self.read_epoch("epoch")[0]
        except (KazooException, RecordError) as exc:
            raise CoordinationError(f"epoch: {exc!r}") from exc

    def watch(self, on_change: Callback) -> None:
        """Call ``on_change`` (through ``deliver``) whenever /primary, the set of
        /nodes or any node's record changes, and once now.  It says only that
        something changed: the caller reads what it needs (a level, not an edge,
        so a coalesced or repeated call is harmless).  Kept across reconnects."""
        assert self.on_change is None, "one watcher per coordinator"
        self.on_change = on_change
        # kazoo's recipes re-read (and call us again) after a reconnect or a new session.
        DataWatch(self.client, self.primary_path, func=self.primary_changed)
        ChildrenWatch(self.client, self.nodes_path, func=self.children_changed)

    def primary_changed(self, _data: bytes | None, _stat: Any) -> None:
        self.notify()

    def children_changed(self, children: list[str]) -> None:
        for name in children[:MAX_NODES]:
            self.arm(f"{self.nodes_path}/{name}")
        self.notify()

    def record_changed(self, event: WatchedEvent) -> None:
        if event.type == EventType.CHANGED:
            self.arm(event.path)  # watches are one-shot
        else:
            self.notify()

    def arm(self, path: str) -> None:
        """A data watch on one record.  kazoo keeps one per path and function, so
        arming it again costs a read, no more.  A change that slips in before the
        watch is in place would go unseen: the notice once it is armed covers it."""
        self.client.get_async(path, watch=self.record_changed).rawlink(lambda _result: self.notify())

    def notify(self) -> None:
        if self.on_change is not None and not self.closing:
            self.deliver(self.on_change)

    # -- leading -------------------------------------------------------------------

    def try_lead(self, record: NodeRecord) -> int | None:
        """Take the lock if nobody holds it and this node is the candidate, decided
        (election.decide) once every eligible record is final for the vacancy.

        In one ZooKeeper transaction: every record the decision was made on is
        unchanged (version checks), this node's record takes the new epoch,
        /primary is created, /epoch moves from n to n + 1 (compare-and-set).
        All of it happens or none, so there is no half-taken lock to give back.
        Returns the new epoch, or None (someone leads, another node is the
        candidate, or the transaction lost a race).
        """
        self.check_own(record)
        if self.closing or self.client.state != KazooState.CONNECTED:
            return None
        try:
            if self.wait(self.client.exists_async(self.primary_path), "try_lead") is not None:
                return None
            read = self.read_nodes()
            if self.node_id not in read:  # missing, or written over: write it again for the next round
                self.log.warning("lead_refused", reason="own record missing or unreadable: written again")
                self.join(record)
                return None
            _, my_version = read[self.node_id]
            records = [r for node_id, (r, _v) in read.items() if node_id != self.node_id] + [record]
            vacancy, epoch_stat = self.read_epoch("try_lead")
            self.shortfall = election.shortfall(records, self.quorum)
            # Decided only on settled records, each final for this vacancy, and enough of them.
            if election.decide(records, vacancy, self.quorum) != self.node_id:
                return None
            epoch = election.takeover_epoch(vacancy)
        except (KazooException, RecordError, CoordinationError) as exc:
            self.log.warning("lead_refused", reason=repr(exc))
            return None
        leading = dataclasses.replace(record, epoch=epoch, role=Role.PRIMARY)
        lock = PrimaryRecord(node_id=self.node_id, epoch=epoch, advertise=record.advertise)
        transaction = self.client.transaction()
        for node_id, (_r, version) in read.items():
            if node_id != self.node_id:
                transaction.check(f"{self.nodes_path}/{node_id}", version)
        transaction.set_data(self.node_path, leading.to_json(), my_version)
        transaction.create(self.primary_path, lock.to_json(), ephemeral=True)
        transaction.set_data(self.epoch_path, election.format_epoch(epoch), epoch_stat.version)
        pending = transaction.commit_async()
        try:
            results = pending.get(timeout=self.request_timeout_s)
        except KazooTimeoutError:
            # Unanswered: it may still commit once the connection is back.
            # Should it, give the lock up then: the caller was told "not leading".
            pending.rawlink(self.release_late_lock)
            self.log.warning("lead_abandoned", epoch=epoch, reason="no answer")
            return None
        except KazooException as exc:
            self.log.warning("lead_abandoned", epoch=epoch, reason=repr(exc))
            return None
        failures = [repr(r) for r in results if isinstance(r, Exception)]
        if failures:
            self.log.info("lead_lost_race", epoch=epoch, results=failures)
            return None
        self.lock_record = lock
        self.log.info("lead_taken", epoch=epoch, lsn=record.lsn)
        return epoch

    def release_late_lock(self, result: Any) -> None:
        """A transaction answered after try_lead gave up on it: if it took the lock, release it.
        (kazoo's callback thread: blocking calls are allowed there, bounded as everywhere.)"""
        if not result.successful() or any(isinstance(r, Exception) for r in result.get()):
            return
        self.log.warning("late_lock_released")
        try:
            self.step_down()
        except CoordinationError as exc:
            self.log.error("late_lock_release_failed", reason=str(exc))

    def holds_lock(self) -> bool:
        """Does this node's live session own /primary?"""
        try:
            stat = self.wait(self.client.exists_async(self.primary_path), "holds_lock")
        except KazooException as exc:
            raise CoordinationError(f"holds_lock: {exc!r}") from exc
        return stat is not None and stat.ephemeralOwner == self.session_id()

    def step_down(self) -> bool:
        """Release /primary if this node's session holds it; True if it did."""
        try:
            stat = self.wait(self.client.exists_async(self.primary_path), "step_down")
            if stat is None or stat.ephemeralOwner != self.session_id():
                return False
            self.wait(self.client.delete_async(self.primary_path, stat.version), "step_down")
        except NoNodeError:
            return False
        except KazooException as exc:
            raise CoordinationError(f"step_down: {exc!r}") from exc
        self.log.info("stepped_down")
        return True
