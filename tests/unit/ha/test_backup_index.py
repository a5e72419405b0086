"""A backup keeps its follower's index caught up through its door, a TCP
link from a scripted primary (the real codec, a real Store's batches): after
the last Ack, with the link idle, the index holds everything written, so a
promotion then hands it over and the new primary's store replays nothing."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import trio

from gateway.ha.backup import Backup
from gateway.ha.link import Link
from persistence.archive import Archive
from persistence.replica import replication as r
from persistence.store import Store
from tests.support.replicator_helpers import Events
from tests.support.replication_helpers import SEGMENT, commit, everything, folder_state, follower, primary
from tests.support.store_helpers import state

WAIT_S = 20.0


async def test_a_backup_catches_its_index_up_and_its_promotion_replays_nothing(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    frames = []
    for round_ in range(6):
        everything(p, n=20, tag=str(round_))
        frames += commit(p)
    last = frames[-1].last_lsn
    f = follower(tmp_path / "f")
    caught_up = trio.Event()

    async def scripted_primary(stream: trio.SocketStream) -> None:
        link = Link(stream, r.Role.PRIMARY)
        assert await link.authenticate("primary", "p", b"") == "b"
        hello = await link.receive(WAIT_S)
        assert isinstance(hello, r.Hello) and hello.last_lsn == 0
        await link.send(r.Hello("p", 1, last, ((1, 1),)))
        for frame in frames:
            await link.send(frame)
        while True:
            ack = await link.receive(WAIT_S)
            if isinstance(ack, r.Ack) and ack.lsn == last:
                break
        # The link stays open and quiet: the backup's idle turns catch up.
        await caught_up.wait()

    with trio.fail_after(WAIT_S * 2):
        async with trio.open_nursery() as nursery:
            (listener,) = await nursery.start(partial(trio.serve_tcp, scripted_primary, 0, host="127.0.0.1"))
            port = listener.socket.getsockname()[1]
            backup = Backup(f, "b", "127.0.0.1", port, connect_attempts=1, log=Events())
            nursery.start_soon(backup.run)
            while f.last_lsn < last or f.index_behind:
                await trio.sleep(0.01)
            caught_up.set()
            nursery.cancel_scope.cancel()

    f.promote(2)
    s = Store(tmp_path / "f" / "store", segment_bytes=SEGMENT, sync="never",
              archive=Archive(tmp_path / "f" / "archive", segment_bytes=1024))
    recovered = s.open(seed=f.seed)
    assert recovered.replayed_records == 0 and s.appended_lsn == last
    s.abandon()
    p.close()
    expected = folder_state(tmp_path / "p")
    assert state(recovered) == expected[0]
    assert folder_state(tmp_path / "f") == expected
