"""persistence/archive.py on its own and inside the store: offsets, ranges,
segments, retention, torn tails, reopening, and recovery from the journal."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path

import pytest

from core.storage import StoredMessage
from persistence import checkpoint as checkpoints
from persistence.archive import Archive, ArchiveGone, decode_row, directory_name, segment_name
from persistence.archive_format import SEGMENT_SUFFIX
from persistence.store import Store

TOPIC = "plant.1.temp"


def flush(archive: Archive) -> None:
    writes = archive.take_writes()
    if writes is not None:
        archive.write(writes)
        archive.written(writes)


def fill(archive: Archive, n: int, *, topic: str = TOPIC, start: int = 0, headers: bool = True) -> None:
    for i in range(start, start + n):
        archive.append(topic, f"id-{i}", {"n": str(i), "unit": "C"} if headers and i % 2 else None, b"b%d" % i, i % 10, 1000 + i)
    flush(archive)


def read_all(archive: Archive, start: int, stop: int, chunk: int = 1000, topic: str = TOPIC) -> list[tuple[int, bytes, dict[str, str]]]:
    reader = archive.reader(topic, start, stop)
    reader.wait_written(1.0)
    out = []
    for _ in range(10_000):
        rows = reader.read(chunk)
        if not rows:
            assert reader.done
            break
        assert len(rows) <= chunk
        for k in range(len(rows)):
            lo, hi = rows.header_ends[k], rows.header_ends[k + 1]
            headers = {n.decode(): v.decode() for n, v in zip(rows.header_names[lo:hi], rows.header_values[lo:hi])}
            assert rows.ids[k] == b"id-%d" % rows.offsets[k]
            assert rows.timestamps[k] == 1000 + rows.offsets[k] and rows.priorities[k] == rows.offsets[k] % 10
            out.append((rows.offsets[k], rows.bodies[k], headers))
    reader.close()
    return out


def open_segment_files(under: Path) -> list[str]:
    """The segment files below ``under`` that this process holds open, as
    the kernel sees them (what MAX_OPEN_SEGMENTS bounds)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(f"{under}/") and target.endswith(SEGMENT_SUFFIX):
                found.append(target)
    return found


def pread_positions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Where in their files every ``os.pread`` from now on reads."""
    positions: list[int] = []
    real = os.pread

    def spy(fd: int, n: int, position: int) -> bytes:
        positions.append(position)
        return real(fd, n, position)

    monkeypatch.setattr(os, "pread", spy)
    return positions


def opened(path: Path, segment_bytes: int = 1024) -> Archive:
    archive = Archive(path, segment_bytes=segment_bytes)
    archive.open()
    return archive


def test_any_range_reads_back_exactly_across_segments(tmp_path: Path) -> None:
    archive = opened(tmp_path)
    fill(archive, 200)
    segments = sorted(os.listdir(tmp_path / TOPIC))
    assert len(segments) > 5 and segments[0] == segment_name(0)
    assert archive.info(TOPIC).latest == 200 and archive.info(TOPIC).earliest == 0  # type: ignore[union-attr]
    for start, stop, chunk in [(0, 200, 7), (0, 1, 1), (13, 150, 1000), (199, 500, 3), (57, 57, 10), (200, 200, 5)]:
        got = read_all(archive, start, stop, chunk)
        assert [o for o, _, _ in got] == list(range(start, min(stop, 200)))
        assert all(body == b"b%d" % o for o, body, _ in got)
        assert all(h == ({"n": str(o), "unit": "C"} if o % 2 else {}) for o, _, h in got)


def test_a_segment_rolls_before_it_would_pass_its_size(tmp_path: Path) -> None:
    archive = opened(tmp_path, segment_bytes=1000)
    fill(archive, 100, headers=False)
    sizes = [p.stat().st_size for p in sorted((tmp_path / TOPIC).iterdir())]
    assert max(sizes) <= 1000 and sum(sizes) == archive.info(TOPIC).bytes  # type: ignore[union-attr]
    bases = [int(p.name[:20]) for p in sorted((tmp_path / TOPIC).iterdir())]
    assert bases == sorted(bases) and bases[0] == 0


def test_reopening_keeps_offsets_and_topics_with_awkward_names(tmp_path: Path) -> None:
    archive = opened(tmp_path)
    fill(archive, 30)
    odd = "spBv1%2E0.a/b.%25.-"
    fill(archive, 3, topic=odd)
    archive.close()
    again = opened(tmp_path)
    assert again.info(TOPIC).latest == 30 and again.info(odd).latest == 3  # type: ignore[union-attr]
    assert (tmp_path / directory_name(odd)).is_dir() and directory_name(".x") == "%2Ex"
    fill(again, 5, start=30)
    assert [o for o, _, _ in read_all(again, 25, 100)] == list(range(25, 35))


def test_a_torn_tail_is_cut_and_the_next_offset_follows_the_last_whole_record(tmp_path: Path) -> None:
    archive = opened(tmp_path, segment_bytes=1 << 20)
    fill(archive, 10)
    archive.close()
    segment = tmp_path / TOPIC / segment_name(0)
    size = segment.stat().st_size
    with open(segment, "r+b") as f:
        f.truncate(size - 5)  # the last record cut short
    again = opened(tmp_path, segment_bytes=1 << 20)
    assert again.torn_bytes > 0 and again.info(TOPIC).latest == 9  # type: ignore[union-attr]
    fill(again, 1, start=9)
    assert [o for o, _, _ in read_all(again, 0, 100)] == list(range(10))


def test_retention_by_bytes_drops_whole_oldest_segments(tmp_path: Path) -> None:
    archive = opened(tmp_path, segment_bytes=1000)
    fill(archive, 200)
    total = archive.info(TOPIC).bytes  # type: ignore[union-attr]
    dropped = archive.apply_retention(TOPIC, 0, 3000)
    info = archive.info(TOPIC)
    assert info is not None and dropped == info.earliest > 0 and info.latest == 200
    assert info.bytes <= 3000 < total
    assert min(int(p.name[:20]) for p in (tmp_path / TOPIC).iterdir()) == info.earliest
    with pytest.raises(ArchiveGone) as gone:
        archive.reader(TOPIC, 0, 10)
    assert str(gone.value) == f"offsets 0..{info.earliest - 1} of {TOPIC} were dropped by retention; earliest is {info.earliest}"
    assert [o for o, _, _ in read_all(archive, info.earliest, 200)] == list(range(info.earliest, 200))
    assert archive.apply_retention(TOPIC, 0, 0) == 0  # no limits: nothing to do


def test_retention_by_age_uses_each_segments_newest_write(tmp_path: Path) -> None:
    archive = opened(tmp_path, segment_bytes=1000)
    fill(archive, 100)
    files = sorted((tmp_path / TOPIC).iterdir())
    now = time.time()
    for i, path in enumerate(files):  # the older half written two hours ago
        age = 7200 if i < len(files) // 2 else 10
        os.utime(path, (now - age, now - age))
    archive.apply_retention(TOPIC, 3600, 0, now)
    assert archive.info(TOPIC).earliest == int(files[len(files) // 2].name[:20])  # type: ignore[union-attr]
    # Everything old: even the active segment goes, and the offsets go on.
    for path in (tmp_path / TOPIC).iterdir():
        os.utime(path, (now - 7200, now - 7200))
    archive.apply_retention(TOPIC, 3600, 0, now)
    assert (archive.info(TOPIC).earliest, archive.info(TOPIC).latest) == (100, 100)  # type: ignore[union-attr]
    archive.close()
    again = opened(tmp_path, segment_bytes=1000)
    assert (again.info(TOPIC).earliest, again.info(TOPIC).latest) == (100, 100)  # type: ignore[union-attr]
    fill(again, 2, start=100)
    assert [o for o, _, _ in read_all(again, 100, 200)] == [100, 101]


def test_a_segment_being_written_is_not_dropped(tmp_path: Path) -> None:
    archive = opened(tmp_path, segment_bytes=1000)
    fill(archive, 20)
    for i in range(20, 40):  # appended, not yet written
        archive.append(TOPIC, f"id-{i}", None, b"x" * 50, 4, 1)
    writes = archive.take_writes()
    assert writes is not None
    archive.apply_retention(TOPIC, 0, 1)
    assert all(not (t.name == TOPIC and base < archive.info(TOPIC).earliest) for t, base, _, _ in writes.runs)  # type: ignore[union-attr]
    archive.write(writes)
    archive.written(writes)


# -- inside the store: the journal as the write-ahead copy ------------------------------


def store(path: Path, segment_bytes: int = 4096) -> tuple[Store, Archive]:
    archive = Archive(path / "archive", segment_bytes=segment_bytes)
    s = Store(path / "store", sync="always", archive=archive)
    s.open()
    return s, archive


def test_archive_records_lost_from_their_segment_come_back_from_the_journal(tmp_path: Path) -> None:
    s, archive = store(tmp_path)
    for i in range(50):
        s.archive_message(TOPIC, StoredMessage(f"id-{i}", "/topic/" + TOPIC, {"k": "v"}, b"b%d" % i, i % 10, 0, 1000 + i, 0))
    s.flush()
    s.abandon()  # a crash: no checkpoint, the archive segments never synced
    for path in (tmp_path / "archive" / TOPIC).iterdir():
        os.truncate(path, path.stat().st_size // 3)  # what a power cut may leave of unsynced pages
    s, archive = store(tmp_path)
    got = read_all(archive, 0, 100)
    assert [o for o, _, _ in got] == list(range(50)) and got[7][1:] == (b"b7", {"k": "v"})
    s.close()
    s, archive = store(tmp_path)  # and once more: nothing twice
    assert [o for o, _, _ in read_all(archive, 0, 100)] == list(range(50))
    s.close()


def test_a_checkpoint_syncs_the_archive_first_and_later_records_replay_from_the_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s, archive = store(tmp_path)
    order: list[str] = []
    real_sync = archive.sync
    monkeypatch.setattr(archive, "sync", lambda: (order.append("archive synced"), real_sync())[1])
    real_write = checkpoints.write
    monkeypatch.setattr(checkpoints, "write", lambda *a: (order.append("checkpoint written"), real_write(*a))[1])
    for i in range(10):
        s.archive_message(TOPIC, StoredMessage(f"id-{i}", "/topic/" + TOPIC, None, b"x", i, 0, 1000 + i, 0))
    s.checkpoint()
    s.flush()
    assert order == ["archive synced", "checkpoint written"]
    s.archive_message(TOPIC, StoredMessage("id-10", "/topic/" + TOPIC, None, b"y", 0, 0, 1010, 0))
    s.flush()
    s.abandon()
    s, archive = store(tmp_path)
    assert archive.info(TOPIC).latest == 11  # type: ignore[union-attr]
    assert [body for _, body, _ in read_all(archive, 0, 20)] == [b"x"] * 10 + [b"y"]
    s.close()


def test_a_transaction_keeps_its_archive_records_and_key_all_or_nothing(tmp_path: Path) -> None:
    s, archive = store(tmp_path)
    s.transaction([], [], archived=[(TOPIC, StoredMessage("t-1", "/topic/" + TOPIC, None, b"one", 4, 0, 5, 0)),
                                    (TOPIC, StoredMessage("t-2", "/topic/" + TOPIC, {"a": "b"}, b"two", 4, 0, 6, 0))],
                  commit_key="batch-1")
    s.flush()
    s.abandon()
    for path in (tmp_path / "archive" / TOPIC).iterdir():
        os.truncate(path, 0)
    s, archive = store(tmp_path)
    reader = archive.reader(TOPIC, 0, 10)
    rows = reader.read(10)
    assert rows.bodies == [b"one", b"two"] and rows.offsets == [0, 1]
    reader.close()
    s.abandon()
    again = Store(tmp_path / "store", archive=Archive(tmp_path / "archive"))
    assert again.open().kv["commit-keys"] == {"batch-1": b"1"}
    again.close()


def test_rows_decode_with_the_reference_decoder(tmp_path: Path) -> None:
    from persistence.archive import encode_row

    payload = encode_row(7, b"a.b", "id", {"x": "1", "é": "ü"}, b"\x00body", 9, 123)
    assert decode_row(payload) == ("a.b", 7, "id", {"x": "1", "é": "ü"}, b"\x00body", 9, 123)


def test_many_topics_keep_a_bounded_number_of_files_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from persistence import archive as module

    monkeypatch.setattr(module, "MAX_OPEN_SEGMENTS", 2)
    archive = opened(tmp_path, segment_bytes=300)
    synced: list[str] = []
    real = os.fdatasync
    monkeypatch.setattr(module.os, "fdatasync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1])
    for round_ in range(6):
        for t in range(5):
            fill(archive, 2, topic=f"t.{t}", start=2 * round_)
    assert len(open_segment_files(tmp_path)) <= 2
    archive.sync()
    # Every segment that was written is synced by now: at its roll or by the sync.
    written = {str(p) for t in range(5) for p in (tmp_path / f"t.{t}").iterdir()}
    assert written <= set(synced)
    synced.clear()
    archive.sync()
    assert synced == []  # and the sync left nothing behind to sync again
    for t in range(5):
        assert [o for o, _, _ in read_all(archive, 0, 100, topic=f"t.{t}")] == list(range(12))


def test_a_read_seeks_with_the_sparse_index_and_distrusts_a_stale_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from persistence import archive as module

    monkeypatch.setattr(module, "INDEX_BYTES", 512)
    archive = opened(tmp_path, segment_bytes=8192)
    fill(archive, 330)
    closed = sorted((tmp_path / TOPIC).glob("*.idx"))
    assert closed and len(closed) == len(list((tmp_path / TOPIC).glob("*.seg"))) - 1  # the active one's is in memory
    bases = archive.topics[TOPIC].bases
    starts = [base + 50 for base in bases if base + 50 < 300]
    assert len(starts) == len(bases)  # in each closed segment and in the active one
    read_at = pread_positions(monkeypatch)
    for start in starts:
        read_at.clear()
        reader = archive.reader(TOPIC, start, 300)
        rows = reader.read(5)
        assert rows.offsets[0] == start
        assert read_at and min(read_at) > 0  # it did not read the segment from its start
        reader.close()
    # A damaged index (or one that no longer matches its segment) is ignored.
    for path in closed:
        path.write_bytes(bytes(range(16)) * 3)
    assert [o for o, _, _ in read_all(archive, 37, 60)] == list(range(37, 60))
    archive.close()
    again = opened(tmp_path, segment_bytes=8192)  # the active segment's index rebuilt by the scan
    start = again.topics[TOPIC].bases[-1] + 50
    read_at.clear()
    reader = again.reader(TOPIC, start, 330)
    assert reader.read(1).offsets == [start] and read_at and min(read_at) > 0
    reader.close()


def test_a_reader_keeps_its_first_segment_even_if_retention_drops_it_meanwhile(tmp_path: Path) -> None:
    archive = opened(tmp_path, segment_bytes=1000)
    fill(archive, 100)
    reader = archive.reader(TOPIC, 0, 100)
    archive.apply_retention(TOPIC, 0, 1)  # everything but the active segment goes
    assert archive.info(TOPIC).earliest > 0  # type: ignore[union-attr]
    rows = reader.read(5)
    assert rows.offsets == [0, 1, 2, 3, 4]
    reader.close()


def _enospc(*args: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("failing", ["pwrite", "fdatasync", "archive"])
def test_a_failed_batch_is_written_again_with_its_archive_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    s, archive = store(tmp_path)

    def publish(first: int, last: int) -> None:
        for i in range(first, last):
            s.archive_message(TOPIC, StoredMessage(f"id-{i}", "/topic/" + TOPIC, {"i": str(i)}, b"b%d" % i, i % 10, 0, 1000 + i, 0))

    publish(0, 5)
    s.flush()
    publish(5, 10)
    batch = s.take_batch()
    assert batch is not None
    with monkeypatch.context() as m:
        if failing == "archive":  # the journal is written, the segment write fails
            m.setattr(archive, "write", _enospc)
        else:
            m.setattr(os, failing, _enospc)
        with pytest.raises(OSError) as exc:
            s.write_batch(batch)
    s.batch_failed(batch, exc.value)
    publish(10, 12)
    s.flush()
    assert [o for o, _, _ in read_all(archive, 0, 100)] == list(range(12))
    s.abandon()
    s, archive = store(tmp_path)
    got = read_all(archive, 0, 100)
    assert [o for o, _, _ in got] == list(range(12)) and got[7][1:] == (b"b7", {"i": "7"})
    s.close()


def test_records_bigger_than_a_read_chunk_or_a_segment_read_back_whole(tmp_path: Path) -> None:
    archive = opened(tmp_path, segment_bytes=2**20)
    sizes = [10, 3 * 2**20, 5, 2**20 + 1, 7]
    for i, size in enumerate(sizes):
        archive.append(TOPIC, f"id-{i}", None, bytes([i]) * size, i, 1000 + i)
    flush(archive)
    got = read_all(archive, 0, 10, chunk=2)
    assert [len(body) for _, body, _ in got] == sizes
    assert all(body == bytes([o]) * len(body) for o, body, _ in got)
    assert [o for o, _, _ in read_all(archive, 3, 10)] == [3, 4]


def test_a_clean_close_saves_the_active_index_so_opening_scans_only_the_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from persistence import archive as module

    monkeypatch.setattr(module, "INDEX_BYTES", 256)
    archive = opened(tmp_path, segment_bytes=1 << 20)
    fill(archive, 200)
    saved = list(archive.topics[TOPIC].index)
    archive.close()
    assert (tmp_path / TOPIC / "00000000000000000000.idx").exists()
    segment = tmp_path / TOPIC / segment_name(0)
    os.truncate(segment, segment.stat().st_size - 3)  # and a torn tail after it
    size = segment.stat().st_size
    again = opened(tmp_path, segment_bytes=1 << 20)
    assert again.torn_bytes > 0 and again.info(TOPIC).latest == 199  # type: ignore[union-attr]
    kept = [e for e in saved if e[0] < 199]
    assert again.topics[TOPIC].index == kept
    # The scan started at the last saved entry that still holds, not at 0.
    assert kept and again.scanned_bytes == size - kept[-1][1] < size
    fill(again, 1, start=199)
    assert [o for o, _, _ in read_all(again, 150, 300)] == list(range(150, 200))
    # A stale or damaged saved index is only a hint: a full scan gives the same answer.
    again.close()
    (tmp_path / TOPIC / "00000000000000000000.idx").write_bytes(b"\xff" * 64)
    third = opened(tmp_path, segment_bytes=1 << 20)
    assert third.info(TOPIC).latest == 200 and third.topics[TOPIC].index  # type: ignore[union-attr]
    assert third.scanned_bytes == segment.stat().st_size  # the whole segment, from 0


def record_starts(data: bytes) -> list[int]:
    starts, p = [], 0
    while p < len(data):
        starts.append(p)
        p += 12 + int.from_bytes(data[p + 8 : p + 12], "little")
    return starts


def test_a_record_with_an_absurd_length_is_skipped_without_huge_reads(tmp_path: Path) -> None:
    archive = opened(tmp_path, segment_bytes=1 << 20)
    fill(archive, 20)
    segment = tmp_path / TOPIC / segment_name(0)
    data = bytearray(segment.read_bytes())
    sixth = record_starts(bytes(data))[5]
    data[sixth + 8 : sixth + 12] = (0xFFFFFFF0).to_bytes(4, "little")  # an absurd length
    segment.write_bytes(bytes(data))
    assert [o for o, _, _ in read_all(archive, 0, 20)] == [0, 1, 2, 3, 4] + list(range(6, 20))


@pytest.mark.parametrize("chunk", [1 << 20, 97], ids=["one-read", "many-small-reads"])
def test_a_reader_resynchronises_past_damaged_records_and_counts_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    from persistence import archive_reader

    monkeypatch.setattr(archive_reader, "READ_CHUNK_BYTES", chunk)
    told: list[tuple[str, dict]] = []
    archive = Archive(tmp_path, segment_bytes=1 << 20, log=lambda event, **fields: told.append((event, fields)))
    archive.open()
    fill(archive, 50)
    segment = tmp_path / TOPIC / segment_name(0)
    data = bytearray(segment.read_bytes())
    starts = record_starts(bytes(data))
    data[starts[3] + 20] ^= 0xFF  # a flipped bit in record 3
    data[starts[30] + 1] ^= 0xFF  # record 30's magic
    data[starts[31] + 30] ^= 0xFF  # and its neighbour: one damaged stretch
    segment.write_bytes(bytes(data))
    reader = archive.reader(TOPIC, 0, 50)
    reader.wait_written(1.0)
    got = []
    while not reader.done:
        got += reader.read(7).offsets
    reader.close()
    assert got == [o for o in range(50) if o not in (3, 30, 31)]
    assert reader.damaged == 2
    assert [(e, f["segment"]) for e, f in told] == [("archive_record_corrupt", segment_name(0))] * 2
    assert told[0][1]["position"] == starts[3] and told[1][1]["position"] == starts[30]


def test_the_offline_check_reads_every_segment_and_names_damage_and_gaps(tmp_path: Path) -> None:
    from persistence.archive_check import check_archive

    archive = opened(tmp_path)
    fill(archive, 200)
    archive.close()
    report = check_archive(tmp_path)
    topic = report["by_topic"][TOPIC]
    assert (report["topics"], report["corrupt_records"], report["problems"]) == (1, 0, [])
    assert (topic["records"], topic["earliest"], topic["next_offset"]) == (200, 0, 200)
    assert topic["segments"] > 3
    folder = tmp_path / directory_name(TOPIC)
    bases = sorted(int(p.name.split(".")[0]) for p in folder.glob("*.seg"))
    damaged = folder / segment_name(bases[1])
    data = bytearray(damaged.read_bytes())
    data[40] ^= 0xFF  # inside the first record's payload: its checksum fails
    damaged.write_bytes(bytes(data))
    (folder / segment_name(bases[2])).unlink()
    report = check_archive(tmp_path)
    assert report["corrupt_records"] == 1
    reasons = [(p["segment"], p["reason"]) for p in report["problems"]]
    assert reasons[0][0] == segment_name(bases[1]) and "unreadable" in reasons[0][1]
    assert (segment_name(bases[3]), f"offsets {bases[1]}..{bases[3] - 1} are missing before this segment") in reasons


def test_a_torn_tail_of_the_newest_segment_is_reported_not_called_corrupt(tmp_path: Path) -> None:
    from persistence.archive_check import check_archive

    archive = opened(tmp_path, segment_bytes=1 << 20)
    fill(archive, 10)
    archive.close()
    segment = tmp_path / directory_name(TOPIC) / segment_name(0)
    tail = b"\xd5\x47 half a record"
    with open(segment, "ab") as f:
        f.write(tail)
    report = check_archive(tmp_path)
    assert (report["corrupt_records"], report["problems"], report["torn_bytes"]) == (0, [], len(tail))
    assert report["by_topic"][TOPIC]["records"] == 10
