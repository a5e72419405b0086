"""HA nodes as the end-to-end tests run them: `gateway serve` processes with
an [ha] table on loopback, against a real ZooKeeper (tests/support/zookeeper_helpers.py, or an
ensemble: tests/support/zookeeper_ensemble.py),
each with its output in a log file, probed through its admin port the way
Kubernetes does (/readyz, /metrics)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.harness.link_proxy import LinkProxy
from gateway.auth import hash_password
from tests.support.processes import GATEWAY, HOST, free_port
from tests.support.zookeeper_ensemble import ZooKeeperEnsemble
from tests.support.zookeeper_helpers import ZooKeeperServer

SESSION_TIMEOUT_S = 3
WAIT_S = 60.0  # any wait for a role change: far beyond the session timeout and the backup's reconnects
# A user who may read the admin API and /metrics: a backup's metrics ask for
# the same credentials as the primary's.
READER = ("viewer", "look")
USERS = (f'[admin]\nusers = [{{ name = "{READER[0]}", password_hash = "{hash_password(READER[1], iterations=1000)}", '
         f'role = "read" }}]\n')
# The group's cluster secret (persistence/replica/handshake.py), given to every node
# as a Kubernetes pod gets it: through the environment.
CLUSTER_SECRET = "e2e-cluster-secret-6d1f0c9b2a7e4d35"
ROLE = re.compile(r'^gateway_ha_role\{role="([a-z_]+)"\} 1$', re.MULTILINE)


class Node:
    """One `gateway serve` with an [ha] table, its output in a log file.
    ``mqtt`` gives it an MQTT listener (a free port) besides STOMP."""

    def __init__(self, tmp_path: Path, node_id: str, zookeeper: ZooKeeperServer | ZooKeeperEnsemble, *,
                 mqtt: bool = False, sync_timeout_s: float = 20, replicas: int = 3,
                 session_timeout_s: float = SESSION_TIMEOUT_S, sync_replicas: int = 1,
                 secret: str | None = CLUSTER_SECRET, extra_ha: str = "", zookeeper_auth: str = "",
                 advertise: str = "") -> None:
        self.node_id = node_id
        # advertise: where its backups reach its replication port ("": that port
        # itself; a proxy's address to cut the link: benchmarks/harness/link_proxy.py).
        self.secret = secret  # None: no secret at all (a laptop trial)
        self.dir = tmp_path / node_id
        self.dir.mkdir()
        self.data_dir = self.dir / "data"
        self.stomp_port, self.admin_port, self.replication_port = free_port(), free_port(), free_port()
        self.mqtt_port = free_port() if mqtt else 0
        self.config = self.dir / "gateway.toml"
        auth = ""
        if zookeeper_auth:  # the group's ZooKeeper credentials, as a mounted Secret's file
            auth_file = self.dir / "zookeeper-auth"
            auth_file.write_text(zookeeper_auth + "\n")
            auth = f'zookeeper_auth_file = "{auth_file}"\n'
        self.config.write_text(f"""
bind = "{HOST}"
stomp_port = {self.stomp_port}
mqtt_port = {self.mqtt_port}
admin_port = {self.admin_port}
data_dir = "{self.data_dir}"
shutdown_grace_s = 1.0

[ha]
node_id = "{node_id}"
zookeeper = "{zookeeper.hosts}/gateway"
replication_listen = "{HOST}:{self.replication_port}"
advertise = "{advertise or f'{HOST}:{self.replication_port}'}"
replicas = {replicas}
sync_replicas = {sync_replicas}
zookeeper_session_timeout_s = {session_timeout_s:g}
sync_timeout_s = {sync_timeout_s:g}
{extra_ha}
{auth}""" + USERS)
        self.log_path = self.dir / "node.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Node:
        environ = {key: value for key, value in os.environ.items() if key != "GATEWAY_CLUSTER_SECRET"}
        if self.secret is not None:
            environ["GATEWAY_CLUSTER_SECRET"] = self.secret
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([GATEWAY, "serve", "--config", str(self.config)], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, env=environ)
        return self

    def get(self, path: str) -> tuple[int, str] | None:
        """An admin path's status and text, asked as the reader; None while the port does not answer."""
        request = urllib.request.Request(f"http://{HOST}:{self.admin_port}{path}")
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(READER).encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=1) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except OSError:
            return None

    def readyz(self) -> int | None:
        """The admin port's /readyz status; None while it does not answer."""
        answer = self.get("/readyz")
        return None if answer is None else answer[0]

    def role(self) -> str | None:
        """The role its /metrics exports (a backup's: backup_syncing, backup_in_sync, ...)."""
        answer = self.get("/metrics")
        found = ROLE.search(answer[1]) if answer is not None and answer[0] == 200 else None
        return found.group(1) if found else None

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


def wait_role(node: Node, role: str, timeout: float = WAIT_S) -> None:
    """Until ``node``'s /metrics says ``role``."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        assert node.alive(), f"{node.node_id} exited\n" + node.log_tail()
        seen = node.role()
        if seen == role:
            return
        time.sleep(0.1)
    raise AssertionError(f"{node.node_id} not {role} within {timeout} s (last {seen})\n" + node.log_tail())


@contextmanager
def group_behind_proxies(tmp_path: Path, zookeeper: ZooKeeperServer, size: int,
                         **options: Any) -> Iterator[tuple[Node, list[Node], LinkProxy]]:
    """``size`` nodes (``options`` as Node takes them), each reached by the
    others through its own proxy (benchmarks/harness/link_proxy.py: each node
    advertises it), so that cutting one node's proxy cuts its backups' links
    to it: (the primary, its backups in sync, the primary's proxy)."""
    proxies = [LinkProxy() for _ in range(size)]
    nodes = [Node(tmp_path, f"gw-{i}", zookeeper, advertise=proxy.address, **options)
             for i, proxy in enumerate(proxies)]
    for node, proxy in zip(nodes, proxies):
        proxy.target = node.replication_port
        node.start()
    try:
        primary = wait_ready(nodes)
        backups = [n for n in nodes if n is not primary]
        for backup in backups:
            wait_role(backup, "backup_in_sync")
        yield primary, backups, proxies[nodes.index(primary)]
    finally:
        for node in nodes:
            node.kill()
        for proxy in proxies:
            proxy.close()

