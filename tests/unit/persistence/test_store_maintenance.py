"""The store through its own door: checkpoints (when due, what replay then
skips), garbage collection of dead segments, compaction, and the segment
statistics."""

from __future__ import annotations

from pathlib import Path

from persistence.journal import list_segments, segment_name, split_location
from tests.support.store_helpers import message, opened, reopen, state, workload


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
    _, keep_location = s.add_message(message("keep"), ["/queue/keep"])
    for i in range(40):
        s.ack("/queue/a", f"m{i}")
    s.flush()
    segments = list_segments(tmp_path)
    assert len(segments) > 4
    assert s.collect_garbage() == []  # no checkpoint yet: replay still needs them
    assert s.checkpoint_due()
    s.checkpoint()
    s.flush()
    active = max(list_segments(tmp_path))  # the one being appended to
    deleted = s.collect_garbage()
    keep_seg = split_location(keep_location)[0]
    assert deleted and segment_name(keep_seg) not in deleted and segment_name(active) not in deleted
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


def test_stats_describe_segments(tmp_path: Path) -> None:
    s, _ = opened(tmp_path, segment_bytes=1024)
    workload(s)
    stats = s.stats()
    assert stats["segments"] == len(stats["dead_ratio"]) > 1
    assert stats["pending_bytes"] > 0
    # Live: each message some queue still holds, counted once, as a reopen gives them back.
    s, r = reopen(tmp_path, s, segment_bytes=1024)
    assert stats["live_messages"] == len({m.id for q in r.queues.values() for m in q}) > 0
    s.close()
