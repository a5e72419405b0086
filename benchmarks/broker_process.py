"""The broker under benchmark as a child process, and what the runners read
about processes from /proc (stdlib only).

``Broker`` starts ``gateway serve`` (or any --broker-cmd) on a free 127.0.0.1
port with a temporary data dir, through a shim that kills it if the runner
dies, and stops it with SIGTERM (SIGKILL after a bounded wait); its CPU seconds
and RSS are summed over its process tree.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HOST = "127.0.0.1"
CLK_TCK = os.sysconf("SC_CLK_TCK")


class ScenarioFailed(Exception):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def proc_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a wrapper script may fork the real broker)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, ()))
    return tree


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def memory_kb(pid: int) -> dict[str, int]:
    out = {"VmRSS": 0, "VmHWM": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in out:
                    out[key] = int(value.split()[0])
    except (OSError, ValueError):
        pass
    return out


# Started through this shim so the broker gets SIGKILL if the runner itself is
# killed outright (PR_SET_PDEATHSIG survives exec; the pid stays the same).
EXEC_SHIM = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]): os._exit(3)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


class Broker:
    def __init__(self, template: str) -> None:
        self.template = template
        self.tmp = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
        self.data_dir = self.tmp / "data"
        self.log_path = self.tmp / "broker.log"
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self.shutdown_s: float | None = None
        self.killed = False

    def start(self, deadline: float) -> None:
        self.port = free_port()
        cmd = shlex.split(self.template.format(port=self.port, data_dir=shlex.quote(str(self.data_dir))))
        self.command = cmd
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", EXEC_SHIM, str(os.getpid()), *cmd],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            )
        while True:
            if self.proc.poll() is not None:
                raise ScenarioFailed(f"broker exited with code {self.proc.returncode} at startup: {self.log_tail()}")
            try:
                with socket.create_connection((HOST, self.port), timeout=0.5):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"broker did not accept connections on {HOST}:{self.port} in time")
            time.sleep(0.05)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu(self) -> float:
        if not self.alive:
            return float("nan")
        return sum(cpu_seconds(p) for p in proc_tree(self.proc.pid))

    def memory_mib(self) -> dict[str, float]:
        if not self.alive:
            return {"rss_mib": float("nan"), "peak_rss_mib": float("nan")}
        rss = hwm = 0
        for p in proc_tree(self.proc.pid):
            m = memory_kb(p)
            rss += m["VmRSS"]
            hwm += m["VmHWM"]
        return {"rss_mib": rss / 1024, "peak_rss_mib": hwm / 1024}

    def stop(self, wait: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``wait`` seconds; never raises."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            t0 = time.monotonic()
            tree = proc_tree(proc.pid)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(wait)
                self.shutdown_s = time.monotonic() - t0
            except subprocess.TimeoutExpired:
                self.killed = True
                for p in tree:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except OSError:
                        pass
                proc.wait(5)
            for p in tree[1:]:  # a wrapper's children, if any outlived it
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
        self.exit_code = proc.returncode

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip()
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def cleanup(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def on_sigterm(signum, frame):  # noqa: ARG001
    """SIGTERM as SystemExit, so a runner's finally blocks stop what it started."""
    raise SystemExit(128 + signum)
