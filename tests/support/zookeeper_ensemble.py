"""A real ZooKeeper ensemble for the HA tests: three (or more) servers of
Debian's `zookeeper` package on loopback, each its own JVM (QuorumPeerMain)
with its own ports and data folder, so that one can be stopped (SIGTERM or
SIGKILL) and started again while the others keep a quorum, as in a rolling
restart.  ``hosts`` is the connect string listing every server."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from tests.support.helpers import wait_for
from tests.support.processes import HOST, free_port
from tests.support.zookeeper_helpers import STARTUP_TIMEOUT_S, java_command, serves

QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
TICK_MS = 500
# Sessions up to 40 ticks (the default maximum is 20), so that a gateway may
# keep its default session timeout of 10 s.
MAX_SESSION_TIMEOUT_MS = 20000
JOIN_TIMEOUT_S = 60.0  # a leader election among cold JVMs on a loaded machine


class EnsembleServer:
    """server.<myid>: a JVM on its own client, quorum and election ports."""

    def __init__(self, folder: Path, myid: int) -> None:
        self.myid, self.folder = myid, folder
        self.data_dir = folder / "data"
        self.data_dir.mkdir(parents=True)
        (self.data_dir / "myid").write_text(f"{myid}\n")
        self.client_port, self.quorum_port, self.election_port = free_port(), free_port(), free_port()
        self.config_path = folder / "zoo.cfg"
        self.log_path = folder / "zookeeper.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"{HOST}:{self.client_port}"

    def configure(self, servers: list[EnsembleServer]) -> None:
        self.config_path.write_text("\n".join([
            f"tickTime={TICK_MS}",
            "initLimit=20",  # 10 s for a follower to connect and sync: a cold JVM on a loaded machine
            "syncLimit=10",
            f"dataDir={self.data_dir}",
            f"clientPort={self.client_port}",
            f"clientPortAddress={HOST}",
            f"minSessionTimeout={2 * TICK_MS}",
            f"maxSessionTimeout={MAX_SESSION_TIMEOUT_MS}",
            "admin.enableServer=false",  # no Jetty admin port (8080) to collide on
            "4lw.commands.whitelist=",
            "maxClientCnxns=100",
            *(f"server.{s.myid}={HOST}:{s.quorum_port}:{s.election_port}" for s in servers),
            "",
        ]))

    def start(self) -> None:
        assert not self.alive(), "already running"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(java_command(QUORUM_MAIN, self.config_path, heap_mb=64),
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def serving(self) -> bool:
        """True once this server, in a quorum, opens a client's session."""
        if not self.alive():
            raise AssertionError(f"server.{self.myid} exited with {self.proc and self.proc.returncode}\n"
                                 + self.log_tail())
        return serves(self.hosts)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"---- server.{self.myid}\n" + "\n".join(text.splitlines()[-lines:])


class ZooKeeperEnsemble:
    """``size`` servers on loopback: ``start`` (all serving), ``restart(i)``, ``stop``."""

    def __init__(self, folder: Path, size: int = 3) -> None:
        self.servers = [EnsembleServer(folder / f"zk-{i + 1}", i + 1) for i in range(size)]
        for server in self.servers:
            server.configure(self.servers)

    @property
    def hosts(self) -> str:
        """The connect string listing every server, without a chroot."""
        return ",".join(server.hosts for server in self.servers)

    def start(self) -> ZooKeeperEnsemble:
        for server in self.servers:
            server.start()
        for server in self.servers:
            self.wait_serving(server, STARTUP_TIMEOUT_S + JOIN_TIMEOUT_S)
        return self

    def wait_serving(self, server: EnsembleServer, timeout: float = JOIN_TIMEOUT_S) -> None:
        try:
            wait_for(server.serving, timeout=timeout, interval=0.2, what=f"server.{server.myid} serving in a quorum")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n" + "\n".join(s.log_tail() for s in self.servers)) from None

    def restart(self, index: int, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop one server with ``sig`` and start it again; back once it serves (it rejoined the quorum)."""
        server = self.servers[index]
        server.stop(sig)
        server.start()
        self.wait_serving(server)

    def stop(self) -> None:
        for server in self.servers:
            if server.alive():
                assert server.proc is not None
                server.proc.kill()
                server.proc.wait(timeout=10)
