"""A backup's store (persistence/replica/follower.py) through its door: batches a
real primary Store takes as its committer does, carried through the
replication codec, applied to a Follower in another folder; then the
follower's folder opened as a plain Store recovers exactly the primary's
state.  Epochs, gaps, bad batches and a crash mid-apply."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from persistence.journal import list_segments
from persistence.replica import epochs
from persistence.replica import replication as r
from persistence.replica.catchup import Refusal
from persistence.replica.replication import split_runs
from persistence.store import Store
from tests.support.replication_helpers import commit, everything, folder_state, follower, primary, ship
from tests.support.store_helpers import message


def test_a_follower_recovers_exactly_what_the_primary_holds(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    f = follower(tmp_path / "f")
    assert (f.epoch, f.last_lsn, f.history) == (0, 0, ())
    acks = []
    for round_ in range(3):  # several batches, as group commit makes them
        everything(p, tag=str(round_))
        acks += ship(commit(p), f)
    assert acks[-1] == r.Ack(1, p.durable_lsn) and f.last_lsn == p.durable_lsn
    assert [a.lsn for a in acks] == sorted(a.lsn for a in acks)
    f.close()
    p.close()
    assert folder_state(tmp_path / "f") == folder_state(tmp_path / "p")
    # The folder is the primary's, byte for byte, in its journal.
    for seg in list_segments(tmp_path / "p" / "store"):
        name = f"{seg:08d}.log"
        assert (tmp_path / "f" / "store" / name).read_bytes() == (tmp_path / "p" / "store" / name).read_bytes()


def test_compaction_and_garbage_collection_replicate_as_ordinary_records(tmp_path: Path) -> None:
    p = primary(tmp_path / "p", segment_bytes=1024)
    f = follower(tmp_path / "f")
    for i in range(80):
        p.add_message(message(f"m{i}", body=b"y" * 30), ["/queue/a"])
    for i in range(80):
        if i % 10:
            p.ack("/queue/a", f"m{i}")
    ship(commit(p), f)
    for _ in range(100):
        if not p.compact_step():
            break
        ship(commit(p), f)
    p.checkpoint()
    ship(commit(p), f)
    assert p.collect_garbage()  # the primary deletes segments; the follower's are its own
    f.checkpoint()
    f.flush()
    assert f.collect_garbage()
    p.add_message(message("late"), ["/queue/a"])
    ship(commit(p), f)
    f.close()
    p.close()
    assert folder_state(tmp_path / "f") == folder_state(tmp_path / "p")


def test_the_folder_is_a_valid_store_after_every_batch(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    f = follower(tmp_path / "f")
    for i in range(5):
        everything(p, n=6, tag=str(i))
        ship(commit(p), f)
        lsn = f.last_lsn
        f.abandon()  # as a crash: nothing flushed, no checkpoint, not clean
        assert folder_state(tmp_path / "f")[3] == lsn
        f = follower(tmp_path / "f")
        assert f.last_lsn == lsn
    f.close()
    p.close()
    assert folder_state(tmp_path / "f") == folder_state(tmp_path / "p")


def test_a_follower_checkpoints_and_later_opens_from_its_checkpoint(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    f = follower(tmp_path / "f")
    everything(p, tag="a")
    ship(commit(p), f)
    f.checkpoint()
    everything(p, tag="b")
    ship(commit(p), f)  # the checkpoint goes with this batch's worker step
    assert (tmp_path / "f" / "store" / "checkpoint").exists()
    f.close()
    f = follower(tmp_path / "f")
    assert f.last_lsn == p.durable_lsn
    f.close()
    p.close()
    assert folder_state(tmp_path / "f") == folder_state(tmp_path / "p")


def test_an_older_epoch_is_refused_a_newer_one_saved_before_it_is_acked(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    f = follower(tmp_path / "f")
    p.add_message(message("m1"), ["/queue/a"])
    (first,) = commit(p, epoch=3)
    step = f.receive(first)
    f.write(step)
    assert epochs.load(tmp_path / "f" / "store") == ((3, 1),)  # durable before the ack exists
    assert f.written(step) == r.Ack(3, 1)
    p.add_message(message("m2"), ["/queue/a"])
    (stale,) = commit(p, epoch=2)
    with pytest.raises(Refusal, match="stale epoch 2"):
        f.apply(stale)
    with pytest.raises(Refusal, match="stale epoch 2"):
        f.accept_primary(r.Hello("old", 2, 2, ((2, 1),)))
    newer = r.Batch(5, stale.first_lsn, stale.last_lsn, stale.runs)
    assert f.apply(newer) == r.Ack(5, 2)
    f.close()
    f = follower(tmp_path / "f")
    assert (f.epoch, f.history, f.hello("b")) == (5, ((3, 1), (5, 2)), r.Hello("b", 5, 2, ((3, 1), (5, 2))))
    f.close()
    p.close()


def test_a_gap_or_an_overlap_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    f = follower(tmp_path / "f")
    p.add_message(message("m1"), ["/queue/a"])
    (one,) = commit(p)
    p.add_message(message("m2"), ["/queue/a"])
    (two,) = commit(p)
    with pytest.raises(Refusal, match="gap: expected lsn 1, got 2"):
        f.apply(two)
    assert list_segments(tmp_path / "f" / "store") == []
    f.apply(one)
    with pytest.raises(Refusal, match="gap: expected lsn 2, got 1"):
        f.apply(one)  # applied twice: refused too
    moved = r.Batch(1, 2, 2, ((1, two.runs[0][1] + 1, two.runs[0][2]),))
    with pytest.raises(Refusal, match="gap: a record at segment 1"):
        f.apply(moved)  # the right LSN at the wrong place
    assert f.apply(two) == r.Ack(1, 2)
    f.close()
    p.close()
    assert folder_state(tmp_path / "f") == folder_state(tmp_path / "p")


def test_a_batch_whose_records_do_not_check_out_is_refused(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    f = follower(tmp_path / "f")
    p.add_message(message("m1"), ["/queue/a"])
    p.ack("/queue/a", "m1")
    (batch,) = commit(p)
    seg, offset, data = batch.runs[0]
    flipped = bytearray(data)
    flipped[20] ^= 0xFF
    with pytest.raises(Refusal, match="bad batch: segment 1 offset 0: checksum mismatch"):
        f.apply(r.Batch(1, 1, 2, ((seg, offset, bytes(flipped)),)))
    with pytest.raises(Refusal, match="bad batch: 2 records for lsn 1..3"):
        f.apply(r.Batch(1, 1, 3, batch.runs))
    with pytest.raises(Refusal, match="no records"):
        f.apply(r.Batch(1, 1, 0, ()))
    assert f.apply(batch) == r.Ack(1, 2)
    f.close()
    p.close()


def test_a_crash_mid_apply_recovers_a_valid_prefix_and_the_rest_follows(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    f = follower(tmp_path / "f")
    everything(p, n=5, tag="a")
    ship(commit(p), f)
    before = f.last_lsn
    everything(p, n=10, tag="b")
    (batch,) = commit(p)
    step = f.receive(batch)
    f.write(step)
    # The crash: the write never reached the disk whole (no sync; cut in the middle of a record).
    seg, offset, data = batch.runs[-1]
    path = tmp_path / "f" / "store" / f"{seg:08d}.log"
    os.truncate(path, offset + len(data) // 2)
    f.abandon()
    recovered_lsn = folder_state(tmp_path / "f")[3]  # a plain Store: the torn record cut
    f = follower(tmp_path / "f")
    assert before < f.last_lsn < batch.last_lsn  # a prefix of the batch
    assert f.last_lsn == recovered_lsn
    # The primary resends from the follower's next LSN (a Hello says where).
    pieces = [r.Batch(1, first, last, runs) for first, last, runs in split_runs(batch.first_lsn, batch.runs, 1)]
    ship([x for x in pieces if x.first_lsn > f.last_lsn], f)
    f.close()
    p.close()
    assert folder_state(tmp_path / "f") == folder_state(tmp_path / "p")


def test_a_promoted_follower_is_the_new_primary_and_numbers_on(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    f = follower(tmp_path / "f")
    everything(p)
    ship(commit(p), f)
    last = f.last_lsn
    directory = f.promote()
    expected = folder_state(tmp_path / "f")
    s = Store(directory, sync="never", segment_bytes=4096)
    recovered = s.open()
    assert not recovered.clean  # what was on its way to the old primary's consumers is unknown
    assert s.appended_lsn == last
    assert s.add_message(message("next"), ["/queue/a"]) and s.appended_lsn == last + 1
    s.abandon()
    p.close()
    assert expected[:3] == folder_state(tmp_path / "p")[:3]


def test_a_follower_never_compacts(tmp_path: Path) -> None:
    f = follower(tmp_path / "f")
    assert f.compact_step(min_dead_ratio=0.0) is False
    f.close()


def test_consecutive_batches_go_to_disk_as_one_step_with_one_sync_and_one_ack(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    f = follower(tmp_path / "f")
    frames = []
    for round_ in range(3):
        everything(p, n=5, tag=str(round_))
        frames += commit(p)
    assert len(frames) >= 3
    syncs = f.stats()["fsyncs"]
    assert f.apply(*frames) == r.Ack(1, frames[-1].last_lsn)
    # One fdatasync at the end, and one per segment left behind (synced before the next gets data).
    segments = {seg for frame in frames for seg, _offset, _data in frame.runs}
    assert f.stats()["fsyncs"] == syncs + len(segments) < syncs + len(frames) + len(segments) - 1
    f.close()
    p.close()
    assert folder_state(tmp_path / "f") == folder_state(tmp_path / "p")


def test_a_gap_inside_a_group_refuses_the_whole_group_and_writes_nothing(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    f = follower(tmp_path / "f")
    frames = []
    for round_ in range(3):
        everything(p, n=3, tag=str(round_))
        frames += commit(p)
    before = {name: (tmp_path / "f" / "store" / name).read_bytes() for name in os.listdir(tmp_path / "f" / "store")
              if name.endswith(".log")}
    with pytest.raises(Refusal, match=f"gap: expected lsn {frames[1].first_lsn}, got {frames[2].first_lsn}"):
        f.apply(frames[0], frames[2])
    assert f.last_lsn == 0
    after = {name: (tmp_path / "f" / "store" / name).read_bytes() for name in os.listdir(tmp_path / "f" / "store")
             if name.endswith(".log")}
    assert after == before
    assert f.apply(*frames).lsn == frames[-1].last_lsn  # the same frames, in order, then go through
    f.close()
    p.close()


def test_the_index_is_built_from_the_folder_only_when_needed(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    f = follower(tmp_path / "f")
    everything(p, n=10)
    ship(commit(p), f)
    assert f.index_behind  # nothing replayed per batch
    stats = f.stats()  # rebuilt here, as a restart's recovery would
    assert not f.index_behind
    assert stats["live_messages"] == p.stats()["live_messages"] > 0
    assert stats["subscriptions"] == p.stats()["subscriptions"]
    everything(p, n=4, tag="more")
    ship(commit(p), f)
    f.checkpoint()  # from a rebuilt index: it describes everything written
    f.flush()
    assert not f.index_behind
    f.close()
    p.close()
    assert folder_state(tmp_path / "f") == folder_state(tmp_path / "p")


def test_upkeep_checkpoints_when_due_and_deletes_the_backups_dead_segments(tmp_path: Path) -> None:
    # A backup's own upkeep, between writes: without it its journal would grow
    # for ever and a promotion would replay all of it.
    p = primary(tmp_path / "p", segment_bytes=1024)
    f = follower(tmp_path / "f")
    assert f.upkeep() == []  # nothing written: nothing due
    for i in range(80):
        p.add_message(message(f"m{i}", body=b"y" * 30), ["/queue/a"])
    ship(commit(p), f)
    for i in range(80):
        p.ack("/queue/a", f"m{i}")
    ship(commit(p), f)
    before = list_segments(tmp_path / "f" / "store")
    assert f.checkpoint_due()
    deleted = f.upkeep()
    assert deleted and len(list_segments(tmp_path / "f" / "store")) < len(before)
    assert not f.checkpoint_due()
    # What it keeps still recovers to the primary's state, and it follows on.
    p.add_message(message("late"), ["/queue/a"])
    ship(commit(p), f)
    f.close()
    p.close()
    assert folder_state(tmp_path / "f") == folder_state(tmp_path / "p")
