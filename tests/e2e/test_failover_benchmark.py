"""benchmarks/failover.py end to end with tiny parameters: a real ZooKeeper,
three [ha] nodes, under receipted load a SIGKILLed primary and then one cut
off from its backups (which must step down), then the
single-node comparison.  Its must-be-zero counts are zero, its JSON has
every figure the README reports, and no process it started outlives it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.zookeeper_helpers import unavailable_reason

ROOT = Path(__file__).resolve().parents[2]
BENCHMARK = ROOT / "benchmarks" / "failover.py"


def processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(f"{entry}: {cmdline}")
    return found


def test_the_failover_benchmark_runs_a_kill_and_a_cut_round_and_loses_nothing(tmp_path: Path) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    report = tmp_path / "failover.json"
    done = subprocess.run(
        [sys.executable, str(BENCHMARK), "--rounds", "2", "--seed", "7", "--producers", "2", "--window", "8",
         "--steady-seconds", "1", "--pause", "0.2", "0.6", "--faults", "kill,cut", "--json", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    result = json.loads(report.read_text())
    cluster, single = result["cluster"], result["single"]
    assert [(r["round"], r["fault"]) for r in cluster["rounds"]] == [(1, "kill"), (2, "cut")], output
    assert all(r["failover_s"] > 0 for r in cluster["rounds"]), output
    assert cluster["receipted"] > 0 and cluster["lost"] == 0 and cluster["acked_then_redelivered"] == 0, output
    assert cluster["throughput"] > 0 and single["throughput"] > 0 and single["lost"] == 0, output
    assert "lost (must be 0)" in done.stdout and "failover p50 / max" in done.stdout
    folder = re.search(r"data and logs in (\S+)", done.stdout)
    assert folder is not None, output
    assert processes_mentioning(folder[1]) == []  # ZooKeeper, the nodes, the single node: all gone
    assert not Path(folder[1]).exists()
