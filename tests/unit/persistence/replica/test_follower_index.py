"""A backup's live index (persistence/replica/follower.py's catch_up) and what
promotion hands over (Follower.seed, Store.open(seed=...)): batches of a real
primary Store carried through the replication codec into a Follower whose
index catches up between steps, a bounded amount at a time, as the Backup
runs it.  The index it holds is the one a fresh open of its folder builds;
the promoted store replays nothing it already applied and recovers what a
plain open does; and a crash at any point still recovers by the ordinary
path with every acked record."""

from __future__ import annotations

import shutil
from pathlib import Path

from persistence import checkpoint as checkpoints
from persistence.archive import Archive
from persistence.journal import list_segments
from persistence.replica.catchup import SnapshotSource
from persistence.store import Store
from tests.support.replication_helpers import SEGMENT, commit, everything, folder_state, follower, primary, send_snapshot, ship
from tests.support.store_helpers import message, state


def copy_folder(src: Path, dst: Path) -> Path:
    """A copy of a data folder (store and archive) that may be opened while
    its original is in use (as after a SIGKILL: nothing flushed)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("LOCK"))
    return dst


def fresh_index(data_dir: Path, scratch: Path) -> checkpoints.Snapshot:
    """The index a plain Store.open of (a copy of) ``data_dir`` builds, as
    the checkpoint its clean close writes."""
    copy = copy_folder(data_dir, scratch)
    s = Store(copy / "store", segment_bytes=SEGMENT, sync="never", archive=Archive(copy / "archive", segment_bytes=1024))
    s.open()
    s.close()
    snapshot = checkpoints.load(copy / "store")
    assert snapshot is not None
    return snapshot


def comparable(snapshot: checkpoints.Snapshot, segments: list[int]) -> tuple:
    """What must agree: every field, counted per segment only for the
    segments that exist (a checkpoint may still count a deleted one)."""
    return (snapshot.position, snapshot.lsn, snapshot.messages, snapshot.subscriptions, snapshot.kv,
            {seg: n for seg, n in snapshot.seg_records.items() if seg in segments},
            {seg: n for seg, n in snapshot.seg_live.items() if n and seg in segments})


def compacting_primary(data_dir: Path) -> Store:
    """A primary whose journal holds compaction's moves and a few dead
    segments, besides a bit of everything."""
    p = primary(data_dir, segment_bytes=1024)
    for i in range(80):
        p.add_message(message(f"m{i}", body=b"y" * 30), ["/queue/a"])
    for i in range(80):
        if i % 10:
            p.ack("/queue/a", f"m{i}")
    return p


def ship_and_compact(p: Store, f) -> None:
    """The primary's batches, its compaction's moves and a checkpoint of its
    own, shipped as ordinary records, the follower catching up in small steps
    between them."""
    ship(commit(p), f)
    f.catch_up(max_bytes=300)
    for _ in range(100):
        if not p.compact_step():
            break
        ship(commit(p), f)
        f.catch_up(max_bytes=300)
    p.checkpoint()
    ship(commit(p), f)
    p.collect_garbage()


def test_a_caught_up_follower_holds_the_index_a_fresh_open_builds(tmp_path: Path) -> None:
    p = compacting_primary(tmp_path / "p")
    f = follower(tmp_path / "f")
    ship_and_compact(p, f)
    for round_ in range(3):  # messages, acks, subscriptions, transactions, archive records, key/values
        everything(p, tag=str(round_))
        ship(commit(p), f)
        f.catch_up(max_bytes=2000)  # bounded: it lags, then catches up over later calls
    assert f.index_behind
    assert f.catch_up() > 0 and not f.index_behind
    f.upkeep()  # a checkpoint of the live index (no rebuild), its dead segments deleted
    everything(p, tag="after")
    p.add_message(message("both"), ["/queue/x", "/queue/y"])
    ship(commit(p), f)
    f.catch_up()
    # What the index holds is what a fresh open of the same folder builds.
    expected = fresh_index(tmp_path / "f", tmp_path / "copy")
    f.promote(2)
    assert f.seed is not None
    segments = list_segments(tmp_path / "f" / "store")
    assert comparable(f.seed.snapshot, segments) == comparable(expected, segments)
    assert expected.messages  # not vacuous: live messages, several keys
    assert any(entry[1].__class__ is tuple for entry in expected.messages.values())
    p.close()
    assert folder_state(tmp_path / "f") == folder_state(tmp_path / "p")


def test_the_index_after_a_snapshot_install_follows_on(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    everything(p, tag="a")
    commit(p)
    p.checkpoint()
    everything(p, tag="b")  # after the primary's checkpoint: replayed by the install's open
    commit(p)
    f = follower(tmp_path / "f")
    send_snapshot(SnapshotSource(p, 1, ((1, 1),)), f, chunk_bytes=500)
    assert not f.index_behind
    everything(p, tag="c")
    ship(commit(p), f)
    assert f.index_behind
    f.catch_up(max_bytes=1000)
    f.catch_up()
    expected = fresh_index(tmp_path / "f", tmp_path / "copy")
    f.promote(2)
    segments = list_segments(tmp_path / "f" / "store")
    assert comparable(f.seed.snapshot, segments) == comparable(expected, segments)
    p.close()
    assert folder_state(tmp_path / "f") == folder_state(tmp_path / "p")


def test_a_promoted_store_replays_only_what_followed_the_last_catch_up(tmp_path: Path) -> None:
    p = compacting_primary(tmp_path / "p")
    f = follower(tmp_path / "f")
    ship_and_compact(p, f)
    f.upkeep()  # its checkpoint on disk: m0, m10, ... m70 live in it
    written = 0
    for i in range(0, 80, 10):  # acked in a segment soon all dead, which that checkpoint still needs
        p.ack("/queue/a", f"m{i}")
    for round_ in range(20):  # ~10k records, all after the follower's last checkpoint
        for i in range(250):
            p.add_message(message(f"b{round_}-{i}", body=b"z" * 20), ["/queue/b"])
            if i % 2:
                p.ack("/queue/b", f"b{round_}-{i - 1}")
        for frame in commit(p):
            ship([frame], f)
            written += frame.last_lsn - frame.first_lsn + 1
            f.catch_up(max_bytes=64 * 2**10 + sum(len(data) for _s, _o, data in frame.runs))  # as the Backup does
    everything(p, tag="tail")
    ship(commit(p), f)  # not caught up yet: promotion does it
    last = f.last_lsn
    expected = folder_state(copy_folder(tmp_path / "f", tmp_path / "copy"))
    plain = Store(tmp_path / "copy" / "store", segment_bytes=SEGMENT, sync="never",
                  archive=Archive(tmp_path / "copy" / "archive", segment_bytes=1024))
    plain_recovered = plain.open()
    plain.abandon()
    assert plain_recovered.replayed_records >= written  # what a promotion replayed before
    assert f.promote(2) == tmp_path / "f" / "store" and f.seed is not None
    s = Store(tmp_path / "f" / "store", segment_bytes=SEGMENT, sync="never",
              archive=Archive(tmp_path / "f" / "archive", segment_bytes=1024))
    recovered = s.open(seed=f.seed)
    assert recovered.replayed_records == 0
    assert state(recovered) == state(plain_recovered) and s.appended_lsn == last
    assert not recovered.clean
    # Its checkpoint on disk is older than what it opened from: one is due at once.
    assert s.checkpoint_due()
    # Garbage collection goes by the checkpoint on disk: whatever it deletes
    # now, a crash still recovers every record by the ordinary path.
    s.collect_garbage()
    s.add_message(message("next"), ["/queue/a"])
    s.flush()
    s.abandon()
    after = folder_state(tmp_path / "f")
    assert after[3] == last + 1
    queues = dict(expected[0][1])
    queues["/queue/a"] = queues.get("/queue/a", []) + after[0][1]["/queue/a"][-1:]
    assert after[0][1]["/queue/a"][-1][0] == "next"
    assert (after[0][0], after[0][1], after[0][2], after[2]) == (expected[0][0], queues, expected[0][2], expected[2])
    p.close()


def test_a_crash_at_any_point_recovers_every_acked_record_by_the_ordinary_path(tmp_path: Path) -> None:
    p = primary(tmp_path / "p", segment_bytes=1024)
    f = follower(tmp_path / "f")
    crashes = 0
    for round_ in range(12):
        everything(p, n=8, tag=str(round_))
        frames = commit(p)
        for k, frame in enumerate(frames):
            ship([frame], f)
            if (round_ + k) % 3:
                f.catch_up(max_bytes=100 * (round_ + 1))  # the index at every kind of lag
            if f.checkpoint_due():
                f.upkeep()  # checkpoints from the live index, dead segments deleted
        if round_ % 2:
            # SIGKILL: nothing flushed, not clean; a plain Store recovers the
            # primary's state at the last acked LSN.
            expected = folder_state(copy_folder(tmp_path / "p", tmp_path / f"p{round_}"))
            f.abandon()
            assert folder_state(tmp_path / "f") == expected
            f = follower(tmp_path / "f")
            crashes += 1
    assert crashes == 6
    f.catch_up()
    f.promote(2)
    s = Store(tmp_path / "f" / "store", segment_bytes=SEGMENT, sync="never",
              archive=Archive(tmp_path / "f" / "archive", segment_bytes=1024))
    seeded = s.open(seed=f.seed)
    s.abandon()  # the crash right after promotion
    p.close()
    plain = folder_state(tmp_path / "f")
    assert plain == folder_state(tmp_path / "p")
    assert state(seeded) == plain[0]
