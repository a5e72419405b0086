"""How many CPUs this process may use (gateway/workers/cpus.py): affinity and cgroup quota, not the node's count."""

from __future__ import annotations

import os
from pathlib import Path

from gateway.workers import cpus


def test_cgroup_v2_quota() -> None:
    assert cpus.quota_v2("max 100000\n") is None
    assert cpus.quota_v2("200000 100000\n") == 2.0
    assert cpus.quota_v2("150000 100000") == 1.5
    assert cpus.quota_v2("garbage") is None


def test_cgroup_v1_quota() -> None:
    assert cpus.quota_v1("-1\n", "100000\n") is None
    assert cpus.quota_v1("50000", "100000") == 0.5
    assert cpus.quota_v1("x", "100000") is None


def test_the_cgroup_paths_of_a_hybrid_and_a_v2_host() -> None:
    hybrid = "4:memory:/pod\n2:cpuacct:/\n1:cpu,cpuacct:/kubepods/pod1/c1\n0::/kubepods/pod1/c1\n"
    assert cpus.cgroup_paths(hybrid) == ("/kubepods/pod1/c1", "/kubepods/pod1/c1")
    assert cpus.cgroup_paths("0::/user.slice\n") == ("/user.slice", None)


def test_a_parents_quota_binds_its_children() -> None:
    quotas = {"": None, "kubepods": 4.0, "kubepods/pod1": 1.5, "kubepods/pod1/c1": None}
    assert cpus.tightest("/kubepods/pod1/c1", quotas.get) == 1.5


def test_the_count_is_the_affinity_capped_by_the_quota_rounded_down_and_at_least_one() -> None:
    assert cpus.usable_count(16, None) == 16  # no quota: what the process may run on
    assert cpus.usable_count(16, 2.0) == 2  # a pod limited to 2 CPUs on a 16-core node
    assert cpus.usable_count(16, 1.5) == 1
    assert cpus.usable_count(2, 8.0) == 2  # pinned to two of them
    assert cpus.usable_count(16, 0.5) == 1


def test_the_files_of_a_limited_v2_container(tmp_path: Path) -> None:
    (tmp_path / "proc").write_text("0::/pod/c1\n")
    (tmp_path / "pod" / "c1").mkdir(parents=True)
    (tmp_path / "pod" / "cpu.max").write_text("300000 100000\n")
    (tmp_path / "pod" / "c1" / "cpu.max").write_text("max 100000\n")
    expected = min(len(os.sched_getaffinity(0)), 3)
    assert cpus.usable(root=tmp_path, proc_self_cgroup=tmp_path / "proc") == expected


def test_the_files_of_a_limited_v1_container(tmp_path: Path) -> None:
    (tmp_path / "proc").write_text("3:cpu,cpuacct:/docker/abc\n")
    group = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    group.mkdir(parents=True)
    (group / "cpu.cfs_quota_us").write_text("100000\n")
    (group / "cpu.cfs_period_us").write_text("100000\n")
    assert cpus.usable(root=tmp_path, proc_self_cgroup=tmp_path / "proc") == 1


def test_no_cgroup_files_means_the_affinity(tmp_path: Path) -> None:
    assert cpus.usable(root=tmp_path, proc_self_cgroup=tmp_path / "missing") == len(os.sched_getaffinity(0))
