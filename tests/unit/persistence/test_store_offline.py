"""The offline tools on a store's folder: check reports without changing
anything, compact keeps the state and frees disk, and both refuse a store
in use."""

from __future__ import annotations

from pathlib import Path

import pytest

from persistence.journal import list_segments, segment_name
from persistence.offline import check, compact
from tests.support.store_helpers import crash, message, opened, reopen, state, workload


def test_check_reports_without_changing_anything(tmp_path: Path) -> None:
    s, _ = opened(tmp_path)
    workload(s)
    s.checkpoint()
    s.flush()
    s.add_message(message("tail"), ["/queue/a"])
    crash(s)
    last = tmp_path / segment_name(list_segments(tmp_path)[-1])
    last.write_bytes(last.read_bytes()[:-5])
    first = tmp_path / segment_name(1)
    data = bytearray(first.read_bytes())
    data[30] ^= 0xFF
    first.write_bytes(bytes(data))
    snapshot = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    seen = []
    report = check(tmp_path, progress=lambda done, total: seen.append((done, total)))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == snapshot
    assert report["corrupt_records"] == 1 and report["corruptions"][0]["segment"] == segment_name(1)
    assert report["torn_bytes"] > 0 and report["checkpoint"]["present"]
    assert report["subscriptions"] == 1 and report["kv_keys"] == 1
    assert report["keys"]["/queue/b"] == 1 and report["destinations"]["/topic/t"] == 60
    assert seen[-1][0] == seen[-1][1] == report["bytes"]


def test_offline_compaction_keeps_the_state_and_frees_disk(tmp_path: Path) -> None:
    s, _ = opened(tmp_path, segment_bytes=2048)
    workload(s)
    for i in range(0, 60, 2):
        s.ack("/queue/a", f"q{i}")
    s, before = reopen(tmp_path, s, segment_bytes=2048)
    s.close()
    bytes_before = sum(p.stat().st_size for p in tmp_path.glob("*.log"))
    report = compact(tmp_path)
    assert report["deleted"] and report["bytes_after"] < report["bytes_before"] == bytes_before
    s, after = opened(tmp_path, segment_bytes=2048)
    assert state(after) == state(before) and after.clean
    for q in after.queues.values():
        for m in q:
            assert s.read_message(m.location).headers["h"] == m.id
    s.close()
    assert check(tmp_path)["corrupt_records"] == 0


def test_offline_tools_refuse_a_store_in_use(tmp_path: Path) -> None:
    s, _ = opened(tmp_path)
    with pytest.raises(OSError, match="running broker"):
        check(tmp_path)
    with pytest.raises(OSError, match="in use"):
        compact(tmp_path)
    s.close()
