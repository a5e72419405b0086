"""How many CPUs this process may use: what ``workers = "auto"`` starts.

Not ``os.cpu_count()``: in a container that is the node's count, while the
process may run on a few CPUs (its affinity mask) or for a few CPUs' worth of
time (its cgroup's quota: ``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us`` over
``cpu.cfs_period_us`` in v1).  The answer is the smaller of the two, rounded
down, at least 1: a pod limited to 1.5 CPUs runs one worker, as Go's
automaxprocs decides.  The quota is the tightest along the cgroup's path,
since a parent's limit binds its children.  The parsing is pure (tested with
the files' text); :func:`usable` reads the real files.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path


def quota_v2(cpu_max: str) -> float | None:
    """CPUs' worth of time from a v2 ``cpu.max`` ("max 100000" is none)."""
    parts = cpu_max.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def quota_v1(cfs_quota_us: str, cfs_period_us: str) -> float | None:
    """CPUs' worth of time from v1's quota and period (a quota of -1 is none)."""
    try:
        quota, period = int(cfs_quota_us.strip()), int(cfs_period_us.strip())
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def cgroup_paths(proc_self_cgroup: str) -> tuple[str | None, str | None]:
    """(the v2 path, the v1 cpu controller's path) from /proc/self/cgroup."""
    v2 = v1 = None
    for line in proc_self_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def tightest(path: str, quota_at: Callable[[str], float | None]) -> float | None:
    """The smallest quota from ``path`` up to the root (``quota_at`` reads one)."""
    found: float | None = None
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), -1, -1):
        quota = quota_at("/".join(parts[:depth]))
        if quota is not None and (found is None or quota < found):
            found = quota
    return found


def usable_count(affinity: int, quota: float | None) -> int:
    """The CPUs to use: the affinity, capped by the quota rounded down, at least 1."""
    count = affinity if quota is None else min(affinity, math.floor(quota))
    return max(1, count)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def usable(root: Path = Path("/sys/fs/cgroup"), proc_self_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """This process's usable CPUs (the real files; a missing one means no limit there)."""
    affinity = len(os.sched_getaffinity(0))
    v2, v1 = cgroup_paths(_read(proc_self_cgroup) or "")
    quota: float | None = None
    if v2 is not None:
        def at_v2(path: str) -> float | None:
            text = _read(root / path / "cpu.max")
            return quota_v2(text) if text is not None else None
        quota = tightest(v2, at_v2)
    if quota is None and v1 is not None:
        for mount in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
            base = root / mount
            if base.is_dir():
                def at_v1(path: str, base: Path = base) -> float | None:
                    q, p = _read(base / path / "cpu.cfs_quota_us"), _read(base / path / "cpu.cfs_period_us")
                    return quota_v1(q, p) if q is not None and p is not None else None
                quota = tightest(v1, at_v1)
                break
    return usable_count(affinity, quota)
