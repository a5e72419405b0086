"""HA fencing end to end: a real ZooKeeper and three `gateway serve` nodes.

The primary is frozen with SIGSTOP while a producer streams receipted
persistent SENDs to it; it stays frozen until its session has expired and a
backup has taken over (ready), then it is thawed with SIGCONT.  What a
producer relies on is checked through its own socket:

- every RECEIPT the old primary ever sent is for a message the new primary
  delivers (the safety property: a receipt means "on a backup that the
  election cannot pass over");
- no RECEIPT at all for a SEND written after the freeze: those frames reach
  the old primary only once it is thawed, after the takeover, when no backup
  follows it any more (they all settled on the vacancy before the new primary
  could lead, and follow only the lock holder), so nothing can confirm them;
- none of those frames reaches the new primary either.

Then the thawed node rejoins as a backup in the same process (no supervisor:
same pid), holding no second ZooKeeper session and no file twice; it
confirms the new primary's batches (the other backup killed, sync_replicas
= 1 needs it), and when the new primary is killed it takes over and delivers
exactly what was receipted meanwhile: the frames it stored while thawed and
fenced, which nobody else ever had, are gone from its folder.
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gateway.ha import election
from gateway.stomp import codec, frames
from tests.support.ha_nodes import WAIT_S, Node, wait_ready
from tests.support.helpers import RawClient, encode_frame, wait_for
from tests.support.processes import HOST
from tests.support.zookeeper_helpers import ZooKeeperServer

QUEUE = "/queue/fence"
WINDOW = 400  # SENDs written and not receipted, at most (the buffers hold them while the primary is frozen)
PACE_S = 0.01


class Producer(threading.Thread):
    """Receipted persistent SENDs on one raw socket, as fast as PACE_S allows:
    when each was written, and every RECEIPT and ERROR read back, with the time."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection((HOST, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.codec = codec.StompConnection(codec.Role.CLIENT)
        self.written: dict[str, float] = {}  # receipt id -> time.monotonic() before its write began
        self.receipts: list[tuple[float, str]] = []
        self.errors: list[frames.Frame] = []
        self.closed_at: float | None = None
        self.stopping = threading.Event()
        self.room = threading.Condition()
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.sock.sendall(encode_frame("CONNECT", {"accept-version": "1.2", "host": "localhost"}))
        connected = self.next_frames()
        assert connected and type(connected[0]) is frames.Connected, connected

    def next_frames(self) -> list[frames.Frame]:
        data = self.sock.recv(65536)
        if not data:
            return []
        self.codec.receive_data(data)
        return list(self.codec.events())

    def read(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue  # a frozen primary answers nothing; the freeze outlasts any timeout
            except OSError:
                data = b""
            now = time.monotonic()
            if not data:
                with self.room:
                    self.closed_at = now
                    self.room.notify_all()
                return
            self.codec.receive_data(data)
            for frame in self.codec.events():
                with self.room:
                    if frame.command == "RECEIPT":
                        self.receipts.append((now, frame.headers["receipt-id"]))
                    elif frame.command == "ERROR":
                        self.errors.append(frame)
                    self.room.notify_all()

    def run(self) -> None:
        self.reader.start()
        i = 0
        while not self.stopping.is_set():
            with self.room:
                if not self.room.wait_for(lambda: len(self.written) - len(self.receipts) < WINDOW
                                          or self.closed_at is not None or self.stopping.is_set(), timeout=1):
                    continue
                if self.closed_at is not None or self.stopping.is_set():
                    return
            name = f"m{i}"
            with self.room:
                self.written[name] = time.monotonic()
            try:
                self.sock.sendall(encode_frame("SEND", {"destination": QUEUE, "persistent": "true", "receipt": name},
                                               name.encode()))
            except OSError:
                return  # closed by the fenced primary
            i += 1
            time.sleep(PACE_S)

    def receipted(self) -> set[str]:
        with self.room:
            return {name for _at, name in self.receipts}

    def written_after(self, moment: float) -> set[str]:
        with self.room:
            return {name for name, at in self.written.items() if at > moment}

    def stop(self) -> None:
        self.stopping.set()
        with self.room:
            self.room.notify_all()
        self.join(10)
        self.sock.close()
        self.reader.join(10)


def pid_state(pid: int) -> str:
    """The process state letter from /proc (T: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def metrics(node: Node) -> str:
    answer = node.get("/metrics")
    if answer is None or answer[0] != 200:
        raise OSError(f"/metrics answered {answer}")
    return answer[1]


def backup_epoch(node: Node) -> int | None:
    """The epoch a backup's /metrics reports (that of the last batch its folder holds), or None
    when the node does not answer as a backup (role backup_syncing or backup_in_sync)."""
    try:
        lines = metrics(node).splitlines()
    except OSError:
        return None
    if not {'gateway_ha_role{role="backup_syncing"} 1', 'gateway_ha_role{role="backup_in_sync"} 1'} & set(lines):
        return None
    return next(int(line.split()[1]) for line in lines if line.startswith("gateway_ha_epoch "))


def current_epoch(zookeeper: ZooKeeperServer) -> int:
    """The epoch in ZooKeeper's /epoch: that of the lock holder once one is ready."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=zookeeper.hosts, timeout=10)
    client.start(timeout=WAIT_S)
    try:
        data, _stat = client.get("/gateway/epoch")
        return election.parse_epoch(data)
    finally:
        client.stop()
        client.close()


def wait_node(node: Node, predicate: Callable[[], object], what: str) -> None:
    try:
        wait_for(predicate, timeout=WAIT_S, interval=0.1, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{node.log_tail(60)}") from None


def zookeeper_connections(pid: int, zookeeper_port: int) -> int:
    """TCP connections from this process to ZooKeeper (a kazoo client left
    running by an earlier node would hold a second one: it reconnects forever)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    count = 0
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].split(":")[1], 16)
        if remote_port == zookeeper_port and fields[3] == "01" and fields[9] in inodes:  # 01: ESTABLISHED
            count += 1
    return count


def files_open_twice(pid: int, folder: Path) -> list[str]:
    """Files of the data folder this process has open more than once."""
    opened = collections.Counter()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(folder)):
            opened[target] += 1
    return [name for name, count in opened.items() if count > 1]


def drain(node: Node, names: set[str], timeout: float = WAIT_S) -> list[str]:
    """Consume the queue on ``node`` until every one of ``names`` came, then until quiet; every body."""
    consumer = RawClient((HOST, node.stomp_port), timeout=30)
    consumer.connect()
    consumer.send_frame("SUBSCRIBE", {"destination": QUEUE, "id": "s", "ack": "auto"})
    bodies: list[str] = []
    deadline = time.monotonic() + timeout
    while not names <= set(bodies):
        assert time.monotonic() < deadline, f"missing after {timeout} s: {sorted(names - set(bodies))[:20]}"
        bodies += [f.body.decode() for f in consumer.quiet_for(0.5) if f.command == "MESSAGE"]
    bodies += [f.body.decode() for f in consumer.quiet_for(1.0) if f.command == "MESSAGE"]
    consumer.close()
    return bodies


def test_a_primary_frozen_past_its_session_releases_no_receipt_after_the_takeover_and_rejoins_as_a_backup(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    nodes = [Node(tmp_path, name, zookeeper).start() for name in ("gw-0", "gw-1", "gw-2")]
    producer: Producer | None = None
    try:
        old = wait_ready(nodes)
        backups = [n for n in nodes if n is not old]
        assert old.proc is not None
        pid = old.proc.pid
        producer = Producer(old.stomp_port)
        producer.start()
        wait_for(lambda: len(producer.receipted()) >= 50, timeout=WAIT_S, interval=0.05, what="receipts flowing")

        old.proc.send_signal(signal.SIGSTOP)
        wait_for(lambda: pid_state(pid) == "T", timeout=10, interval=0.01, what="the primary stopped")
        frozen_at = time.monotonic()  # any SEND written from now on is read only after SIGCONT
        # Ready only once the frozen node's session expired (its lock is ephemeral)
        # and the backups' election ran: longer than the session timeout by construction.
        new = wait_ready(backups)
        epoch = current_epoch(zookeeper)
        wait_for(lambda: producer.written_after(frozen_at), timeout=10, interval=0.05, what="a SEND written while frozen")
        old.proc.send_signal(signal.SIGCONT)
        # Thawed, it fences itself and closes its clients; the producer's socket ends.
        wait_for(lambda: producer.closed_at is not None, timeout=WAIT_S, interval=0.05, what="the old primary closing")
        producer.stop()

        late = producer.written_after(frozen_at)
        receipted = producer.receipted()
        assert late and receipted
        assert not receipted & late, f"receipts for SENDs written while frozen: {sorted(receipted & late)[:20]}"

        # The old node rejoins as a backup in the same process.
        wait_node(old, lambda: "ha_rejoining" in old.log_path.read_text(errors="replace"), "the old primary rejoining")
        assert old.alive() and old.proc.pid == pid
        # Following the new primary: its folder holds the takeover's epoch, by tail or by snapshot.
        wait_node(old, lambda: (backup_epoch(old) or 0) >= epoch, "the old primary following the new one as a backup")
        assert old.readyz() == 503
        assert zookeeper_connections(pid, zookeeper.port) == 1
        assert files_open_twice(pid, old.dir / "data") == []

        # Every receipted message is on the new primary; none of those written while frozen is.
        bodies = drain(new, receipted)
        assert len(bodies) == len(set(bodies)), "a message delivered twice"
        assert not set(bodies) & late, f"the new primary has SENDs written while frozen: {sorted(set(bodies) & late)[:20]}"
        assert set(bodies) <= set(producer.written)

        # With the other backup gone, the new primary's receipts need the old node's confirmations.
        other = next(n for n in backups if n is not new)
        other.kill()
        client = RawClient((HOST, new.stomp_port), timeout=30)
        client.connect()
        after = [f"after {i}" for i in range(20)]
        for body in after:
            client.send_frame("SEND", {"destination": QUEUE, "persistent": "true", "receipt": body}, body.encode())
        for body in after:
            client.receipt(body, timeout=WAIT_S)
        client.abort()
        # ...and it holds them: with the new primary killed and the other
        # backup (which missed them) back, the election's quorum of two is
        # there, and the old node, holding the most, takes over.
        new.kill()
        other.start()
        assert wait_ready([old, other]) is old and old.proc.pid == pid
        assert sorted(drain(old, set(after))) == sorted(after)
        # Its signal handling outlived the nodes it ran: SIGTERM still ends it with 0.
        old.proc.send_signal(signal.SIGTERM)
        assert old.proc.wait(WAIT_S) == 0
    finally:
        if producer is not None and producer.is_alive():
            producer.stop()
        for node in nodes:
            if node.alive() and node.proc is not None:
                node.proc.send_signal(signal.SIGCONT)
            node.kill()


def test_sigterm_ends_an_ha_node_with_0_as_a_backup_and_as_a_primary(tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    nodes = [Node(tmp_path, name, zookeeper, replicas=2).start() for name in ("gw-0", "gw-1")]
    try:
        primary = wait_ready(nodes)
        backup = next(n for n in nodes if n is not primary)
        for node in (backup, primary):
            assert node.proc is not None
            node.proc.send_signal(signal.SIGTERM)
            assert node.proc.wait(WAIT_S) == 0, node.log_tail()
    finally:
        for node in nodes:
            node.kill()


def test_a_receipt_no_backup_confirms_is_withdrawn_saying_the_message_is_stored_on_the_primary_only(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    node = Node(tmp_path, "gw-0", zookeeper, replicas=2)  # its partner away: alone it may lead
    node.config.write_text(node.config.read_text().replace("sync_timeout_s = 20", "sync_timeout_s = 1"))
    node.start()
    try:
        wait_ready([node])  # alone it leads, and no backup will confirm (sync_replicas = 1)
        producer = RawClient((HOST, node.stomp_port), timeout=30)
        producer.connect()
        producer.send_frame("SEND", {"destination": QUEUE, "persistent": "true", "receipt": "lonely"}, b"lonely")
        error = producer.expect_error_and_close(timeout=WAIT_S)
        producer.close()
        assert error.headers["receipt-id"] == "lonely"
        assert error.headers["message"] == "stored on the primary only: not confirmed by 1 in-sync backup within 1 s (0 in sync)"
        assert error.body == b"receipt lonely withdrawn: stored on the primary only (may yet be delivered, or lost in a failover)\n"
        # As it says: the primary holds the message and delivers it.
        assert drain(node, {"lonely"}) == ["lonely"]
    finally:
        node.kill()


def test_a_primary_that_loses_zookeeper_fences_itself_before_its_session_could_expire_keeps_rejoining_and_leads_again(
        tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    node = Node(tmp_path, "gw-0", zookeeper, replicas=2).start()  # its partner away: alone it may lead
    try:
        assert wait_ready([node]) is node and node.proc is not None
        pid = node.proc.pid
        client = RawClient((HOST, node.stomp_port), timeout=30)
        client.connect()
        zookeeper.kill()  # the connection drops: suspended at once
        # Told why, so that it reconnects through its node list rather than wait for a restart.
        (error,) = [f for f in client.wait_closed(WAIT_S) if f.command == "ERROR"]
        assert error.headers["message"] == "this node is no longer the primary: reconnect to the group"
        client.close()
        # Suspended first (its session may live: a server of an ensemble may
        # have gone), then fenced by its own timer, half a session timeout
        # after ZooKeeper last answered it, not after a look at the lock that
        # waited for ZooKeeper a whole session timeout: by then the session
        # could have expired and another node have taken over.
        lines = node.log_path.read_text(errors="replace").splitlines()
        suspended = next(i for i, line in enumerate(lines) if "ha_transition" in line and "on=fence " in line)
        assert "state=suspended" in lines[suspended]
        fenced = next(i for i, line in enumerate(lines) if "ha_transition" in line and "on=fence_due" in line)
        assert suspended < fenced and "state=fenced" in lines[fenced]
        assert not [line for line in lines[:fenced] if "ha_lock_unknown" in line and "no answer" in line]
        # Then (nothing heard for a session timeout) a fresh node that cannot
        # reach ZooKeeper: tried again, not an exit for a supervisor to sort out.
        wait_node(node, lambda: "ha_rejoin_failed" in node.log_path.read_text(errors="replace"),
                  "a rejoin failing while ZooKeeper is away")
        assert node.alive() and node.readyz() != 200
        zookeeper.start()  # same port and data: the group and its epoch are still there
        assert wait_ready([node]) is node and node.proc.pid == pid
        node.proc.send_signal(signal.SIGTERM)
        assert node.proc.wait(WAIT_S) == 0
    finally:
        node.kill()
