"""The journal and its records, without a store: framing round trips, torn
tails cut at every byte, flipped bits reported and skipped, segments."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.storage import StoredMessage
from persistence import records
from persistence.journal import Journal, list_segments, make_location, neutralize, segment_name, split_location
from persistence.records import HEADER_BYTES, CorruptRecord, RecordType


def write_all(journal: Journal) -> None:
    batch = journal.take_batch()
    if batch is not None:
        journal.write_batch(batch)
        journal.batch_written(batch)


def scanned(directory: Path, **kwargs) -> tuple[Journal, list[tuple[int, int, bytes]], list[tuple[str, int, str]]]:
    journal = Journal(directory, kwargs.pop("segment_bytes", 2**20))
    reports: list[tuple[str, int, str]] = []
    out = [
        (loc, rtype, bytes(payload))
        for loc, rtype, payload in journal.scan(0, on_corrupt=lambda *r: reports.append(r), **kwargs)
    ]
    return journal, out, reports


# -- records ------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers, body, keys",
    [
        ({"content-type": "text/plain", "x-ünï": "välue\nwith:colon"}, b"hello\x00world", ["/queue/a"]),
        ({}, b"", ["/queue/a", "durable:c1:s1", "durable:c2:s2"]),
        (None, None, []),
        ({"k" * 70000: "v" * 70000}, bytes(range(256)) * 100, ["q"]),
    ],
)
def test_a_message_payload_round_trips(headers, body, keys) -> None:
    payload = records.encode_message(StoredMessage("id-1é", "/topic/t.ü", headers, body, 9, 2**40, 1_700_000_000_000, 3), keys)
    assert records.decode_message(payload) == ("id-1é", "/topic/t.ü", headers or {}, body or b"", 9, 2**40, 1_700_000_000_000, 3, -1)
    assert records.decode_message_meta(memoryview(payload)) == (("id-1é", "/topic/t.ü", None, None, 9, 2**40, 1_700_000_000_000, 3, -1), keys)
    assert records.decode_message_id(payload) == "id-1é"


def test_small_payloads_round_trip() -> None:
    assert records.decode_two(records.encode_two("a:b", "ü"))[:2] == ("a:b", "ü")
    assert records.decode_one(records.encode_one("sub")) == "sub"
    assert records.decode_kv_put(records.encode_kv_put("retained", "a/b", b"\x00v")) == ("retained", "a/b", b"\x00v")


def test_a_transaction_nests_frames_with_their_own_magic() -> None:
    add = records.encode_message(StoredMessage("m", "/queue/a", {}, b"b", 4, 0, 0, 0), ["/queue/a"])
    ack = records.encode_two("/queue/a", "old")
    payload, starts = records.encode_tx([(RecordType.MESSAGE_ADD, add), (RecordType.ACK, ack)])
    ops = records.decode_tx(payload)
    assert [(at, t, bytes(p)) for at, t, p in ops] == [(starts[0], 1, add), (starts[1], 2, ack)]
    assert payload[starts[0] : starts[0] + 2] == records.NESTED_MAGIC
    # Resynchronising never lands on a nested frame.
    assert records.MAGIC not in payload


def test_a_frame_validates_and_every_damage_is_named() -> None:
    frame = records.frame(RecordType.ACK, b"payload")
    assert records.parse_frame(frame, 0, len(frame)) == (RecordType.ACK, 7)
    with pytest.raises(CorruptRecord, match="short header"):
        records.parse_frame(frame[:5], 0, 5)
    with pytest.raises(CorruptRecord, match="past the end"):
        records.parse_frame(frame[:-1], 0, len(frame) - 1)
    for i in range(len(frame)):
        damaged = bytearray(frame)
        damaged[i] ^= 0x10
        with pytest.raises(CorruptRecord):
            records.parse_frame(damaged, 0, len(damaged))


# -- the journal ----------------------------------------------------------------


def test_records_come_back_in_order_across_segments(tmp_path: Path) -> None:
    journal = Journal(tmp_path, 100)
    written = []
    for i in range(20):
        payload = bytes([i]) * (10 if i != 7 else 500)  # one record bigger than a segment
        lsn, location = journal.append(RecordType.ACK, payload)
        assert lsn == i + 1
        written.append((location, RecordType.ACK, payload))
    write_all(journal)
    journal.close()
    assert len(list_segments(tmp_path)) > 5
    big = split_location(written[7][0])
    assert big[1] == 0 and (tmp_path / segment_name(big[0])).stat().st_size == HEADER_BYTES + 500
    again, found, reports = scanned(tmp_path, segment_bytes=100)
    assert found == written and reports == []
    assert again.end_location == make_location(split_location(written[-1][0])[0], os.path.getsize(tmp_path / segment_name(split_location(written[-1][0])[0])))


def test_read_finds_a_record_pending_in_flight_and_on_disk(tmp_path: Path) -> None:
    journal = Journal(tmp_path, 2**20)
    _, first = journal.append(RecordType.ACK, b"first")
    assert journal.read(first) == (RecordType.ACK, b"first")  # pending
    batch = journal.take_batch()
    _, second = journal.append(RecordType.ACK, b"second")
    assert journal.read(first) == (RecordType.ACK, b"first")  # being written
    assert journal.read(second) == (RecordType.ACK, b"second")
    journal.write_batch(batch)
    journal.batch_written(batch)
    write_all(journal)
    assert journal.read(first) == (RecordType.ACK, b"first")  # on disk
    assert journal.read(second) == (RecordType.ACK, b"second")
    journal.close()


def three_records(directory: Path) -> list[tuple[int, int, bytes]]:
    directory.mkdir(exist_ok=True)
    journal = Journal(directory, 2**20)
    out = []
    for payload in (b"one" * 5, b"two" * 7, b"three" * 9):
        _, location = journal.append(RecordType.ACK, payload)
        out.append((location, RecordType.ACK, payload))
    write_all(journal)
    journal.close()
    return out


def test_a_torn_tail_is_cut_at_every_byte_of_the_last_record(tmp_path: Path) -> None:
    written = three_records(tmp_path / "orig")
    path = tmp_path / "orig" / segment_name(1)
    data = path.read_bytes()
    start = split_location(written[2][0])[1]
    for cut in range(start, len(data)):
        folder = tmp_path / f"cut{cut}"
        folder.mkdir()
        (folder / segment_name(1)).write_bytes(data[:cut])
        journal, found, reports = scanned(folder)
        assert found == written[:2], cut
        assert reports == [] and journal.torn_bytes == cut - start
        assert (folder / segment_name(1)).stat().st_size == start  # cut off
        _, location = journal.append(RecordType.ACK, b"after")
        assert location == written[2][0]
        write_all(journal)
        journal.close()
        _, found, reports = scanned(folder)
        assert found == written[:2] + [(location, RecordType.ACK, b"after")] and reports == []


def test_a_garbage_tail_is_cut_too(tmp_path: Path) -> None:
    written = three_records(tmp_path)
    path = tmp_path / segment_name(1)
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b"\x00" * 100 + records.MAGIC + b"junk")
    journal, found, reports = scanned(tmp_path)
    assert found == written and reports == [] and journal.torn_bytes == 106
    assert path.stat().st_size == size


def test_check_mode_reports_a_torn_tail_without_cutting(tmp_path: Path) -> None:
    three_records(tmp_path)
    path = tmp_path / segment_name(1)
    path.write_bytes(path.read_bytes()[:-3])
    journal, found, _ = scanned(tmp_path, truncate=False)
    assert len(found) == 2 and journal.torn_bytes > 0
    assert path.stat().st_size == journal.torn_bytes + split_location(journal.end_location)[1]


@pytest.mark.parametrize("where", ["magic", "crc", "type", "length", "payload", "last payload byte"])
def test_a_flipped_bit_in_a_middle_record_is_reported_and_skipped(tmp_path: Path, where: str) -> None:
    written = three_records(tmp_path)
    path = tmp_path / segment_name(1)
    data = bytearray(path.read_bytes())
    middle = split_location(written[1][0])[1]
    offset = {"magic": 0, "crc": 3, "type": 7, "length": 9, "payload": 14, "last payload byte": HEADER_BYTES + 20}[where]
    data[middle + offset] ^= 0x04
    path.write_bytes(bytes(data))
    journal, found, reports = scanned(tmp_path)
    assert found == [written[0], written[2]]
    assert len(reports) == 1 and reports[0][:2] == (str(path), middle)
    assert journal.corrupt_records == 1 and journal.torn_bytes == 0
    assert path.stat().st_size == len(data)  # nothing cut: the damage is in the middle


def test_damage_at_the_end_of_an_older_segment_is_reported_not_cut(tmp_path: Path) -> None:
    journal = Journal(tmp_path, 40)
    for i in range(4):
        journal.append(RecordType.ACK, bytes([i]) * 20)
    write_all(journal)
    journal.close()
    first = tmp_path / segment_name(1)
    first.write_bytes(first.read_bytes()[:-2])
    _, found, reports = scanned(tmp_path, segment_bytes=40)
    assert len(found) == 3 and len(reports) == 1 and reports[0][0] == str(first)


def test_a_failed_batch_is_neutralized_in_place(tmp_path: Path) -> None:
    journal = Journal(tmp_path, 2**20)
    add = records.encode_message(StoredMessage("m1", "/queue/a", {}, b"body", 4, 0, 0, 0), ["/queue/a"])
    journal.append(RecordType.MESSAGE_ADD, add)
    journal.append(RecordType.ACK, records.encode_two("/queue/a", "m0"))
    tx, _ = records.encode_tx([(RecordType.MESSAGE_ADD, add.replace(b"m1", b"m2")), (RecordType.ACK, records.encode_two("q", "x"))])
    journal.append(RecordType.TX, tx)
    batch = journal.take_batch()
    size = len(batch.runs[0][2])
    removed = neutralize(batch)
    assert [records.decode_message_id(p) for _, p in removed] == ["m1", "m2"]
    assert len(batch.runs[0][2]) == size  # same offsets: what follows keeps its locations
    journal.requeue(batch)
    write_all(journal)
    journal.close()
    _, found, reports = scanned(tmp_path)
    assert reports == []
    kinds = [t for _, t, _ in found]
    # Still one frame per record (LSNs are counted by frames): the TX keeps
    # its ack, padded inside to its old size.
    assert kinds == [RecordType.PAD, RecordType.ACK, RecordType.TX]
    assert [(t, bytes(p)) for _, t, p in records.decode_tx(found[2][2])] == [(RecordType.ACK, records.encode_two("q", "x"))]


def test_delete_segment_refuses_the_active_one(tmp_path: Path) -> None:
    journal = Journal(tmp_path, 30)
    journal.append(RecordType.ACK, b"x" * 20)
    journal.append(RecordType.ACK, b"y" * 20)
    write_all(journal)
    journal.delete_segment(1)
    assert list_segments(tmp_path) == [2]
    with pytest.raises(ValueError):
        journal.delete_segment(2)
    journal.close()
