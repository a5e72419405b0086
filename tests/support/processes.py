"""The broker as a child process, for the tests that drive the real
`gateway` command: a free loopback port, a readiness probe, a lifetime
(Process), or many lifetimes on one data folder (BrokerProcess)."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.helpers import wait_for

GATEWAY = str(Path(sys.executable).parent / "gateway")
HOST = "127.0.0.1"
STARTUP_TIMEOUT = 30.0  # recovery of a store included


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


_EPHEMERAL = _ephemeral_range()
_handed: set[int] = set()


def free_port() -> int:
    """A loopback port nobody listens on, from below the kernel's ephemeral
    range: a broker killed and started again on it (the HA and durability
    tests do) could otherwise find it taken meanwhile as the source port of
    some outgoing connection (a ZooKeeper client, a replication link).  Never
    the same port twice in one test run, so two taken before either is bound
    differ."""
    low = 10000
    high = _EPHEMERAL[0] - 1
    for _ in range(200) if high - low > 1000 else ():
        port = random.randint(low, high)
        if port in _handed:
            continue
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
        _handed.add(port)
        return port
    with socket.socket() as s:  # no room below the ephemeral range: any free one
        s.bind((HOST, 0))
        return s.getsockname()[1]


def accepting(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.2):
            return True
    except OSError:
        return False


class Process:
    """`gateway serve ...` as a child process, stopped in teardown."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        for flag in ("--mqtt-port", "--admin-port"):  # never the shared defaults in tests
            if flag not in args and "--help" not in args:
                args = [*args, flag, "0"]
        self.proc = subprocess.Popen(
            [GATEWAY, "serve", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=None if env is None else {**os.environ, **env},
        )
        self.stdout = ""
        self.stderr = ""

    def wait_listening(self, port: int) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"gateway exited with {self.proc.returncode}: {self.proc.stderr.read()}")
            return accepting(port)

        wait_for(ready, timeout=10, interval=0.02, what=f"gateway listening on {port}")

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait_exit(self, timeout: float = 5.0) -> int:
        self.stdout, self.stderr = self.proc.communicate(timeout=timeout)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.stdout, self.stderr = self.proc.communicate()


class BrokerProcess:
    """``gateway serve`` on one data folder, started and stopped many times.

    The output of every lifetime goes to one log file (a pipe could fill up
    and stall the broker); :meth:`log_tail` shows it in failure messages.
    """

    def __init__(self, tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = tmp_path / "data"
        self.log_path = tmp_path / "broker.log"
        self.extra = list(extra)
        self.env = None if env is None else {**os.environ, **env}
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.lifetimes = 0

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        for attempt in range(3):
            self.lifetimes += 1
            with open(self.log_path, "ab") as log:
                log.write(f"\n==== lifetime {self.lifetimes} (port {self.port}) ====\n".encode())
                log.flush()
                self.proc = subprocess.Popen(
                    [GATEWAY, "serve", "--bind", HOST, "--stomp-port", str(self.port), "--mqtt-port", "0",
                     "--admin-port", "0", "--data-dir", str(self.data_dir), "--log-level", "info", *self.extra],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.data_dir.parent,
                    env=self.env,
                )
            deadline = time.monotonic() + STARTUP_TIMEOUT
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                if accepting(self.port):
                    return
                time.sleep(0.01)
            else:
                self.kill()
                raise AssertionError(f"broker not listening after {STARTUP_TIMEOUT} s:\n{self.log_tail()}")
            # Exited: if someone took the port meanwhile, try another one.
            if "startup_failed" in self.log_tail(5) and attempt < 2:
                self.port = free_port()
                continue
            raise AssertionError(f"broker exited with {self.proc.returncode} at startup:\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: no chance to flush anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait for the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"broker did not exit within {timeout} s of SIGTERM:\n{self.log_tail()}") from None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
