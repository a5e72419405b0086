"""The store through its own door: what open() recovers from torn writes,
transactions cut short, flipped bits, a corrupt checkpoint and record types
it does not know."""

from __future__ import annotations

from pathlib import Path

from persistence import records
from persistence.journal import segment_name, split_location
from persistence.store import Store
from tests.support.store_helpers import SEGMENT, crash, message, opened, reopen, state, workload


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
    s.abandon()
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
        s.abandon()


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
    s.add_message(message("m"), ["/queue/a"])
    crash(s)
    # Before it, a whole record of a type this version does not know (as a
    # newer version could write one).
    path = tmp_path / segment_name(1)
    path.write_bytes(records.frame(200, b"from the future") + path.read_bytes())
    events = []
    s = Store(tmp_path, segment_bytes=SEGMENT, sync="never", log=lambda e, **f: events.append((e, f)))
    r = s.open()
    assert [m.id for m in r.queues["/queue/a"]] == ["m"]
    assert events == [("record_type_unknown", {"segment": segment_name(1), "offset": 0, "type": 200})]
    s.close()
