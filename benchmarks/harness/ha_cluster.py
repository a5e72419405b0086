"""The processes of the failover benchmark: a real ZooKeeper, ``gateway serve``
nodes with ``[ha]`` tables, and a plain single-node ``gateway serve`` to
compare with (stdlib only).

Each is started through harness/broker.py's shim, so it gets SIGKILL should the
runner itself die; every wait is bounded; ``kill`` never raises.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from benchmarks.harness.broker import EXEC_SHIM, HOST, ROOT, ScenarioFailed, free_port
from benchmarks.harness.link_proxy import LinkProxy

GATEWAY = [sys.executable, "-m", "gateway"]  # the checkout's own code (run from ROOT)
ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")  # Debian's zookeeper package
ZOOKEEPER_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
TICK_MS = 200
RESTART_PAUSE_S = 1.0  # between two restarts of a node that exited on its own  # so that short session timeouts are allowed ([2, 20] ticks)


def zookeeper_unavailable() -> str | None:
    if shutil.which("java") is None:
        return "java is not installed (the zookeeper package needs a JRE)"
    if not ZOOKEEPER_JAR.exists():
        return f"Debian's zookeeper package is not installed (no {ZOOKEEPER_JAR}; make test installs it)"
    return None


class Child:
    """A child process writing to a log file in ``folder``."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder
        self.name = name
        folder.mkdir(parents=True, exist_ok=True)
        self.log_path = folder / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def spawn(self, argv: list[str]) -> None:
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== start {self.starts} ====\n".encode())
            log.flush()
            self.proc = subprocess.Popen([sys.executable, "-c", EXEC_SHIM, str(os.getpid()), *argv],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL and reap (bounded); never raises."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                pass

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return f"---- {self.name}\n" + "\n".join(text.splitlines()[-lines:])


def accepting(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


class ZooKeeper(Child):
    """A standalone ZooKeeper on 127.0.0.1 at a free port, the JVM itself as the child."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder, "zookeeper")
        self.port = free_port()
        (folder / "data").mkdir(exist_ok=True)
        self.config_path = folder / "zoo.cfg"
        self.config_path.write_text("\n".join([
            f"tickTime={TICK_MS}", f"dataDir={folder / 'data'}", f"clientPort={self.port}",
            f"clientPortAddress={HOST}", "minSessionTimeout=400", "maxSessionTimeout=20000",
            "admin.enableServer=false", "4lw.commands.whitelist=", "maxClientCnxns=100", "",
        ]))

    @property
    def hosts(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        self.spawn(["java", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                    "-cp", str(ZOOKEEPER_JAR), ZOOKEEPER_MAIN, str(self.config_path)])
        deadline = time.monotonic() + timeout
        while not accepting(self.port):
            if not self.alive:
                raise ScenarioFailed(f"ZooKeeper exited at startup\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"ZooKeeper not listening within {timeout} s\n{self.log_tail()}")
            time.sleep(0.1)


class HaNode(Child):
    """One ``gateway serve`` with an [ha] table; its admin port tells its role."""

    def __init__(self, folder: Path, node_id: str, zookeeper: str, session_timeout_s: float,
                 sync_replicas: int = 1, sync_timeout_s: float = 20.0) -> None:
        super().__init__(folder / node_id, node_id)
        self.node_id = node_id
        self.stomp_port, self.admin_port, replication = free_port(), free_port(), free_port()
        # The others reach its replication port through this proxy, which a
        # "cut" round cuts (silently: benchmarks/harness/link_proxy.py): the node is
        # then cut off from its backups, not from ZooKeeper.
        self.proxy = LinkProxy()
        self.proxy.target = replication
        self.config = self.folder / "gateway.toml"
        self.config.write_text(f"""
bind = "{HOST}"
stomp_port = {self.stomp_port}
mqtt_port = 0
admin_port = {self.admin_port}
data_dir = "{self.folder / 'data'}"
shutdown_grace_s = 1.0

[ha]
node_id = "{node_id}"
zookeeper = "{zookeeper}/gateway"
replication_listen = "{HOST}:{replication}"
advertise = "{self.proxy.address}"
sync_replicas = {sync_replicas}
zookeeper_session_timeout_s = {session_timeout_s}
sync_timeout_s = {sync_timeout_s}
""")

    def start(self) -> HaNode:
        self.spawn([*GATEWAY, "serve", "--config", str(self.config)])
        return self

    def readyz(self) -> tuple[int, str] | None:
        """/readyz's status and body ("not ready: backup_in_sync" on a backup); None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.admin_port}/readyz", timeout=1) as response:
                return int(response.status), response.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except OSError:
            return None


class Cluster:
    """N HA nodes on one ZooKeeper; a node that exits on its own is restarted,
    as its supervisor would (a deposed primary exits to rejoin as a backup)."""

    def __init__(self, folder: Path, size: int, session_timeout_s: float) -> None:
        self.zookeeper = ZooKeeper(folder / "zookeeper")
        self.folder = folder
        self.size = size
        self.session_timeout_s = session_timeout_s
        self.nodes: list[HaNode] = []
        self.down: set[str] = set()  # killed by the benchmark, restarted by it
        self.restarts = 0  # restarts of nodes that exited on their own
        # (node id, exit code, when) of each such exit, for the report: a node
        # that keeps exiting is restarted at most every RESTART_PAUSE_S, and said.
        self.exits: list[tuple[str, int | None, float]] = []
        self.restarted_at: dict[str, float] = {}

    def start(self) -> None:
        self.zookeeper.start()
        self.nodes = [HaNode(self.folder, f"gw-{i}", self.zookeeper.hosts, self.session_timeout_s).start()
                      for i in range(self.size)]

    @property
    def stomp_ports(self) -> list[int]:
        return [n.stomp_port for n in self.nodes]

    def supervise(self) -> None:
        now = time.monotonic()
        for node in self.nodes:
            if node.proc is not None and not node.alive and node.node_id not in self.down:
                if now - self.restarted_at.get(node.node_id, -RESTART_PAUSE_S) < RESTART_PAUSE_S:
                    continue  # as a supervisor's backoff: a node that keeps exiting is not restarted in a loop
                self.exits.append((node.node_id, node.proc.returncode, now))
                print(f"{node.node_id} exited on its own (code {node.proc.returncode}); restarting it\n"
                      f"{node.log_tail(10)}", file=sys.stderr, flush=True)
                self.restarted_at[node.node_id] = now
                node.start()
                self.restarts += 1

    def kill_node(self, node: HaNode) -> None:
        self.down.add(node.node_id)
        node.kill()

    def restart_node(self, node: HaNode) -> None:
        self.down.discard(node.node_id)
        node.start()

    def states(self) -> dict[str, tuple[int, str] | None]:
        self.supervise()
        return {n.node_id: n.readyz() for n in self.nodes}

    def wait_steady(self, timeout: float) -> HaNode:
        """The primary, once exactly one node is ready and every other says it
        is a backup in sync (/readyz: "not ready: backup_in_sync"): at the
        live edge, counted toward the primary's sync_replicas."""
        deadline = time.monotonic() + timeout
        answers: dict[str, tuple[int, str] | None] = {}
        while time.monotonic() < deadline:
            answers = self.states()
            ready = [n for n in self.nodes if answers[n.node_id] is not None and answers[n.node_id][0] == 200]
            in_sync = [n for n in self.nodes
                       if answers[n.node_id] is not None and "backup_in_sync" in answers[n.node_id][1]]
            if len(ready) == 1 and len(in_sync) == self.size - 1:
                return ready[0]
            time.sleep(0.1)
        raise ScenarioFailed(f"cluster not steady within {timeout} s: {answers}\n" + self.tails())

    def primary(self) -> HaNode | None:
        ready = [n for n in self.nodes if (a := n.readyz()) is not None and a[0] == 200]
        return ready[0] if len(ready) == 1 else None

    def tails(self) -> str:
        return "\n".join(n.log_tail() for n in self.nodes)

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()
            node.proxy.close()
        self.zookeeper.kill()


class SingleNode(Child):
    """A plain ``gateway serve`` (no [ha]) on the same machine, for comparison."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder / "single", "single")
        self.stomp_port = free_port()

    def start(self, timeout: float = 60.0) -> SingleNode:
        self.spawn([*GATEWAY, "serve", "--bind", HOST, "--stomp-port", str(self.stomp_port), "--mqtt-port", "0",
                    "--admin-port", "0", "--data-dir", str(self.folder / "data")])
        deadline = time.monotonic() + timeout
        while not accepting(self.stomp_port):
            if not self.alive:
                raise ScenarioFailed(f"single node exited at startup\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"single node not listening within {timeout} s\n{self.log_tail()}")
            time.sleep(0.05)
        return self
