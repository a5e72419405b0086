"""Catch-up (persistence/replica/catchup.py): what a primary answers a backup's
Hello, the snapshot of a live primary Store streamed through the codec into a
Follower while the primary keeps appending, divergence of a former primary
resolved by a snapshot, and a snapshot cut short."""

from __future__ import annotations

from pathlib import Path

import pytest

from persistence.journal import list_segments
from persistence.replica import epochs
from persistence.replica import replication as r
from persistence.replica.catchup import Answer, Plan, Refusal, SnapshotSource, plan
from persistence.store import Store
from tests.support.replication_helpers import commit, everything, folder_state, follower, primary, send_snapshot, ship
from tests.support.store_helpers import message

H1 = ((1, 1),)


def test_the_answer_to_a_hello() -> None:
    history = ((1, 1), (3, 41))
    # Consistent and still kept: the tail from its next LSN.
    assert plan(r.Hello("b", 1, 30, H1), history, 50, oldest_lsn=20) == Plan(Answer.TAIL, from_lsn=31)
    assert plan(r.Hello("b", 3, 50, history), history, 50, oldest_lsn=51) == Plan(Answer.TAIL, from_lsn=51)
    # Empty, or further behind than the kept batches: a snapshot.
    assert plan(r.Hello("b", 0, 0, ()), history, 50, oldest_lsn=20).answer is Answer.SNAPSHOT
    assert plan(r.Hello("b", 1, 10, H1), history, 50, oldest_lsn=20).reason == "behind: lsn 11 is no longer kept (from 20)"
    # Records of epoch 1 past where epoch 3 began here, or more than we have: diverged.
    assert plan(r.Hello("b", 1, 45, H1), history, 50, oldest_lsn=20).reason.startswith("diverged")
    assert plan(r.Hello("b", 3, 60, history), history, 50, oldest_lsn=20).answer is Answer.SNAPSHOT
    # It accepted a newer epoch than ours: we are a stale primary.
    assert plan(r.Hello("b", 4, 30, ((1, 1), (4, 31))), history, 50, oldest_lsn=1) == Plan(
        Answer.REFUSE, reason="stale epoch 3: the backup accepted epoch 4")


def test_the_divergence_rule() -> None:
    primary_history = ((1, 1), (2, 11), (5, 30))
    assert not epochs.diverged(primary_history, 40, ((1, 1),), 10)
    assert epochs.diverged(primary_history, 40, ((1, 1),), 11)  # lsn 11 is epoch 2's here
    assert not epochs.diverged(primary_history, 40, ((1, 1), (2, 11)), 29)
    assert epochs.diverged(primary_history, 40, ((1, 1), (2, 11), (4, 25)), 26)
    assert not epochs.diverged(primary_history, 40, (), 0)
    assert epochs.epoch_of(primary_history, 30) == 5 and epochs.epoch_of(primary_history, 0) == 0
    with pytest.raises(ValueError, match="older"):
        epochs.extended(primary_history, 4, 41)


def test_catch_up_from_empty_while_the_primary_keeps_appending(tmp_path: Path) -> None:
    p = primary(tmp_path / "p", segment_bytes=1024)
    everything(p, tag="a")
    for i in range(40):
        p.add_message(message(f"old{i}", body=b"o" * 40), ["/queue/old"])
    commit(p)
    p.checkpoint()
    everything(p, tag="b")  # after the checkpoint: replayed from the copied journal
    commit(p)
    source = SnapshotSource(p, 1, H1)
    assert source.lsn == p.durable_lsn
    # The primary goes on: more batches (forwarded from lsn + 1), a newer
    # checkpoint, dead segments deleted, all while the snapshot is read.
    everything(p, tag="c")
    for i in range(40):
        p.ack("/queue/old", f"old{i}")
    later = commit(p)
    p.checkpoint()
    later += commit(p)
    assert p.collect_garbage()
    assert later[0].first_lsn == source.lsn + 1
    f = follower(tmp_path / "f")
    ack = send_snapshot(source, f)
    assert ack == r.Ack(1, source.lsn) and f.history == H1
    everything(p, tag="d")
    later += commit(p)
    acks = ship(later, f)
    assert acks[-1].lsn == p.durable_lsn
    f.close()
    p.close()
    assert folder_state(tmp_path / "f") == folder_state(tmp_path / "p")


def test_a_snapshot_replaces_what_a_backup_held(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    f = follower(tmp_path / "f")
    everything(p, tag="a")
    ship(commit(p), f)
    f.close()
    everything(p, tag="b")
    commit(p)
    f = follower(tmp_path / "f")
    send_snapshot(SnapshotSource(p, 1, H1), f, chunk_bytes=333)
    f.close()
    p.close()
    assert folder_state(tmp_path / "f") == folder_state(tmp_path / "p")


def test_a_former_primary_with_records_the_new_one_never_had_is_copied_again(tmp_path: Path) -> None:
    # Node A is the primary of epoch 1; node B follows it.
    a = primary(tmp_path / "a")
    epochs.save(tmp_path / "a" / "store", H1)
    b = follower(tmp_path / "b")
    everything(a, tag="x")
    ship(commit(a), b)
    shared = b.last_lsn
    # A writes more that never reaches B, and dies.
    everything(a, tag="lost")
    commit(a)
    a_lsn = a.durable_lsn
    a.abandon()
    # B becomes the primary of epoch 2 and goes on.
    store_dir = b.promote()
    nb = Store(store_dir, segment_bytes=4096, sync="never", archive=b.archive)
    nb.open()
    history = epochs.extended(epochs.load(store_dir), 2, nb.appended_lsn + 1)
    epochs.save(store_dir, history)
    everything(nb, n=40, tag="new")
    commit(nb, epoch=2)
    assert nb.durable_lsn > a_lsn  # more records, and still A's are not B's
    # A rejoins as a backup: its Hello shows records of epoch 1 past lsn `shared`.
    fa = follower(tmp_path / "a")
    assert (fa.epoch, fa.last_lsn) == (1, a_lsn)
    decision = plan(fa.hello("a"), history, nb.durable_lsn, oldest_lsn=shared + 1)
    assert decision.answer is Answer.SNAPSHOT and decision.reason.startswith("diverged")
    assert not fa.copying
    assert fa.accept_primary(r.Hello("b", 2, nb.durable_lsn, history)) is False
    assert fa.copying  # its LSN says nothing now: it may not lead (it publishes role syncing)
    nb.add_message(message("next"), ["/queue/a"])
    (tail,) = commit(nb, epoch=2)
    with pytest.raises(Refusal, match="a snapshot is needed"):
        fa.apply(tail)
    source = SnapshotSource(nb, 2, history)  # taken after `tail`: it holds it
    assert send_snapshot(source, fa) == r.Ack(2, nb.durable_lsn)
    assert fa.history == history and fa.epoch == 2 and not fa.copying
    fa.close()
    nb.close()
    assert folder_state(tmp_path / "a") == folder_state(tmp_path / "b")


def test_a_snapshot_cut_short_leaves_no_store_and_is_wiped_at_the_next_open(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    everything(p)
    commit(p)
    f = follower(tmp_path / "f")
    source = SnapshotSource(p, 1, H1)
    f.begin_snapshot(source.begin)
    assert f.copying
    chunks = list(source.chunks(500))
    for chunk in chunks[: len(chunks) // 2]:
        f.file_chunk(chunk)
    f.abandon()  # the backup dies mid-copy
    with pytest.raises(OSError, match="incomplete copy"):
        Store(tmp_path / "f" / "store").open()
    f = follower(tmp_path / "f")
    assert f.incomplete_found and f.last_lsn == 0 and list_segments(tmp_path / "f" / "store") == []
    assert f.epoch == 0  # the history file survives a wipe (here: none was saved yet)
    assert send_snapshot(source, f).lsn == p.durable_lsn
    f.close()
    p.close()
    assert folder_state(tmp_path / "f") == folder_state(tmp_path / "p")


def test_a_backup_refuses_files_a_snapshot_did_not_announce_or_out_of_order(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    everything(p, n=3)
    commit(p)
    source = SnapshotSource(p, 1, H1)
    f = follower(tmp_path / "f")
    for name in ("store/../x", "archive/../../x", "elsewhere/x", "store/LOCK", "store/a/b"):
        with pytest.raises(Refusal):
            f.begin_snapshot(r.SnapshotBegin(1, 0, H1, ((name, 1),)))
        assert not (tmp_path / "f" / "store" / "INCOMPLETE").exists()  # refused before anything is wiped
    f.begin_snapshot(source.begin)
    first, second = list(source.chunks(100))[:2]
    with pytest.raises(Refusal, match="expected 0"):
        f.file_chunk(second)
    with pytest.raises(Refusal, match="did not announce"):
        f.file_chunk(r.FileChunk("store/99999999.log", 0, b"x"))
    f.file_chunk(first)
    with pytest.raises(Refusal, match="files short"):
        f.end_snapshot(source.end)
    with pytest.raises(Refusal, match="ends at lsn"):
        f.end_snapshot(r.SnapshotEnd(source.lsn + 1))
    f.abandon()
    source.close()
    p.close()


def test_a_snapshot_is_taken_only_between_batches(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    p.add_message(message("m"), ["/queue/a"])
    batch = p.take_batch()
    with pytest.raises(RuntimeError, match="being written"):
        SnapshotSource(p, 1, H1)
    p.write_batch(batch)
    p.batch_written(batch)
    p.add_message(message("pending"), ["/queue/a"])  # appended, not yet taken: not in the copy
    source = SnapshotSource(p, 1, H1)
    assert source.lsn == 1 and source.begin.files[-1][1] < p.stats()["bytes"]
    source.close()
    p.close()
