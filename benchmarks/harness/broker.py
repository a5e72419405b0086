"""The broker under benchmark as a child process (every runner's one
launcher), and what the runners read about processes from /proc (stdlib only).

``Broker`` starts ``gateway serve`` (or any --broker-cmd) on a free 127.0.0.1
port with a temporary data dir, through a shim that kills it if the runner
dies, and stops it with SIGTERM (SIGKILL after a bounded wait); its CPU seconds
and RSS are summed over its process tree.  The persistence benchmarks also
restart it on the same data folder (and port), kill it, and read back its JSON
log, which is kept across its lifetimes.
"""

from __future__ import annotations

import json
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

BENCHMARKS = Path(__file__).resolve().parents[1]
ROOT = BENCHMARKS.parent
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

    def start(self, deadline: float, *, keep_port: bool = False) -> float:
        """Start (again, on the same data folder; on the same port with
        ``keep_port``); return seconds from exec to the port accepting connections."""
        if not keep_port or not self.port:
            self.port = free_port()
        cmd = shlex.split(self.template.format(port=self.port, data_dir=shlex.quote(str(self.data_dir))))
        self.command = cmd
        self.exit_code = None
        self.shutdown_s = None
        with open(self.log_path, "ab") as log:  # appended: one log across lifetimes
            log.write(b'{"event": "bench_broker_exec"}\n')
            log.flush()
            t0 = time.monotonic()
            self.proc = subprocess.Popen(
                [sys.executable, "-c", EXEC_SHIM, str(os.getpid()), *cmd],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            )
        while True:
            if self.proc.poll() is not None:
                raise ScenarioFailed(f"broker exited with code {self.proc.returncode} at startup: {self.log_tail()}")
            try:
                with socket.create_connection((HOST, self.port), timeout=0.5):
                    return time.monotonic() - t0
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"broker did not accept connections on {HOST}:{self.port} in time")
            # Short: a restart's time to accept is measured by this loop.
            time.sleep(0.002)

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

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        if self.proc is not None:
            self.exit_code = self.proc.returncode

    def records(self) -> list[dict]:
        """The broker's JSON log lines (others ignored), all lifetimes."""
        out = []
        try:
            with open(self.log_path, "rb") as f:
                for line in f:
                    if line.startswith(b"{"):
                        try:
                            out.append(json.loads(line))
                        except ValueError:
                            pass
        except OSError:
            pass
        return out

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip()
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def cleanup(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def fsyncs(record: dict) -> int | None:
    for key in ("fsyncs", "fsync_count", "syncs"):
        if isinstance(record.get(key), int):
            return record[key]
    return None


def stats_lines(broker: Broker) -> list[dict]:
    return [r for r in broker.records() if r.get("event") == "store_stats"]


def default_broker_cmd(*, json_log: bool = False) -> str:
    """``gateway serve`` from this checkout's virtualenv (or ``python -m
    gateway``), {port} and {data_dir} left to substitute.  ``json_log``: INFO
    and JSON, for the runners that read the store_stats and store_recovered
    lines back (``Broker.records``)."""
    gateway = ROOT / ".venv" / "bin" / "gateway"
    base = shlex.quote(str(gateway)) if gateway.exists() else f"{shlex.quote(sys.executable)} -m gateway"
    log = "--log-level info --log-format json" if json_log else "--log-level warning"
    return base + " serve --stomp-port {port} --mqtt-port 0 --admin-port 0 --data-dir {data_dir} " + log


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def on_sigterm(signum, frame):  # noqa: ARG001
    """SIGTERM as SystemExit, so a runner's finally blocks stop what it started."""
    raise SystemExit(128 + signum)
