"""What the replication tests (tests/unit/persistence/replica/test_follower.py and
test_catchup.py) share: a primary store in a data folder, its batches taken
as the committer takes them and carried through the replication codec both
ways, a follower in another folder, and the full state of a folder (records,
bodies, archives) as a plain Store recovers it."""

from __future__ import annotations

from pathlib import Path

from core.storage import StoredMessage
from persistence.archive import Archive, list_topics
from persistence.journal import Batch
from persistence.replica import replication as r
from persistence.replica.catchup import SnapshotSource
from persistence.replica.epochs import History
from persistence.replica.follower import Follower
from persistence.store import Store
from tests.support.store_helpers import message, state

SEGMENT = 4096


def primary(data_dir: Path, **kwargs) -> Store:
    kwargs.setdefault("segment_bytes", SEGMENT)
    kwargs.setdefault("sync", "never")
    s = Store(data_dir / "store", archive=Archive(data_dir / "archive", segment_bytes=1024), **kwargs)
    s.open()
    return s


def follower(data_dir: Path) -> Follower:
    f = Follower(data_dir / "store", segment_bytes=SEGMENT, archive=Archive(data_dir / "archive", segment_bytes=1024))
    f.open()
    return f


class Link:
    """A primary's and a backup's codec, back to back."""

    def __init__(self) -> None:
        self.primary = r.ReplicationConnection(r.Role.PRIMARY)
        self.backup = r.ReplicationConnection(r.Role.BACKUP)
        self.backup.receive_data(self.primary.send(r.Hello("primary", 0, 0, ())))
        assert list(self.backup.events()) == [r.Hello("primary", 0, 0, ())]
        self.primary.receive_data(self.backup.send(r.Hello("backup", 0, 0, ())))
        assert len(list(self.primary.events())) == 1

    def to_backup(self, frame: r.Frame) -> list[r.Frame]:
        self.backup.receive_data(self.primary.send(frame))
        return list(self.backup.events())

    def to_primary(self, frame: r.Frame) -> list[r.Frame]:
        self.primary.receive_data(self.backup.send(frame))
        return list(self.primary.events())


def frame_of(batch: Batch, epoch: int) -> r.Batch:
    return r.Batch(epoch, batch.first_lsn, batch.last_lsn, tuple((s, o, bytes(d)) for s, o, d in batch.runs))


def commit(store: Store, epoch: int = 1) -> list[r.Batch]:
    """Take and write every pending batch as the committer does; the Batch
    frames a primary would send (sync-only batches carry nothing)."""
    frames = []
    while True:
        batch = store.take_batch()
        if batch is None:
            return frames
        store.write_batch(batch)
        store.batch_written(batch)
        if batch.runs:
            frames.append(frame_of(batch, epoch))


def ship(frames: list[r.Batch], f: Follower, link: Link | None = None) -> list[r.Ack]:
    """Each frame through the codec to the follower, its Ack back."""
    link = link or Link()
    acks = []
    for frame in frames:
        (decoded,) = link.to_backup(frame)
        assert decoded == frame
        (ack,) = link.to_primary(f.apply(decoded))  # type: ignore[arg-type]
        acks.append(ack)
    return acks


def send_snapshot(source: SnapshotSource, f: Follower, chunk_bytes: int = 1000) -> r.Ack:
    link = Link()
    (begin,) = link.to_backup(source.begin)
    f.begin_snapshot(begin)  # type: ignore[arg-type]
    for chunk in source.chunks(chunk_bytes):
        (decoded,) = link.to_backup(chunk)
        f.file_chunk(decoded)  # type: ignore[arg-type]
    (end,) = link.to_backup(source.end)
    source.close()
    return f.end_snapshot(end)  # type: ignore[arg-type]


def archive_rows(archive: Archive) -> dict[str, list[tuple[int, bytes, bytes]]]:
    out = {}
    for info in list_topics(archive):
        reader = archive.reader(info.topic, info.earliest, info.latest)
        rows_of = []
        for _ in range(10_000):
            rows = reader.read(1000)
            if not rows:
                break
            rows_of.extend(zip(rows.offsets, rows.ids, rows.bodies))
        reader.close()
        out[info.topic] = rows_of
    return out


def folder_state(data_dir: Path) -> tuple:
    """Everything a plain Store recovers from ``data_dir``: records, every
    live message's headers and body, the archives, and the last LSN."""
    s = Store(data_dir / "store", segment_bytes=SEGMENT, sync="never", archive=Archive(data_dir / "archive", segment_bytes=1024))
    rec = s.open()
    bodies = {m.id: (s.read_message(m.location).headers, s.read_message(m.location).body)
              for q in rec.queues.values() for m in q}
    out = (state(rec), bodies, archive_rows(s.archive), s.appended_lsn)  # type: ignore[arg-type]
    s.abandon()
    return out


def archived(name: str) -> StoredMessage:
    return message(f"a{name}", "/topic/arch", body=b"archived " + name.encode())


def everything(s: Store, n: int = 30, tag: str = "") -> None:
    """Messages, acks, durable subscriptions, transactions, retained notes,
    commit keys and archive records, over several segments."""
    s.add_subscription(f"durable:c:s{tag}", "/topic/t")
    for i in range(n):
        s.add_message(message(f"q{tag}{i}", body=b"x" * 60), ["/queue/a"])
        s.add_message(message(f"t{tag}{i}", "/topic/t"), [f"durable:c:s{tag}", "/queue/copy"])
        s.archive_message("/topic/arch", archived(f"{tag}{i}"))
        if i % 3 == 0:
            s.ack("/queue/a", f"q{tag}{i}")
    s.transaction([(message(f"tx1{tag}"), ["/queue/a"]), (message(f"tx2{tag}"), ["/queue/b"])],
                  [("/queue/a", f"q{tag}1")], archived=[("/topic/arch", archived(f"tx{tag}"))], commit_key=f"key{tag}")
    s.retain(f"a/b{tag}", message(f"r{tag}", "/topic/a.b"), 1)
    s.note("mqtt-session", f"client{tag}", b"state")
    s.note("mqtt-session", "gone", b"x")
    s.note("mqtt-session", "gone", None)
    s.remove_subscription(f"durable:c:s{tag}")


def history_of(epoch: int) -> History:
    return ((epoch, 1),)
