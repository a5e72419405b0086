"""HA end to end: a real ZooKeeper and `gateway serve` processes with [ha]
tables on loopback.  Of three nodes exactly one is ready; receipted persistent
SENDs to it survive a SIGKILL of it, delivered by the backup that takes over
(the two backups settle the election on their final LSNs); the killed node,
restarted, rejoins as a backup and confirms the new primary's batches."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.helpers import RawClient
from tests.processes import GATEWAY, HOST, free_port
from tests.zookeeper_helpers import ZooKeeperServer

SESSION_TIMEOUT_S = 3
WAIT_S = 60.0  # any wait for a role change: far beyond the session timeout and the backup's reconnects


class Node:
    """One `gateway serve` with an [ha] table, its output in a log file."""

    def __init__(self, tmp_path: Path, node_id: str, zookeeper: ZooKeeperServer) -> None:
        self.node_id = node_id
        self.dir = tmp_path / node_id
        self.dir.mkdir()
        self.stomp_port, self.admin_port, self.replication_port = free_port(), free_port(), free_port()
        self.config = self.dir / "gateway.toml"
        self.config.write_text(f"""
bind = "{HOST}"
stomp_port = {self.stomp_port}
mqtt_port = 0
admin_port = {self.admin_port}
data_dir = "{self.dir / 'data'}"
shutdown_grace_s = 1.0

[ha]
node_id = "{node_id}"
zookeeper = "{zookeeper.hosts}/gateway"
replication_listen = "{HOST}:{self.replication_port}"
advertise = "{HOST}:{self.replication_port}"
sync_replicas = 1
zookeeper_session_timeout_s = {SESSION_TIMEOUT_S}
sync_timeout_s = 20
""")
        self.log_path = self.dir / "node.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Node:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([GATEWAY, "serve", "--config", str(self.config)], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
        return self

    def readyz(self) -> int | None:
        """The admin port's /readyz status; None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.admin_port}/readyz", timeout=1) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"---- {self.node_id}\n" + "\n".join(text.splitlines()[-lines:])


def wait_ready(nodes: list[Node], timeout: float = WAIT_S) -> Node:
    """The one ready node, once exactly one of the live ones is ready and the others answer 503."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for node in nodes:
            assert node.alive(), f"{node.node_id} exited\n" + "\n".join(n.log_tail() for n in nodes)
        answers = {node.node_id: node.readyz() for node in nodes}
        ready = [n for n in nodes if answers[n.node_id] == 200]
        if len(ready) == 1 and all(answers[n.node_id] == 503 for n in nodes if n is not ready[0]):
            return ready[0]
        assert len(ready) <= 1, f"two ready nodes: {answers}"
        time.sleep(0.1)
    raise AssertionError(f"no single ready node within {timeout} s\n" + "\n".join(n.log_tail() for n in nodes))


def test_receipted_messages_survive_a_sigkill_of_the_primary(tmp_path: Path, zookeeper: ZooKeeperServer) -> None:
    nodes = [Node(tmp_path, name, zookeeper).start() for name in ("gw-0", "gw-1", "gw-2")]
    try:
        primary = wait_ready(nodes)
        backups = [n for n in nodes if n is not primary]
        producer = RawClient((HOST, primary.stomp_port), timeout=30)
        producer.connect()
        sent = 50
        for i in range(sent):
            producer.send_frame("SEND", {"destination": "/queue/orders", "persistent": "true", "receipt": f"r{i}"},
                                f"order {i}".encode())
        for i in range(sent):
            producer.receipt(f"r{i}", timeout=30)  # each released only once a backup confirmed it
        primary.kill()
        producer.abort()
        # Either backup may hold the most (sync_replicas = 1); the election picks one that does.
        backup = wait_ready(backups)
        consumer = RawClient((HOST, backup.stomp_port), timeout=30)
        consumer.connect()
        consumer.send_frame("SUBSCRIBE", {"destination": "/queue/orders", "id": "s", "ack": "auto"})
        bodies = [consumer.expect("MESSAGE").body for _ in range(sent)]
        assert sorted(bodies) == sorted(f"order {i}".encode() for i in range(sent))
        assert consumer.quiet_for(0.5) == []  # none twice, none more
        consumer.close()
        # A restart is how the deposed primary rejoins: as a backup, whose
        # confirmations the new primary's receipts wait for (sync_replicas = 1).
        primary.start()
        assert wait_ready(nodes) is backup
        producer = RawClient((HOST, backup.stomp_port), timeout=30)
        producer.connect()
        producer.send_frame("SEND", {"destination": "/queue/later", "persistent": "true", "receipt": "after"}, b"x")
        producer.receipt("after", timeout=30)
        producer.close()
    finally:
        for node in nodes:
            node.kill()
