"""HA coordination against a real ZooKeeper: who leads, the epoch, takeovers, fencing.

Each node is a `Coordinator` without a broker; the election loop in
tests/support/ha_helpers.py plays the broker's part.  Nothing here measures speed:
the assertions are about who leads, which epoch, and the order of events.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import pytest
import structlog
from kazoo.client import KazooClient

from gateway.ha.coordinator import CoordinationError, Coordinator, StateCallbacks
from gateway.ha.election import NodeRecord, PrimaryRecord, Role
from tests.support.ha_helpers import ROOT, SESSION_TIMEOUT_S, WAIT_S, EventLog, Node, elect, holders
from tests.support.helpers import wait_for
from tests.support.processes import free_port
from tests.support.zookeeper_helpers import ZooKeeperServer


@pytest.fixture
def log() -> EventLog:
    return EventLog()


@pytest.fixture
def group(zookeeper: ZooKeeperServer, log: EventLog) -> Iterator[list[Node]]:
    """The test's nodes (append to it), closed in teardown."""
    nodes: list[Node] = []
    yield nodes
    zookeeper.thaw()  # a frozen server would hold up every close until its timeout
    for node in nodes:
        node.close()


@pytest.fixture
def admin(zookeeper: ZooKeeperServer) -> Iterator[KazooClient]:
    """A plain ZooKeeper client, as an operator (or a mistake) would write with."""
    # Its retry is bounded (at most ~30 s), for the reads after a restart or freeze.
    client = KazooClient(hosts=zookeeper.hosts, command_retry={"max_tries": 30, "delay": 0.1, "max_delay": 1.0})
    client.start(timeout=10)
    yield client
    client.stop()
    client.close()


def started(
    zookeeper: ZooKeeperServer, log: EventLog, group: list[Node], lsns: dict[str, int], **node: float
) -> list[Node]:
    for node_id, lsn in lsns.items():
        group.append(Node(zookeeper, node_id, log, lsn=lsn, **node).start())
    return group


def epoch_in_zookeeper(admin: KazooClient) -> int:
    # Retried (kazoo's own policy): after ZooKeeper was restarted or frozen,
    # this onlooker's request may meet its own session's expiry first.
    return int(admin.retry(admin.get, f"{ROOT}/epoch")[0])


def test_of_three_nodes_exactly_one_leads_and_it_is_the_candidate(zookeeper, log, group, admin) -> None:
    a, b, c = started(zookeeper, log, group, {"a": 10, "b": 30, "c": 20})
    assert epoch_in_zookeeper(admin) == 0

    leader = elect(group, log)

    assert leader is b and log.of("lead") == [("b", 1)]
    assert epoch_in_zookeeper(admin) == 1
    assert holders(group) == ["b"]
    assert a.coordinator.primary() == PrimaryRecord("b", 1, "b.test:7000")
    # Its record: the new epoch, and final for the vacancy it was elected in (epoch 0's).
    assert c.coordinator.nodes()["b"] == NodeRecord("b", "b.test:7000", 1, 30, Role.PRIMARY, vacancy=0)
    # The others keep losing: the lock is taken.
    assert a.try_lead() is None and c.try_lead() is None


def test_when_the_leader_closes_the_next_candidate_takes_the_next_epoch(zookeeper, log, group, admin) -> None:
    a, b, c = started(zookeeper, log, group, {"a": 30, "b": 20, "c": 25})
    assert elect(group, log) is a

    for expected, epoch in ((c, 2), (b, 3)):
        old = next(n for n in group if n.node_id in holders(group))
        old.close()
        assert elect(group, log) is expected
        assert epoch_in_zookeeper(admin) == epoch
        assert holders(group) == [expected.node_id]
        # The old holder had let go before the new one took the lock.
        assert log.index(old.node_id, "closed") < log.index(expected.node_id, "lead")

    assert log.of("lead") == [("a", 1), ("c", 2), ("b", 3)]
    # b (lsn 20) never led while c (lsn 25) lived, however often it tried.
    b_won = [epoch for who, epoch in log.of("tried") if who == "b" and epoch is not None]
    assert b_won == [3]


def test_when_the_leaders_session_expires_another_node_takes_over(zookeeper, log, group, admin) -> None:
    a, b, c = started(zookeeper, log, group, {"a": 30, "b": 20, "c": 25})
    assert elect(group, log) is a

    # The server ends a's session: a second connection takes the session over
    # (its id and password) and closes it, as kazoo's own tests do.
    thief = KazooClient(hosts=zookeeper.hosts, client_id=a.coordinator.client.client_id)
    thief.start(timeout=10)
    thief.stop()
    thief.close()
    log.wait("a", "lost")

    # A primary whose session is lost exits (the runtime): a takes no part until it comes back.
    assert elect([b, c], log) is c
    assert log.of("lead") == [("a", 1), ("c", 2)]
    assert epoch_in_zookeeper(admin) == 2
    # a comes back in a new session as a backup: it holds more (lsn 30) but of an
    # older epoch than c, and the lock is taken anyway.
    log.wait("a", "reconnect")
    assert a.try_lead() is None
    assert holders(group) == ["c"]
    assert set(c.coordinator.nodes()) == {"a", "b", "c"}
    assert c.coordinator.nodes()["a"].role is Role.BACKUP


def test_a_silent_zookeeper_fences_the_leader_before_its_session_can_expire(zookeeper, log, group, admin) -> None:
    """The fencing rule: on_fence (SUSPENDED) reaches the primary while ZooKeeper
    is frozen, i.e. before the server could expire its session or let anyone
    else take the lock."""
    a, b, c = started(zookeeper, log, group, {"a": 30, "b": 20, "c": 25})
    assert elect(group, log) is a
    # b and c follow a: they hold a's epoch, c the most of it.
    for node, lsn in ((b, 40), (c, 45)):
        node.record = dataclasses.replace(node.record, epoch=1, lsn=lsn)
        node.coordinator.update(node.record)

    zookeeper.freeze()
    frozen_at = time.monotonic()
    log.add("zookeeper", "frozen")
    log.wait("a", "fence", timeout=3 * SESSION_TIMEOUT_S)
    # Stay silent past the session timeout, so that the server, once it runs,
    # may expire every session it has not heard from.
    time.sleep(max(0.0, frozen_at + 1.5 * SESSION_TIMEOUT_S - time.monotonic()))
    log.add("zookeeper", "thawed")
    zookeeper.thaw()

    # Each node hears how its session fared: resumed, or lost and renewed.
    for node in group:
        log.wait(node.node_id, "reconnect")
    assert log.index("zookeeper", "frozen") < log.index("a", "fence") < log.index("zookeeper", "thawed")

    primary = admin.retry(admin.get, f"{ROOT}/primary")[0] if admin.retry(admin.exists, f"{ROOT}/primary") else None
    if primary is not None:
        # a kept its session (it reconnected before the server expired it):
        # still the primary of epoch 1, told to resume.
        assert PrimaryRecord.from_json(primary) == PrimaryRecord("a", 1, "a.test:7000")
        assert log.of("lead") == [("a", 1)]
    else:
        # a's session expired: a was told, and the next leader has the next epoch.
        log.wait("a", "lost")
        assert elect(group, log) is c
        assert log.of("lead") == [("a", 1), ("c", 2)]
        assert epoch_in_zookeeper(admin) == 2
        assert log.index("a", "fence") < log.index("a", "lost") < log.index("c", "lead")
    wait_for(lambda: len(holders(group)) == 1, timeout=WAIT_S, interval=0.02, what="one holder of the lock")


def test_the_fence_is_due_half_a_session_after_the_last_read_zookeeper_answered(zookeeper, log, group) -> None:
    """What a suspended primary's timer counts from: the send time of the last
    answered read, which a read ZooKeeper does not answer leaves where it was."""
    (a,) = started(zookeeper, log, group, {"a": 1})
    sent = time.monotonic()
    assert a.coordinator.primary() is None
    contact = a.coordinator.contact_at
    assert contact >= sent and a.coordinator.fence_deadline() == contact + SESSION_TIMEOUT_S / 2
    zookeeper.freeze()
    with pytest.raises(CoordinationError):
        a.coordinator.primary()  # unanswered: waits out its request timeout
    assert a.coordinator.contact_at == contact
    zookeeper.thaw()
    sent = time.monotonic()

    def answered_again() -> bool:
        try:
            a.coordinator.primary()
        except CoordinationError:
            return False  # reconnecting (its session kept, or a new one)
        return a.coordinator.contact_at >= sent

    wait_for(answered_again, timeout=WAIT_S, interval=0.1, what="a read answered again")


def test_a_node_behind_never_leads_while_a_node_ahead_lives(zookeeper, log, group) -> None:
    a, b, c = started(zookeeper, log, group, {"a": 5, "b": 9, "c": 7})
    # d holds the most but is still copying a snapshot: not eligible.
    d = Node(zookeeper, "d", log, lsn=100, epoch=9, role=Role.SYNCING).start()
    group.append(d)

    for expected in (b, c, a):
        assert elect(group, log) is expected
        expected.close()

    assert [who for who, _ in log.of("lead")] == ["b", "c", "a"]
    winners = [who for who, epoch in log.of("tried") if epoch is not None]
    assert winners == ["b", "c", "a"]
    assert d.try_lead() is None  # alone now, but still syncing


def test_the_most_advanced_backup_wins_even_when_it_settles_last(zookeeper, log, group, admin) -> None:
    """Records lag what a backup holds.  When the primary goes, a backup that
    decided on another's record before that record carried its final LSN could
    win while holding less (and lose receipted data).  Nobody may lead until
    every live node has published its final position for the vacancy."""
    p, a, b = started(zookeeper, log, group, {"p": 30, "a": 20, "b": 25})
    assert elect(group, log) is p
    # a and b follow p; their records say what they held at their last update...
    for node, lsn in ((a, 40), (b, 45)):
        node.record = dataclasses.replace(node.record, epoch=1, lsn=lsn)
        node.coordinator.update(node.record)
    # ...while by the time p goes, a holds more than b, and has not said so yet.
    a.record = dataclasses.replace(a.record, lsn=60)
    b.record = dataclasses.replace(b.record, lsn=50)
    p.close()

    # b settles at once and tries, round after round; a is late on purpose.
    for _ in range(5):
        assert b.try_lead() is None
    assert admin.retry(admin.exists, f"{ROOT}/primary") is None
    # a's record still says what it held for the previous vacancy (epoch 0's): stale, so not final.
    assert b.coordinator.nodes()["a"].vacancy == 0 and b.coordinator.nodes()["b"].vacancy == 1

    assert elect([a, b], log) is a
    assert log.of("lead") == [("p", 1), ("a", 2)]
    assert epoch_in_zookeeper(admin) == 2
    assert [who for who, epoch in log.of("tried") if epoch is not None] == ["p", "a"]
    assert b.coordinator.nodes()["a"] == NodeRecord("a", "a.test:7000", 2, 60, Role.PRIMARY, vacancy=1)


def test_a_node_that_never_settles_holds_the_election_only_while_its_session_lives(zookeeper, log, group,
                                                                                     admin) -> None:
    p, a, b = started(zookeeper, log, group, {"p": 30, "a": 20, "b": 25})
    assert elect(group, log) is p
    p.close()
    for _ in range(3):
        assert b.try_lead() is None  # a (say, hung) never publishes its final record
    a.close()  # its session ends, and its record with it
    assert elect([b], log) is b
    assert log.of("lead") == [("p", 1), ("b", 2)] and epoch_in_zookeeper(admin) == 2


def test_bad_records_in_nodes_are_ignored(zookeeper, log, group, admin) -> None:
    a, b = started(zookeeper, log, group, {"a": 1, "b": 2})
    ahead = b'{"node_id":"%s","advertise":"x:1","epoch":99,"lsn":99,"role":"%s"}'
    admin.create(f"{ROOT}/nodes/bogus", b"{not json")
    admin.create(f"{ROOT}/nodes/liar", ahead % (b"someone", b"backup"))  # not its own name
    admin.create(f"{ROOT}/nodes/king", ahead % (b"king", b"king"))  # no such role
    admin.create(f"{ROOT}/nodes/huge", b" " * 2000 + ahead % (b"huge", b"backup"))  # over the size bound
    admin.create(f"{ROOT}/nodes/fine", ahead % (b"fine", b"syncing"))  # valid, just not eligible

    assert set(a.coordinator.nodes()) == {"a", "b", "fine"}
    assert elect(group, log) is b
    assert epoch_in_zookeeper(admin) == 1


def test_watch_reports_every_change_of_the_group_and_the_lock(zookeeper, log, group) -> None:
    a, b = started(zookeeper, log, group, {"a": 1, "b": 2})
    a.coordinator.watch(a.count_change)
    assert a.changes >= 1  # once at once

    def after(action) -> None:
        before = a.changes
        action()
        wait_for(lambda: a.changes > before, timeout=WAIT_S, interval=0.02, what="a change reported")

    after(lambda: b.coordinator.update(NodeRecord("b", "b.test:7000", 0, 3, Role.BACKUP)))  # a record
    after(lambda: group.append(Node(zookeeper, "c", log, lsn=0).start()))  # a new node
    after(lambda: elect(group, log))  # the lock taken
    after(lambda: b.close())  # the lock and a record gone
    assert a.coordinator.primary() is None


def test_a_leader_that_steps_down_releases_the_lock_for_the_next_epoch(zookeeper, log, group, admin) -> None:
    a, b = started(zookeeper, log, group, {"a": 2, "b": 1})
    assert elect(group, log) is a
    assert b.coordinator.step_down() is False  # not b's to give
    assert a.coordinator.step_down() is True
    assert holders(group) == [] and a.coordinator.primary() is None
    assert elect(group, log) is a  # still the candidate: it holds the most
    assert log.of("lead") == [("a", 1), ("a", 2)] and epoch_in_zookeeper(admin) == 2


def test_a_zookeeper_restart_fences_the_leader_and_leaves_one_primary(zookeeper, log, group, admin) -> None:
    """ZooKeeper keeps sessions in its data folder, so a leader may resume in
    the same session after a restart; whether it does is a race inside
    ZooKeeper (the restart's length against the session timeout; it lost the
    race on a busy machine).  What a broker relies on holds either way: the
    leader is fenced first, and afterwards exactly one node holds the lock,
    the same one in the same epoch, or the next one in the next epoch after
    the old one was told its session is gone."""
    a, b = started(zookeeper, log, group, {"a": 2, "b": 1})
    assert elect(group, log) is a

    zookeeper.restart()
    log.wait("a", "reconnect")
    assert log.index("a", "fence") < log.index("a", "reconnect")

    if "lost" not in [what for who, what, _ in log.items if who == "a"]:
        assert holders(group) == ["a"] and epoch_in_zookeeper(admin) == 1
    else:
        leader = elect(group, log)
        assert epoch_in_zookeeper(admin) == 2
        assert log.index("a", "lost") < log.index(leader.node_id, "lead", 2)
    wait_for(lambda: len(holders(group)) == 1, timeout=WAIT_S, interval=0.02, what="one holder of the lock")


def test_no_zookeeper_is_a_coordination_error_not_a_hang(tmp_path) -> None:
    """Nothing listens on the port: connect gives up after its request timeout."""
    callbacks = StateCallbacks(on_fence=lambda: None, on_lost=lambda: None, on_reconnect=lambda: None)
    coordinator = Coordinator(f"127.0.0.1:{free_port()}/gateway", "a", session_timeout_s=3.0, callbacks=callbacks,
                              log=structlog.get_logger("test"), request_timeout_s=0.5)
    with pytest.raises(CoordinationError, match="cannot coordinate"):
        coordinator.connect()
