"""The replication stream's codec (persistence/replica/replication.py) through its
door: every frame round-trips, whole, byte by byte and split at every index;
a bad checksum, an oversize length, a truncated stream, a frame the peer may
not send (or not now) each raise RemoteProtocolError naming what was wrong."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from persistence import records
from persistence.records import RecordType
from persistence.replica import replication as r

u64 = st.integers(0, 2**64 - 1)
text = st.text(max_size=40)
history = st.lists(st.tuples(u64, u64), max_size=5).map(tuple)
runs = st.lists(st.tuples(st.integers(0, 2**30), st.integers(0, 2**40), st.binary(max_size=64)), max_size=4).map(tuple)

from_backup = st.one_of(
    st.builds(r.Ack, u64, u64),
    st.builds(r.Refused, u64, text),
    st.builds(r.Ping, u64),
    st.builds(r.Pong, u64),
)
from_primary_tail = st.one_of(
    st.builds(lambda e, f, n, rs: r.Batch(e, f, f + n, rs), st.integers(0, 2**32), st.integers(1, 2**32), st.integers(-1, 100), runs),
    st.builds(r.InSync, u64, u64),
    st.builds(r.Refused, u64, text),
    st.builds(r.Ping, u64),
    st.builds(r.Pong, u64),
)
snapshot = st.builds(r.SnapshotBegin, u64, u64, history, st.lists(st.tuples(text, u64), max_size=4).map(tuple))
chunk = st.builds(r.FileChunk, text, u64, st.binary(max_size=64))
hello = st.builds(r.Hello, text, u64, u64, history)


def pair() -> tuple[r.ReplicationConnection, r.ReplicationConnection]:
    primary, backup = r.ReplicationConnection(r.Role.PRIMARY), r.ReplicationConnection(r.Role.BACKUP)
    primary.receive_data(backup.send(r.Hello("b", 1, 0, ())))
    backup.receive_data(primary.send(r.Hello("p", 1, 0, ())))
    assert len(list(primary.events())) == 1 and len(list(backup.events())) == 1
    return primary, backup


def feed(conn: r.ReplicationConnection, data: bytes, cuts: list[int]) -> list[r.Frame]:
    out = []
    last = 0
    for cut in [*cuts, len(data)]:
        if cut > last:  # b"" would be EOF
            conn.receive_data(data[last:cut])
        out.extend(conn.events())
        last = max(last, cut)
    return out


@given(st.lists(from_backup, max_size=6), hello)
def test_what_a_backup_sends_round_trips(frames: list[r.Frame], first: r.Hello) -> None:
    backup = r.ReplicationConnection(r.Role.BACKUP)
    data = b"".join(backup.send(f) for f in [first, *frames])
    whole = r.ReplicationConnection(r.Role.PRIMARY)
    assert feed(whole, data, []) == [first, *frames]
    bytewise = r.ReplicationConnection(r.Role.PRIMARY)
    assert feed(bytewise, data, list(range(1, len(data)))) == [first, *frames]


@given(st.lists(from_primary_tail, max_size=4), snapshot, st.lists(chunk, max_size=4), u64, st.lists(from_primary_tail, max_size=3))
def test_what_a_primary_sends_round_trips(tail: list[r.Frame], begin: r.SnapshotBegin, chunks: list[r.Frame], lsn: int,
                                          more: list[r.Frame]) -> None:
    primary, backup = pair()
    frames = [*tail, begin, *chunks, r.SnapshotEnd(lsn), *more]
    data = b"".join(primary.send(f) for f in frames)
    assert feed(backup, data, []) == frames
    assert backup.state is r.State.STREAMING


def test_split_at_every_index() -> None:
    primary, _ = pair()
    frames: list[r.Frame] = [
        r.Batch(2, 10, 11, ((1, 0, b"abc"), (2, 0, b"defg"))),
        r.SnapshotBegin(2, 11, ((1, 1), (2, 5)), (("store/checkpoint", 3),)),
        r.FileChunk("store/checkpoint", 0, b"xyz"),
        r.SnapshotEnd(11),
        r.InSync(2, 11),
        r.Ping(7),
    ]
    data = b"".join(primary.send(f) for f in frames)
    for cut in range(len(data) + 1):
        _, backup = pair()
        assert feed(backup, data, [cut]) == frames


def test_a_reader_may_stop_early_and_the_rest_stays_buffered() -> None:
    primary, backup = pair()
    backup.receive_data(primary.send(r.Ping(1)) + primary.send(r.Ping(2)))
    events = backup.events()
    assert next(events) == r.Ping(1)
    assert list(backup.events()) == [r.Ping(2)]


def test_golden_bytes_of_an_ack() -> None:
    backup = r.ReplicationConnection(r.Role.BACKUP)
    backup.send(r.Hello("b", 0, 0, ()))
    body = bytes([r.FrameType.ACK]) + struct.pack("<QQ", 3, 42)
    assert backup.send(r.Ack(3, 42)) == struct.pack("<II", len(body), zlib.crc32(body)) + body


def test_golden_bytes_of_an_in_sync() -> None:
    primary, _ = pair()
    body = bytes([10]) + struct.pack("<QQ", 4, 99)  # type 10: epoch, lsn
    assert primary.send(r.InSync(4, 99)) == struct.pack("<II", len(body), zlib.crc32(body)) + body


def broken(data: bytes, error: str, *, role: r.Role = r.Role.BACKUP, eof: bool = False, max_frame_bytes: int = r.MAX_FRAME_BYTES,
           fresh: bool = False) -> None:
    """``data`` makes a ``role`` side raise ``error`` (after the peer's Hello
    unless ``fresh``), and again on the next call."""
    conn = r.ReplicationConnection(role, max_frame_bytes=max_frame_bytes)
    if not fresh:
        conn.receive_data(r.ReplicationConnection(r.Role.PRIMARY).send(r.Hello("p", 1, 0, ())))
        assert len(list(conn.events())) == 1
    conn.receive_data(data)
    if eof:
        conn.receive_data(b"")
    with pytest.raises(r.RemoteProtocolError, match=error) as caught:
        list(conn.events())
    assert conn.state is r.State.ERROR and caught.value.reason
    with pytest.raises(r.RemoteProtocolError):  # and again: the connection is done
        list(conn.events())


def test_bad_checksum_oversize_truncated_and_garbage() -> None:
    primary = r.ReplicationConnection(r.Role.PRIMARY)
    good = primary.send(r.Hello("p", 1, 5, ((1, 1),)))
    flipped = bytearray(good)
    flipped[-1] ^= 1
    broken(bytes(flipped), "checksum mismatch")
    broken(struct.pack("<II", 2**20 + 1, 0), "over the limit of 1048576", max_frame_bytes=2**20)
    broken(good[:-3], "closed in the middle of a frame", eof=True)
    broken(struct.pack("<II", 0, 0), "without a type")
    body = bytes([200])
    broken(struct.pack("<II", 1, zlib.crc32(body)) + body, "unknown frame type 200")
    body = bytes([r.FrameType.PING]) + b"\x01\x02"
    broken(struct.pack("<II", len(body), zlib.crc32(body)) + body, "shorter than its fields")
    body = bytes([r.FrameType.PING]) + bytes(9)
    broken(struct.pack("<II", len(body), zlib.crc32(body)) + body, "1 bytes after the frame's fields")
    body = bytes([r.FrameType.REFUSED]) + bytes(8) + b"\x02\x00\xff\xfe"
    broken(struct.pack("<II", len(body), zlib.crc32(body)) + body, "not UTF-8")
    body = bytes([r.FrameType.BATCH]) + struct.pack("<QQQI", 1, 10, 5, 0)
    broken(struct.pack("<II", len(body), zlib.crc32(body)) + body, "last lsn 5 is before its first 10")


def test_who_sends_what_and_when() -> None:
    primary, backup = pair()
    # A backup never sends a Batch; a primary never sends an Ack.
    with pytest.raises(r.LocalProtocolError, match="a backup does not send BATCH"):
        backup.send(r.Batch(1, 1, 1, ()))
    with pytest.raises(r.LocalProtocolError, match="a primary does not send ACK"):
        primary.send(r.Ack(1, 1))
    # Each side speaks a Hello first.
    sender = r.ReplicationConnection(r.Role.PRIMARY)
    broken(sender.send(r.Batch(1, 1, 1, ())), "BATCH is not expected while awaiting hello", fresh=True)
    # A file chunk outside a snapshot, a batch inside one.
    sender, _ = pair()
    broken(sender.send(r.Hello("p", 1, 0, ())) + sender.send(r.FileChunk("x", 0, b"")), "FILE_CHUNK is not expected while streaming", fresh=True)
    primary, backup = pair()
    backup.receive_data(primary.send(r.SnapshotBegin(1, 0, (), ())) + primary.send(r.Batch(1, 1, 1, ())))
    with pytest.raises(r.RemoteProtocolError, match="BATCH is not expected while snapshot"):
        list(backup.events())
    # Only a primary says a backup is in sync, and not in the middle of a snapshot.
    with pytest.raises(r.LocalProtocolError, match="a backup does not send IN_SYNC"):
        backup.send(r.InSync(1, 1))
    primary, backup = pair()
    backup.receive_data(primary.send(r.SnapshotBegin(1, 0, (), ())) + primary.send(r.InSync(1, 0)))
    with pytest.raises(r.RemoteProtocolError, match="IN_SYNC is not expected while snapshot"):
        list(backup.events())
    other = r.ReplicationConnection(r.Role.PRIMARY)
    broken(other.send(r.Hello("p", 1, 0, ())) + other.send(r.InSync(1, 1)), "a backup does not send IN_SYNC",
           role=r.Role.PRIMARY, fresh=True)
    # A backup's frame arriving at a backup.
    other = r.ReplicationConnection(r.Role.BACKUP)
    broken(other.send(r.Hello("b", 0, 0, ())) + other.send(r.Ack(1, 1)), "a primary does not send ACK", fresh=True)


def test_eof_closes_and_an_oversize_send_is_local() -> None:
    primary, backup = pair()
    backup.receive_data(b"")
    assert list(backup.events()) == [] and backup.state is r.State.CLOSED
    with pytest.raises(RuntimeError):
        backup.receive_data(b"x")
    small = r.ReplicationConnection(r.Role.PRIMARY, max_frame_bytes=100)
    with pytest.raises(r.LocalProtocolError, match="over the limit of 100"):
        small.send(r.FileChunk("f", 0, bytes(200)))
    with pytest.raises(r.LocalProtocolError, match="longer than 65535"):
        primary.send(r.Refused(1, "x" * 70_000))


@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_remote_protocol_errors(data: bytes) -> None:
    for role, prefix in ((r.Role.PRIMARY, b""), (r.Role.BACKUP, b""),
                         (r.Role.BACKUP, r.ReplicationConnection(r.Role.PRIMARY).send(r.Hello("p", 1, 0, ())))):
        conn = r.ReplicationConnection(role, max_frame_bytes=1000)
        if prefix + data:
            conn.receive_data(prefix + data)
        conn.receive_data(b"")
        try:
            list(conn.events())
        except r.RemoteProtocolError:
            pass


def record(i: int, size: int) -> bytes:
    return records.frame(RecordType.ACK, bytes([i % 256]) * size)


def test_a_big_batch_is_split_at_record_boundaries() -> None:
    frames = [record(i, 10 + i) for i in range(10)]
    runs = [(1, 100, b"".join(frames[:6])), (2, 0, b"".join(frames[6:]))]
    pieces = list(r.split_runs(50, runs, 60))
    assert pieces[0][0] == 50 and pieces[-1][1] == 59
    assert all(a[1] + 1 == b[0] for a, b in zip(pieces, pieces[1:]))
    joined: dict[int, bytes] = {}
    for first, last, piece in pieces:
        assert sum(len(d) for _, _, d in piece) <= 60 or last == first
        for seg, offset, data in piece:
            if seg == 1:
                assert data == runs[0][2][offset - 100 : offset - 100 + len(data)]
            joined[seg] = joined.get(seg, b"") + data
    assert joined == {1: runs[0][2], 2: runs[1][2]}
    assert list(r.split_runs(1, [(1, 0, frames[0])], 1)) == [(1, 1, ((1, 0, frames[0]),))]  # bigger than the bound: alone
