"""A backup's group commit through its door, a TCP link: Batch frames that
arrive while the backup writes the previous one go to disk together and are
acked once, by their last LSN; the folder then holds the primary's state.
The primary is scripted (the real codec, a real Store's batches) so that the
frames' arrival during the write is certain, not a race."""

from __future__ import annotations

import threading
from functools import partial
from pathlib import Path

import trio
import trio.testing

from gateway.ha.backup import READ_AHEAD_FRAMES, Backup
from gateway.ha.link import Link
from persistence.archive import Archive
from persistence.replica import replication as r
from persistence.replica.follower import Follower
from persistence.replica.replication import Batch as BatchFrame
from persistence.store import Store
from tests.support.replicator_helpers import Events
from tests.support.replication_helpers import SEGMENT, commit, everything, folder_state, primary

WAIT_S = 20.0


class HeldFollower(Follower):
    """Its first write waits (in the worker thread) until ``release`` is set."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.release = threading.Event()
        self.writing = threading.Event()
        self.writes: list[tuple[int, int]] = []

    def write(self, step) -> None:
        if not step.frame.runs:  # a checkpoint of its upkeep (an empty step): not a batch
            super().write(step)
            return
        self.writes.append((step.frame.first_lsn, step.frame.last_lsn))
        if len(self.writes) == 1:
            self.writing.set()
            assert self.release.wait(WAIT_S)
        super().write(step)


def frames_of(store: Store, rounds: int) -> list[BatchFrame]:
    frames = []
    for round_ in range(rounds):
        everything(store, n=2, tag=str(round_))
        frames += commit(store)
    return frames


async def test_frames_arriving_during_a_write_are_written_together_and_acked_once(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    frames = frames_of(p, 4)
    assert 3 <= len(frames) <= READ_AHEAD_FRAMES + 1  # the ones after the first all fit in the read-ahead
    f = HeldFollower(tmp_path / "f" / "store", segment_bytes=SEGMENT,
                     archive=Archive(tmp_path / "f" / "archive", segment_bytes=1024))
    f.open()
    acks: list[r.Ack] = []

    async def scripted_primary(stream: trio.SocketStream) -> None:
        link = Link(stream, r.Role.PRIMARY)
        assert await link.authenticate("primary", "p", b"") == "b"  # no secret on either side
        hello = await link.receive(WAIT_S)
        assert isinstance(hello, r.Hello) and hello.last_lsn == 0
        await link.send(r.Hello("p", 1, frames[-1].last_lsn, ((1, 1),)))
        await link.send(frames[0])
        with trio.fail_after(WAIT_S):
            await trio.to_thread.run_sync(f.writing.wait)
        for frame in frames[1:]:  # while the first is being written
            await link.send(frame)
        await trio.testing.wait_all_tasks_blocked(0.05)  # the backup has read them all
        f.release.set()
        while not acks or acks[-1].lsn < frames[-1].last_lsn:
            ack = await link.receive(WAIT_S)
            if isinstance(ack, r.Ping):  # its heartbeat, should the write take a while
                continue
            assert isinstance(ack, r.Ack)
            acks.append(ack)
        await stream.aclose()

    with trio.fail_after(WAIT_S * 2):
        async with trio.open_nursery() as nursery:
            (listener,) = await nursery.start(partial(trio.serve_tcp, scripted_primary, 0, host="127.0.0.1"))
            port = listener.socket.getsockname()[1]
            backup = Backup(f, "b", "127.0.0.1", port, connect_attempts=1, log=Events())
            await backup.run()
            nursery.cancel_scope.cancel()

    assert f.writes == [(1, frames[0].last_lsn), (frames[1].first_lsn, frames[-1].last_lsn)]
    assert acks == [r.Ack(1, frames[0].last_lsn), r.Ack(1, frames[-1].last_lsn)]
    f.close()
    p.close()
    assert folder_state(tmp_path / "f") == folder_state(tmp_path / "p")
