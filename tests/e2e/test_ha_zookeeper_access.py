"""The group's znodes against a stranger, and records that do not parse.

Through the door an attacker uses: a plain kazoo client of its own against the
real ZooKeeper the group coordinates on.  With credentials ([ha]
zookeeper_auth_file) the group's znodes are its alone: a stranger can neither
read nor write /primary or /epoch, nor create the lock or a member record,
and the group goes on serving.  A record that does not parse (written with the
group's own identity: a corrupt record, not an attack) is logged once and
does not stop the group: the primary writes its lock's record again, and an
/epoch that is not a number does not stop the next takeover.  Without
credentials a node says once, loudly, that its znodes are open; a tree an
older (open) node made is closed by the first node with credentials.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import make_digest_acl

from gateway.ha import election
from gateway.ha.coordinator import CoordinationError
from gateway.ha.election import PrimaryRecord
from tests.support.ha_helpers import ROOT, EventLog, elect
from tests.support.ha_helpers import Node as Coordinated
from tests.support.ha_nodes import WAIT_S, Node, wait_ready, wait_role
from tests.support.helpers import RawClient
from tests.support.processes import HOST
from tests.support.zookeeper_helpers import ZooKeeperServer

AUTH = "gateway:zk-secret-1"
USER, PASSWORD = AUTH.split(":", 1)


def client(zookeeper: ZooKeeperServer, auth: str | None = None) -> KazooClient:
    kazoo = KazooClient(hosts=zookeeper.hosts, auth_data=[("digest", auth)] if auth else None)
    kazoo.start(timeout=10)
    return kazoo


@pytest.fixture
def stranger(zookeeper: ZooKeeperServer) -> Iterator[KazooClient]:
    """Anyone who reaches ZooKeeper's client port, without the group's credentials."""
    kazoo = client(zookeeper)
    yield kazoo
    kazoo.stop()
    kazoo.close()


@pytest.fixture
def insider(zookeeper: ZooKeeperServer) -> Iterator[KazooClient]:
    """A client with the group's identity: how a corrupt record is simulated."""
    kazoo = client(zookeeper, AUTH)
    yield kazoo
    kazoo.stop()
    kazoo.close()


def receipted(node: Node, name: str) -> None:
    producer = RawClient((HOST, node.stomp_port), timeout=30)
    producer.connect()
    producer.send_frame("SEND", {"destination": "/queue/zk", "persistent": "true", "receipt": name}, name.encode())
    producer.receipt(name, timeout=30)
    producer.close()


def log_count(node: Node, event: str) -> int:
    return node.log_path.read_text(errors="replace").count(event)


def wait_logged(node: Node, event: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while log_count(node, event) == 0:
        assert time.monotonic() < deadline, f"{node.node_id} never logged {event}\n" + node.log_tail()
        assert node.alive(), node.log_tail()
        time.sleep(0.1)


def pair_in_sync(tmp_path: Path, zookeeper: ZooKeeperServer) -> tuple[list[Node], Node, Node]:
    """Two nodes with the group's credentials, one leading and the other in
    sync (both killed if they never get there): the nodes, the primary, the backup."""
    nodes = [Node(tmp_path, name, zookeeper, replicas=2, zookeeper_auth=AUTH).start() for name in ("gw-0", "gw-1")]
    try:
        primary = wait_ready(nodes)
        backup = next(n for n in nodes if n is not primary)
        wait_role(backup, "backup_in_sync")
    except BaseException:
        for node in nodes:
            node.kill()
        raise
    return nodes, primary, backup


def test_a_stranger_can_neither_read_nor_write_the_group_s_znodes(tmp_path: Path, zookeeper: ZooKeeperServer,
                                                                  stranger: KazooClient, insider: KazooClient) -> None:
    nodes, primary, backup = pair_in_sync(tmp_path, zookeeper)
    try:
        receipted(primary, "before")
        lock_before = insider.get(f"{ROOT}/primary")[0]
        epoch_before = insider.get(f"{ROOT}/epoch")

        for path in (ROOT, f"{ROOT}/primary", f"{ROOT}/epoch", f"{ROOT}/nodes", f"{ROOT}/nodes/{primary.node_id}"):
            with pytest.raises(NoAuthError):
                stranger.get(path)
        # The attacks of issue 30: rewrite the lock's address, write garbage into /epoch.
        with pytest.raises(NoAuthError):
            stranger.set(f"{ROOT}/primary", PrimaryRecord("evil", 99, "127.0.0.1:1").to_json())
        with pytest.raises(NoAuthError):
            stranger.set(f"{ROOT}/epoch", b"garbage")
        with pytest.raises(NoAuthError):
            stranger.delete(f"{ROOT}/primary")
        with pytest.raises(NoAuthError):
            stranger.create(f"{ROOT}/nodes/evil", b"{}", ephemeral=True)
        with pytest.raises(NoAuthError):
            stranger.set_acls(f"{ROOT}/epoch", [make_digest_acl("evil", "evil", all=True)])
        # Squatting the lock: created by nobody else while it is free.
        primary.kill()
        backup_leads = wait_ready([backup])
        assert backup_leads is backup
        backup.kill()  # nobody holds the lock now
        deadline = time.monotonic() + WAIT_S
        while insider.exists(f"{ROOT}/primary") is not None:
            assert time.monotonic() < deadline, "the lock outlived its holder's session"
            time.sleep(0.1)
        with pytest.raises(NoAuthError):
            stranger.create(f"{ROOT}/primary", PrimaryRecord("evil", 99, "127.0.0.1:1").to_json(),
                            ephemeral=True)
        # ...and the group goes on: both back, one leads, receipts flow.
        for node in nodes:
            node.start()
        primary = wait_ready(nodes)
        receipted(primary, "after")
        assert insider.get(f"{ROOT}/primary")[0] != lock_before  # a later epoch's lock, the group's own
        assert election.parse_epoch(insider.get(f"{ROOT}/epoch")[0]) > election.parse_epoch(epoch_before[0])
        for node in nodes:
            assert log_count(node, "ha_zookeeper_open") == 0  # credentials given: no warning
    finally:
        for node in nodes:
            node.kill()


def test_a_corrupt_lock_record_is_written_again_and_a_corrupt_epoch_does_not_stop_the_takeover(
        tmp_path: Path, zookeeper: ZooKeeperServer, insider: KazooClient) -> None:
    nodes, primary, backup = pair_in_sync(tmp_path, zookeeper)
    try:
        receipted(primary, "m0")
        lock = insider.get(f"{ROOT}/primary")[0]

        # A lock record that does not parse: its holder writes it again, nobody
        # fails over, the backup follows on (it does not take garbage for "nobody leads").
        insider.set(f"{ROOT}/primary", b"\x00garbage{")
        wait_logged(primary, "primary_record_rewritten")
        deadline = time.monotonic() + WAIT_S
        while insider.get(f"{ROOT}/primary")[0] != lock:
            assert time.monotonic() < deadline, "the lock's record was not written again"
            time.sleep(0.1)
        assert wait_ready(nodes) is primary
        wait_role(backup, "backup_in_sync")
        receipted(primary, "m1")
        receipted(primary, "m2")

        # /epoch written over with garbage, then the primary dies: the backup still takes over,
        # with an epoch newer than any the znode ever held.
        insider.set(f"{ROOT}/epoch", b"not a number")
        version = insider.get(f"{ROOT}/epoch")[1].version
        primary.kill()
        assert wait_ready([backup]) is backup
        data, _stat = insider.get(f"{ROOT}/epoch")
        taken = election.parse_epoch(data)
        assert taken == version + 1
        assert PrimaryRecord.from_json(insider.get(f"{ROOT}/primary")[0]).epoch == taken
        assert log_count(backup, "epoch_record_ignored") >= 1
        consumer = RawClient((HOST, backup.stomp_port), timeout=30)  # nothing receipted was lost on the way
        consumer.connect()
        consumer.send_frame("SUBSCRIBE", {"destination": "/queue/zk", "id": "s", "ack": "auto"})
        assert sorted(consumer.expect("MESSAGE").body for _ in range(3)) == [b"m0", b"m1", b"m2"]
        assert consumer.quiet_for(0.5) == []
        consumer.close()
        # Logged once, not at every look (every half second) while it lasted.
        assert log_count(backup, "primary_record_ignored") <= 1
        assert log_count(backup, "epoch_record_ignored") == 1
    finally:
        for node in nodes:
            node.kill()


def test_a_node_without_credentials_says_once_that_its_znodes_are_open(tmp_path: Path,
                                                                        zookeeper: ZooKeeperServer) -> None:
    node = Node(tmp_path, "gw-0", zookeeper, replicas=2).start()  # alone of two: it waits, as a candidate
    try:
        wait_logged(node, "ha_backup_started")
        wait_logged(node, "zookeeper_connected")
        assert log_count(node, "ha_zookeeper_open") == 1
        text = node.log_path.read_text(errors="replace")
        assert "zookeeper_auth_file" in text and "GATEWAY_ZOOKEEPER_AUTH" in text
    finally:
        node.kill()


def test_a_tree_made_open_is_closed_by_the_first_node_with_credentials(zookeeper: ZooKeeperServer,
                                                                       stranger: KazooClient) -> None:
    log = EventLog()
    old = Coordinated(zookeeper, "old", log, lsn=5).start()  # as an older version (or a laptop trial) made it
    assert stranger.get(f"{ROOT}/epoch")[0] == b"0"  # open: anyone reads it
    nodes = [old]
    try:
        with structlog.testing.capture_logs() as captured:
            nodes.append(Coordinated(zookeeper, "new", log, lsn=7, auth=AUTH).start())
        ours = [make_digest_acl(USER, PASSWORD, all=True)]
        for path in (ROOT, f"{ROOT}/nodes", f"{ROOT}/epoch", f"{ROOT}/nodes/old", f"{ROOT}/nodes/new"):
            with pytest.raises(NoAuthError):
                stranger.get(path)
        with pytest.raises(NoAuthError):
            stranger.create(f"{ROOT}/primary", b"{}", ephemeral=True)
        insider = client(zookeeper, AUTH)
        try:
            for path in (ROOT, f"{ROOT}/nodes", f"{ROOT}/epoch", f"{ROOT}/nodes/old", f"{ROOT}/nodes/new"):
                assert insider.get_acls(path)[0] == ours, path
        finally:
            insider.stop()
            insider.close()
        closed = [e for e in captured if e["event"] == "zookeeper_acls_set"]
        assert len(closed) == 1 and set(closed[0]["paths"]) == {ROOT, f"{ROOT}/nodes", f"{ROOT}/epoch",
                                                                 f"{ROOT}/nodes/old"}
        # A second node with credentials finds nothing to close: said once.
        with structlog.testing.capture_logs() as captured:
            nodes.append(Coordinated(zookeeper, "third", log, lsn=1, auth=AUTH).start())
        assert [e for e in captured if e["event"] == "zookeeper_acls_set"] == []
    finally:
        for node in nodes:
            node.close()


@pytest.mark.parametrize("auth", ["", "gateway:another-password"])
def test_a_node_without_the_group_s_credentials_is_refused_and_told_why(zookeeper: ZooKeeperServer,
                                                                        auth: str) -> None:
    log = EventLog()
    group = Coordinated(zookeeper, "a", log, lsn=1, auth=AUTH).start()
    try:
        with pytest.raises(CoordinationError, match="zookeeper_auth_file or GATEWAY_ZOOKEEPER_AUTH"):
            Coordinated(zookeeper, "b", log, lsn=1, auth=auth).start()
        # The group's record is untouched and still its own.
        assert [r.node_id for r in group.coordinator.nodes().values()] == ["a"]
    finally:
        group.close()


def test_a_member_record_that_does_not_parse_is_logged_once_and_written_again(zookeeper: ZooKeeperServer,
                                                                              insider: KazooClient) -> None:
    log = EventLog()
    nodes: list[Coordinated] = []
    with structlog.testing.capture_logs() as captured:
        try:
            nodes += [Coordinated(zookeeper, name, log, lsn=lsn, auth=AUTH).start() for name, lsn in (("a", 10), ("b", 30))]
            a, _b = nodes
            insider.set(f"{ROOT}/nodes/b", b'{"node_id": "b", "lsn": "lots"}')
            for _ in range(5):  # read at every look: logged once all the same
                assert set(a.coordinator.nodes()) == {"a"}
            ignored = [e for e in captured if e["event"] == "node_record_ignored"]
            assert len(ignored) == 1 and ignored[0]["znode"] == f"{ROOT}/nodes/b", ignored
            assert "must be" in ignored[0]["reason"]
            # The election is not wedged: b, finding its own record unreadable,
            # writes it again, and one node leads.
            leader = elect(nodes, log)
            assert leader in nodes
            assert set(a.coordinator.nodes()) == {"a", "b"}
        finally:
            for node in nodes:
                node.close()


def with_credentials(node: Node, auth: str) -> None:
    """Give a stopped node's [ha] table the group's credentials (as an upgrade's new ConfigMap and Secret would)."""
    secret = node.dir / "zookeeper-auth"
    secret.write_text(auth + "\n")
    text = node.config.read_text()
    assert "\n[ha]\n" in text and "zookeeper_auth_file" not in text
    node.config.write_text(text.replace("\n[ha]\n", f'\n[ha]\nzookeeper_auth_file = "{secret}"\n'))


def test_credentials_turned_on_by_a_rolling_upgrade_cost_one_failover(tmp_path: Path, zookeeper: ZooKeeperServer,
                                                                      stranger: KazooClient) -> None:
    """An open group given credentials node by node, backup first and the primary
    last (deploy/README.md's order): the primary without them keeps serving,
    its receipts confirmed by the backup with them, until it is replaced; then
    the backup leads, the old primary rejoins, and the znodes are closed."""
    nodes = [Node(tmp_path, name, zookeeper, replicas=2).start() for name in ("gw-0", "gw-1")]
    try:
        primary = wait_ready(nodes)
        backup = next(n for n in nodes if n is not primary)
        wait_role(backup, "backup_in_sync")
        receipted(primary, "open")
        backup.kill()
        with_credentials(backup, AUTH)
        backup.start()
        wait_role(backup, "backup_in_sync")  # it found the lock, and follows the primary without credentials
        with pytest.raises(NoAuthError):
            stranger.get(f"{ROOT}/epoch")  # closed by the first node with credentials
        assert wait_ready(nodes) is primary
        receipted(primary, "half")  # confirmed by the upgraded backup
        wait_logged(primary, "ha_lock_unknown")  # it can no longer read the lock: it says so and serves on
        primary.kill()
        with_credentials(primary, AUTH)
        assert wait_ready([backup]) is backup
        primary.start()
        wait_role(primary, "backup_in_sync")
        assert wait_ready(nodes) is backup
        receipted(backup, "closed")
    finally:
        for node in nodes:
            node.kill()
