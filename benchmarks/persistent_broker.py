"""The broker of the persistence benchmarks: run.py's broker process that can
be restarted on the same data folder and killed, whose JSON log is kept across
its lifetimes and read back (``store_stats``, ``store_recovered``)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time

import broker_process
from broker_process import EXEC_SHIM, HOST, ROOT, free_port


class Failed(Exception):
    pass


class Broker(broker_process.Broker):
    """broker_process.Broker that can be restarted on the same data folder and killed,
    and whose log (JSON lines at INFO) is kept across lifetimes."""

    def start(self, deadline: float, *, keep_port: bool = False) -> float:
        """Start; return seconds from exec to the port accepting connections."""
        if not keep_port or not self.port:
            self.port = free_port()
        cmd = shlex.split(self.template.format(port=self.port, data_dir=shlex.quote(str(self.data_dir))))
        self.command = cmd
        self.exit_code = None
        self.shutdown_s = None
        with open(self.log_path, "ab") as log:
            log.write(b'{"event": "bench_broker_exec"}\n')
            log.flush()
            t0 = time.monotonic()
            self.proc = subprocess.Popen(
                [sys.executable, "-c", EXEC_SHIM, str(os.getpid()), *cmd],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            )
        while True:
            if self.proc.poll() is not None:
                raise Failed(f"broker exited with code {self.proc.returncode} at startup: {self.log_tail()}")
            try:
                with socket.create_connection((HOST, self.port), timeout=0.5):
                    return time.monotonic() - t0
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise Failed(f"broker did not accept connections on {HOST}:{self.port} in time")
            time.sleep(0.002)

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


def fsyncs(record: dict) -> int | None:
    for key in ("fsyncs", "fsync_count", "syncs"):
        if isinstance(record.get(key), int):
            return record[key]
    return None


def stats_lines(broker: Broker) -> list[dict]:
    return [r for r in broker.records() if r.get("event") == "store_stats"]


def default_broker_cmd() -> str:
    gateway = ROOT / ".venv" / "bin" / "gateway"
    base = shlex.quote(str(gateway)) if gateway.exists() else f"{shlex.quote(sys.executable)} -m gateway"
    # INFO and JSON: the store_stats and store_recovered lines are read back.
    return base + " serve --stomp-port {port} --mqtt-port 0 --admin-port 0 --data-dir {data_dir} --log-level info --log-format json"
