"""The broker as a child process, for the tests that drive the real
`gateway` command: a free loopback port, a readiness probe, a lifetime."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.helpers import wait_for

GATEWAY = str(Path(sys.executable).parent / "gateway")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accepting(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Process:
    """`gateway serve ...` as a child process, stopped in teardown."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        for flag in ("--mqtt-port", "--admin-port"):  # never the shared defaults in tests
            if flag not in args and "--help" not in args:
                args = [*args, flag, "0"]
        self.proc = subprocess.Popen(
            [GATEWAY, "serve", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
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
