"""The store through its own door: what open() recovers after crashes, torn
writes, checkpoints, garbage collection, compaction and failed writes."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from core.storage import Recovered, StoredMessage
from persistence import settings
from persistence.journal import list_segments, segment_name, split_location
from persistence.offline import check, compact
from persistence.store import Store, _abandon

SEGMENT = 4096


def message(mid: str, destination: str = "/queue/a", body: bytes = b"body", **headers: str) -> StoredMessage:
    return StoredMessage(mid, destination, {"h": mid, **headers}, body, 4, 0, 1_700_000_000_000, 0)


def opened(directory: Path, **kwargs) -> tuple[Store, Recovered]:
    kwargs.setdefault("segment_bytes", SEGMENT)
    kwargs.setdefault("sync", "never")
    s = Store(directory, **kwargs)
    return s, s.open()


def crash(s: Store) -> None:
    """Write what is pending, then stop as SIGKILL would: no close()."""
    s.flush()
    _abandon(s)


def subscriptions(r: Recovered) -> dict[str, str]:
    return {s.key: s.pattern for s in r.subscriptions}


def state(r: Recovered) -> tuple:
    return (
        subscriptions(r),
        {k: [(m.id, m.destination, m.priority, m.timestamp) for m in q] for k, q in sorted(r.queues.items())},
        r.kv,
    )


def reopen(directory: Path, s: Store | None = None, **kwargs) -> tuple[Store, Recovered]:
    if s is not None:
        crash(s)
    return opened(directory, **kwargs)


def workload(s: Store) -> None:
    """A bit of everything, over several segments."""
    s.add_subscription("durable:c:s", "/topic/t")
    for i in range(60):
        s.add_message(message(f"q{i}", body=b"x" * 40), ["/queue/a"])
        s.add_message(message(f"t{i}", "/topic/t"), ["durable:c:s", "/queue/copy"])
        if i % 3 == 0:
            s.ack("/queue/a", f"q{i}")
        if i % 4 == 0:
            s.ack("/queue/copy", f"t{i}")
    s.transaction([(message("tx1"), ["/queue/a"]), (message("tx2"), ["/queue/b"])], [("/queue/a", "q1"), ("durable:c:s", "t1")])
    s.put("retained", "a/b", b"value")
    s.put("retained", "gone", b"x")
    s.delete("retained", "gone")


def test_an_empty_folder_opens_empty(tmp_path: Path) -> None:
    s, r = opened(tmp_path / "store")
    assert state(r) == ({}, {}, {}) and not r.clean and r.replayed_records == 0
    s.close()
    s, r = opened(tmp_path / "store")
    assert r.clean
    s.close()


def test_everything_survives_a_crash_and_a_clean_restart(tmp_path: Path) -> None:
    s, _ = opened(tmp_path)
    workload(s)
    s2, r = reopen(tmp_path, s)
    subs, queues, kv = state(r)
    assert subs == {"durable:c:s": "/topic/t"}
    assert kv == {"retained": {"a/b": b"value"}}
    assert [m[0] for m in queues["/queue/a"]] == [f"q{i}" for i in range(60) if i % 3 and i != 1] + ["tx1"]
    assert [m[0] for m in queues["durable:c:s"]] == [f"t{i}" for i in range(60) if i != 1]
    assert [m[0] for m in queues["/queue/copy"]] == [f"t{i}" for i in range(60) if i % 4]
    assert [m[0] for m in queues["/queue/b"]] == ["tx2"]
    assert all(m.headers is None and m.body is None for q in r.queues.values() for m in q)  # metadata only
    assert not r.clean and r.corrupt_records == 0
    full = s2.read_message(r.queues["/queue/b"][0].location)
    assert (full.id, full.headers, full.body) == ("tx2", {"h": "tx2"}, b"body")
    s2.close()
    s3, again = opened(tmp_path)
    assert again.clean and state(again) == state(r) and again.replayed_records == 0
    s3.close()


def test_a_message_is_stored_once_and_dies_with_its_last_reference(tmp_path: Path) -> None:
    s, _ = opened(tmp_path)
    s.add_subscription("d1", "/topic/t")
    s.add_subscription("d2", "/topic/t")
    s.add_message(message("m", "/topic/t", body=b"UNIQUE-BODY"), ["d1", "d2", "/queue/q"])
    s.flush()
    assert (tmp_path / segment_name(1)).read_bytes().count(b"UNIQUE-BODY") == 1
    s.ack("d1", "m")
    s.ack("/queue/q", "m")
    s, r = reopen(tmp_path, s)
    assert {k: [m.id for m in q] for k, q in r.queues.items()} == {"d2": ["m"]}
    assert r.queues["d2"][0] is not None and s.stats()["live_messages"] == 1
    s.ack("d2", "m")
    s, r = reopen(tmp_path, s)
    assert r.queues == {} and s.stats()["live_messages"] == 0
    s.close()


def test_removing_a_subscription_frees_its_messages(tmp_path: Path) -> None:
    s, _ = opened(tmp_path)
    s.add_subscription("d1", "/topic/t")
    for i in range(5):
        s.add_message(message(f"m{i}", "/topic/t"), ["d1", "d2"] if i % 2 else ["d1"])
    s.remove_subscription("d1")
    assert s.stats()["live_messages"] == 2
    s, r = reopen(tmp_path, s)
    assert subscriptions(r) == {} and {k: [m.id for m in q] for k, q in r.queues.items()} == {"d2": ["m1", "m3"]}
    s.close()


def test_a_subscription_created_after_its_messages_still_frees_them(tmp_path: Path) -> None:
    s, _ = opened(tmp_path)
    s.add_message(message("early", "/topic/t"), ["d1"])
    s.add_subscription("d1", "/topic/t")
    s.remove_subscription("d1")
    assert s.stats()["live_messages"] == 0
    s, r = reopen(tmp_path, s)
    assert r.queues == {}
    s.close()


def test_a_torn_tail_at_every_byte_of_the_last_record_loses_only_that_record(tmp_path: Path) -> None:
    orig = tmp_path / "orig"
    s, _ = opened(orig, segment_bytes=2**20)
    s.add_subscription("d", "/topic/t")
    s.add_message(message("a"), ["/queue/a"])
    before = s.appended_lsn
    last = message("b", body=b"b" * 30)
    _, last_location = s.add_message(last, ["/queue/a", "d"])
    crash(s)
    s, expected = opened(orig, segment_bytes=2**20)
    _abandon(s)
    data = (orig / segment_name(1)).read_bytes()
    start = split_location(last_location)[1]
    assert before == 2
    for cut in range(start, len(data)):
        folder = tmp_path / f"cut{cut}"
        folder.mkdir()
        (folder / segment_name(1)).write_bytes(data[:cut])
        s, r = opened(folder, segment_bytes=2**20)
        assert {k: [m.id for m in q] for k, q in r.queues.items()} == {"/queue/a": ["a"]}, cut
        assert r.torn_bytes == cut - start and r.corrupt_records == 0
        s.add_message(message("c"), ["/queue/a"])
        s, r = reopen(folder, s, segment_bytes=2**20)
        assert {k: [m.id for m in q] for k, q in r.queues.items()} == {"/queue/a": ["a", "c"]}
        assert r.torn_bytes == 0
        s.close()
    assert state(expected)[1] == {"/queue/a": [("a", "/queue/a", 4, 1_700_000_000_000), ("b", "/queue/a", 4, 1_700_000_000_000)], "d": [("b", "/queue/a", 4, 1_700_000_000_000)]}


def test_a_transaction_cut_anywhere_is_wholly_absent(tmp_path: Path) -> None:
    orig = tmp_path / "orig"
    s, _ = opened(orig, segment_bytes=2**20)
    s.add_message(message("old"), ["/queue/a"])
    s.flush()
    start = (orig / segment_name(1)).stat().st_size
    s.transaction([(message("n1"), ["/queue/a"]), (message("n2"), ["/queue/b"])], [("/queue/a", "old")])
    crash(s)
    data = (orig / segment_name(1)).read_bytes()
    for cut in range(start, len(data) + 1):
        folder = tmp_path / f"cut{cut}"
        folder.mkdir()
        (folder / segment_name(1)).write_bytes(data[:cut])
        s, r = opened(folder, segment_bytes=2**20)
        got = {k: [m.id for m in q] for k, q in r.queues.items()}
        if cut == len(data):
            assert got == {"/queue/a": ["n1"], "/queue/b": ["n2"]}
        else:
            assert got == {"/queue/a": ["old"]}, cut
        _abandon(s)


def test_a_flipped_bit_in_a_middle_record_is_reported_and_the_rest_recovered(tmp_path: Path) -> None:
    events: list[tuple[str, dict]] = []
    s, _ = opened(tmp_path, segment_bytes=2**20)
    locations = []
    for i in range(3):
        m = message(f"m{i}")
        locations.append(s.add_message(m, ["/queue/a"])[1])
    crash(s)
    path = tmp_path / segment_name(1)
    data = bytearray(path.read_bytes())
    middle = split_location(locations[1])[1]
    data[middle + 20] ^= 0x01
    path.write_bytes(bytes(data))
    s = Store(tmp_path, segment_bytes=2**20, sync="never", log=lambda e, **f: events.append((e, f)))
    r = s.open()
    assert [m.id for m in r.queues["/queue/a"]] == ["m0", "m2"]
    assert r.corrupt_records == 1
    assert events[0][0] == "record_corrupt" and events[0][1]["segment"] == str(path) and events[0][1]["offset"] == middle
    s.close()


def test_replay_after_a_checkpoint_matches_a_full_replay_and_replays_only_the_rest(tmp_path: Path) -> None:
    full, ckpt = tmp_path / "full", tmp_path / "ckpt"
    a, _ = opened(full)
    b, _ = opened(ckpt)
    for s in (a, b):
        workload(s)
    b.checkpoint()
    b.flush()
    after = 0
    for s in (a, b):
        for i in range(7):
            s.add_message(message(f"late{i}"), ["/queue/late"])
        s.ack("/queue/a", "q2")
        s.remove_subscription("durable:c:s")
    after = 9
    a, ra = reopen(full, a)
    b, rb = reopen(ckpt, b)
    assert state(ra) == state(rb)
    assert rb.replayed_records == after and ra.replayed_records == 160 + after  # workload() appends 160
    assert b.read_message(rb.queues["/queue/late"][3].location).headers == {"h": "late3"}
    a.close()
    b.close()


def test_checkpoint_is_due_after_a_segment_of_appends_and_written_by_the_next_batch(tmp_path: Path) -> None:
    s, _ = opened(tmp_path, segment_bytes=2048)
    assert not s.checkpoint_due()
    i = 0
    while not s.checkpoint_due():
        s.add_message(message(f"m{i}"), ["/queue/a"])
        i += 1
    s.checkpoint()
    assert not s.checkpoint_due()
    assert not (tmp_path / "checkpoint").exists()
    batch = s.take_batch()
    assert batch is not None and batch.checkpoint is not None and batch.sync
    s.write_batch(batch)
    s.batch_written(batch)
    assert (tmp_path / "checkpoint").exists()
    s.close()


def test_garbage_collection_deletes_dead_segments_once_a_checkpoint_allows(tmp_path: Path) -> None:
    s, _ = opened(tmp_path, segment_bytes=1024)
    for i in range(40):
        s.add_message(message(f"m{i}"), ["/queue/a"])
    s.add_message(message("keep"), ["/queue/keep"])
    for i in range(40):
        s.ack("/queue/a", f"m{i}")
    s.flush()
    segments = list_segments(tmp_path)
    assert len(segments) > 4
    assert s.collect_garbage() == []  # no checkpoint yet: replay still needs them
    assert s.checkpoint_due()
    s.checkpoint()
    s.flush()
    deleted = s.collect_garbage()
    keep_seg = split_location(s._index.messages["keep"][0])[0]
    assert deleted and segment_name(keep_seg) not in deleted and segment_name(s._journal.active_segment) not in deleted
    assert set(list_segments(tmp_path)) == set(segments) - {int(n[:8]) for n in deleted}
    s, r = reopen(tmp_path, s, segment_bytes=1024)
    assert {k: [m.id for m in q] for k, q in r.queues.items()} == {"/queue/keep": ["keep"]}
    s.close()


def test_compaction_keeps_exactly_the_live_messages_and_shrinks_the_disk(tmp_path: Path) -> None:
    s, _ = opened(tmp_path, segment_bytes=2048)
    held = {}
    for i in range(120):
        m = message(f"m{i}", body=bytes([i]) * 30)
        held[m.id] = s.add_message(m, ["/queue/a"])[1]
    for i in range(120):
        if i % 5:
            s.ack("/queue/a", f"m{i}")
    s.checkpoint()
    s.flush()
    s.collect_garbage()
    s, before = reopen(tmp_path, s, segment_bytes=2048)
    size_before = s.stats()["bytes"]
    steps = 0
    while s.compact_step(max_records=10):
        steps += 1
        s.flush()
    assert steps > 3
    # The broker still holds the old locations: they are forwarded.
    for m in before.queues["/queue/a"]:
        assert s.read_message(m.location).body == bytes([int(m.id[1:])]) * 30
    s.checkpoint()
    s.flush()
    assert s.collect_garbage()
    assert s.stats()["bytes"] < size_before
    s, after = reopen(tmp_path, s, segment_bytes=2048)
    assert state(after) == state(before)
    for m in after.queues["/queue/a"]:
        assert s.read_message(m.location).body == bytes([int(m.id[1:])]) * 30
    s.close()


def test_read_message_finds_a_record_still_pending_or_being_written(tmp_path: Path) -> None:
    s, _ = opened(tmp_path)
    m = message("pending", body=b"p")
    _, m_location = s.add_message(m, ["/queue/a"])
    assert s.read_message(m_location).body == b"p"
    batch = s.take_batch()
    tx = message("in-tx", body=b"t")
    _, [tx_location] = s.transaction([(tx, ["/queue/a"])], [])
    assert s.read_message(m_location).body == b"p"  # in the batch being written
    assert s.read_message(tx_location).body == b"t"  # pending, inside a TX
    s.write_batch(batch)
    s.batch_written(batch)
    s.flush()
    assert s.read_message(tx_location).headers == {"h": "in-tx"}
    s.close()


def enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("failing", ["pwrite", "fdatasync"])
def test_a_failed_write_is_never_durable_and_later_writes_are(tmp_path: Path, monkeypatch, failing: str) -> None:
    s, _ = opened(tmp_path, sync="always")
    s.add_message(message("before"), ["/queue/a"])
    s.add_message(message("acked-later"), ["/queue/a"])
    s.flush()
    durable = s.durable_lsn
    lost = message("lost", body=b"L" * 20)
    _, lost_location = s.add_message(lost, ["/queue/a"])
    s.ack("/queue/a", "acked-later")
    s.transaction([(message("lost-tx"), ["/queue/b"])], [("/queue/a", "before")])
    s.add_subscription("d", "/topic/t")
    batch = s.take_batch()
    with monkeypatch.context() as m:
        m.setattr(os, failing, enospc)
        with pytest.raises(OSError) as exc:
            s.write_batch(batch)
    assert exc.value.errno == errno.ENOSPC
    first, last = s.batch_failed(batch, exc.value)
    assert (first, last) == (durable + 1, s.appended_lsn)
    assert s.durable_lsn == durable
    assert s.read_message(lost_location).body == b"L" * 20  # still readable while live
    s.checkpoint()  # must leave out what never reached disk
    # A second failure reports only what is new.
    s.add_message(message("also-lost"), ["/queue/a"])
    batch = s.take_batch()
    with monkeypatch.context() as m:
        m.setattr(os, "pwrite", enospc)
        with pytest.raises(OSError) as exc:
            s.write_batch(batch)
    assert s.batch_failed(batch, exc.value) == (last + 1, s.appended_lsn)
    # Space is back.
    s.add_message(message("after"), ["/queue/a"])
    s.checkpoint()
    s.flush()
    assert s.durable_lsn == s.appended_lsn
    s, r = reopen(tmp_path, s)
    got = {k: [m.id for m in q] for k, q in r.queues.items()}
    # The adds of the failed batches are gone; its acks and subscription were retried.
    assert got == {"/queue/a": ["after"]}
    assert subscriptions(r) == {"d": "/topic/t"} and r.corrupt_records == 0
    s.close()
    report = check(tmp_path)
    assert report["corrupt_records"] == 0 and report["messages"] == 1


def test_sync_policies_decide_when_fdatasync_runs(tmp_path: Path, monkeypatch) -> None:
    calls = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real(fd)))
    for policy, expected in (("always", 3), ("never", 0)):
        calls.clear()
        s, _ = opened(tmp_path / policy, sync=policy, segment_bytes=2**20)
        for i in range(3):
            s.add_message(message(f"m{i}"), ["/queue/a"])
            s.flush()
            assert s.durable_lsn == s.appended_lsn
        assert len(calls) == expected, policy
        _abandon(s)
    calls.clear()
    s, _ = opened(tmp_path / "interval", sync="interval", interval_ms=60_000, segment_bytes=2**20)
    s._last_sync -= 120  # the interval has passed once
    for i in range(3):
        s.add_message(message(f"m{i}"), ["/queue/a"])
        s.flush()
        assert s.durable_lsn == s.appended_lsn  # durable at write, not at sync
    assert len(calls) == 1
    assert s.take_batch() is None  # interval not passed again: nothing to do
    s._last_sync -= 120
    idle = s.take_batch()  # an idle sync-only batch for what is unsynced
    assert idle is not None and idle.runs == [] and idle.sync
    s.write_batch(idle)
    s.batch_written(idle)
    assert len(calls) == 2 and s.take_batch() is None
    s.close()


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


def test_a_corrupt_checkpoint_falls_back_to_the_journal(tmp_path: Path) -> None:
    s, _ = opened(tmp_path)
    workload(s)
    s.close()
    s, good = opened(tmp_path)
    s.close()
    path = tmp_path / "checkpoint"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    events = []
    s = Store(tmp_path, segment_bytes=SEGMENT, sync="never", log=lambda e, **f: events.append(e))
    r = s.open()
    assert "checkpoint_corrupt" in events and state(r) == state(good) and r.corrupt_records == 1
    s.close()


def test_unknown_record_types_are_skipped_with_a_report(tmp_path: Path) -> None:
    s, _ = opened(tmp_path)
    s._journal.append(200, b"from the future")
    s.add_message(message("m"), ["/queue/a"])
    crash(s)
    events = []
    s = Store(tmp_path, segment_bytes=SEGMENT, sync="never", log=lambda e, **f: events.append((e, f)))
    r = s.open()
    assert [m.id for m in r.queues["/queue/a"]] == ["m"]
    assert events == [("record_type_unknown", {"segment": segment_name(1), "offset": 0, "type": 200})]
    s.close()


def test_stats_describe_segments(tmp_path: Path) -> None:
    s, _ = opened(tmp_path, segment_bytes=1024)
    workload(s)
    stats = s.stats()
    assert stats["segments"] == len(stats["dead_ratio"]) > 1
    assert stats["live_messages"] == len(s._index.messages) and stats["pending_bytes"] > 0
    s.close()


def test_copies_of_a_folder_recover_identically(tmp_path: Path) -> None:
    s, _ = opened(tmp_path / "a")
    workload(s)
    crash(s)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    s1, r1 = opened(tmp_path / "a")
    s2, r2 = opened(tmp_path / "b")
    assert state(r1) == state(r2)
    s1.close()
    s2.close()
    assert settings.SYNC_POLICIES == ("always", "interval", "never")
