"""A real ZooKeeper for the HA tests: Debian's `zookeeper` package run as a
standalone server on 127.0.0.1 at a free port, with its own data folder.

The server is the JVM itself (no wrapper script between), so a signal reaches
it: SIGSTOP/SIGCONT freeze and thaw it (a ZooKeeper that stops answering),
kill ends it, and `restart` brings it back on the same port and data folder
(sessions and persistent znodes survive, as with a real restart).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

from tests.support.helpers import wait_for
from tests.support.processes import HOST, free_port

# The Debian package's server jar; its manifest's Class-Path names the
# dependencies (netty, jetty, slf4j...) in /usr/share/java, so it is the
# whole class path.
ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
JAVA = shutil.which("java")
SERVER_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
STARTUP_TIMEOUT_S = 30.0  # a cold JVM on a loaded two-core machine
# A short tick so that short session timeouts are allowed (the server bounds
# them to [2, 20] ticks) and expiry is checked at a fine grain.
TICK_MS = 200


def unavailable_reason() -> str | None:
    """Why a ZooKeeper cannot be started here, or None when it can."""
    if JAVA is None:
        return "java is not installed (the zookeeper package needs a JRE)"
    if not ZOOKEEPER_JAR.exists():
        return f"Debian's zookeeper package is not installed (no {ZOOKEEPER_JAR}; make test installs it)"
    return None


def serves(hosts: str) -> bool:
    """True when a client session to ``hosts`` can be opened and read the root
    (a server of an ensemble only once it is part of a quorum)."""
    from kazoo.client import KazooClient
    from kazoo.handlers.threading import KazooTimeoutError

    client = KazooClient(hosts=hosts, timeout=2.0, connection_retry={"max_tries": 0})
    try:
        client.start(timeout=2.0)
        client.get_children("/")
        return True
    except KazooTimeoutError:
        return False
    finally:
        client.stop()
        client.close()


def java_command(main: str, config: Path, heap_mb: int = 128) -> list[str]:
    """A ZooKeeper JVM, small and quick to start, running ``main`` on ``config``."""
    assert JAVA is not None
    return [JAVA, f"-Xmx{heap_mb}m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", str(ZOOKEEPER_JAR), main,
            str(config)]


class ZooKeeperServer:
    """One standalone ZooKeeper: ``start``, ``freeze``/``thaw``, ``kill``, ``restart``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.data_dir = folder / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = folder / "zookeeper.log"
        self.port = free_port()
        self.config_path = folder / "zoo.cfg"
        self.config_path.write_text(
            "\n".join([
                f"tickTime={TICK_MS}",
                f"dataDir={self.data_dir}",
                f"clientPort={self.port}",
                f"clientPortAddress={HOST}",
                "minSessionTimeout=400",
                "maxSessionTimeout=20000",
                "admin.enableServer=false",  # no Jetty admin port (8080) to collide on
                "4lw.commands.whitelist=",  # no four-letter-word commands at all
                "maxClientCnxns=100",
                "",
            ])
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        """The connect string, without a chroot."""
        return f"{HOST}:{self.port}"

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        assert JAVA is not None
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                java_command(SERVER_MAIN, self.config_path),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        wait_for(self.serving, timeout=STARTUP_TIMEOUT_S, interval=0.1, what=f"ZooKeeper serving on {self.hosts}")

    def serving(self) -> bool:
        """True once a client session can be opened and read the root."""
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"ZooKeeper exited with {self.proc and self.proc.returncode}: {self.log_tail()}")
        return serves(self.hosts)

    def freeze(self) -> None:
        """SIGSTOP: the server holds its sockets but answers nothing and expires nothing."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # SIGKILL works on a stopped process too
            self.proc.wait(timeout=10)

    def restart(self) -> None:
        """Kill and start again on the same port and data folder."""
        self.kill()
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
