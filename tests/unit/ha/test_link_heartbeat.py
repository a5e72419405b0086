"""Link liveness through its door, a TCP link to a scripted peer (the real
codec).  A backup pings while its disk is busy, so a primary never drops it
for a slow write; a connection attempt nobody answers is given up within the
link's timeout, not the handshake's 5 s; and so a primary drops a backup gone
silent even in the middle of a snapshot (it used to wait on it for as long as
TCP kept the connection)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import trio

from gateway.ha.backup import Backup
from gateway.ha.link import HANDSHAKE_TIMEOUT_S, Link
from persistence.archive import Archive
from persistence.replica import replication as r
from tests.support.replicator_helpers import Events, PrimaryNode, wait_for
from tests.support.store_helpers import message
from tests.support.replication_helpers import SEGMENT, primary
from tests.unit.ha.test_backup_group import WAIT_S, HeldFollower, frames_of

HEARTBEAT_S = 0.05
TIMEOUT_S = 0.3


async def test_a_backup_pings_its_primary_while_its_disk_write_is_held(tmp_path: Path) -> None:
    p = primary(tmp_path / "p")
    frames = frames_of(p, 1)
    f = HeldFollower(tmp_path / "f" / "store", segment_bytes=SEGMENT,
                     archive=Archive(tmp_path / "f" / "archive", segment_bytes=1024))
    f.open()
    pings: list[r.Ping] = []

    async def scripted_primary(stream: trio.SocketStream) -> None:
        link = Link(stream, r.Role.PRIMARY)
        assert await link.authenticate("primary", "p", b"") == "b"
        assert isinstance(await link.receive(WAIT_S), r.Hello)
        await link.send(r.Hello("p", 1, frames[-1].last_lsn, ((1, 1),)))
        await link.send(frames[0])
        with trio.fail_after(WAIT_S):
            await trio.to_thread.run_sync(f.writing.wait)
        # The write is held: the primary sends nothing more, and hears Pings anyway.
        while len(pings) < 3:
            frame = await link.receive(WAIT_S)
            assert isinstance(frame, r.Ping), frame
            pings.append(frame)
        f.release.set()
        while not isinstance(frame := await link.receive(WAIT_S), r.Ack):
            assert isinstance(frame, r.Ping), frame
        assert frame.lsn == frames[-1].last_lsn
        await stream.aclose()

    with trio.fail_after(WAIT_S * 2):
        async with trio.open_nursery() as nursery:
            (listener,) = await nursery.start(partial(trio.serve_tcp, scripted_primary, 0, host="127.0.0.1"))
            port = listener.socket.getsockname()[1]
            backup = Backup(f, "b", "127.0.0.1", port, connect_attempts=1, heartbeat_s=HEARTBEAT_S,
                            idle_timeout_s=TIMEOUT_S, log=Events())
            await backup.run()
            nursery.cancel_scope.cancel()
    assert [ping.token for ping in pings] == [1, 2, 3]
    f.close()
    p.close()


async def test_an_attempt_nobody_answers_is_given_up_within_the_link_timeout(tmp_path: Path) -> None:
    # A primary's port reached during a cut: the connection is taken, the handshake never answered.
    f = HeldFollower(tmp_path / "f" / "store", segment_bytes=SEGMENT,
                     archive=Archive(tmp_path / "f" / "archive", segment_bytes=1024))
    f.open()
    connections = 0
    second = trio.Event()

    async def black_hole(stream: trio.SocketStream) -> None:
        nonlocal connections
        connections += 1
        if connections == 2:
            second.set()
        await trio.sleep_forever()

    log = Events()
    # Well short of the handshake's own 5 s bound, which the attempt used to wait for.
    with trio.fail_after(HANDSHAKE_TIMEOUT_S / 2):
        async with trio.open_nursery() as nursery:
            (listener,) = await nursery.start(partial(trio.serve_tcp, black_hole, 0, host="127.0.0.1"))
            port = listener.socket.getsockname()[1]
            backup = Backup(f, "b", "127.0.0.1", port, connect_attempts=100, heartbeat_s=HEARTBEAT_S,
                            idle_timeout_s=TIMEOUT_S, log=log)
            nursery.start_soon(backup.run)
            await second.wait()
            nursery.cancel_scope.cancel()
    (down,) = [fields for event, fields in log.seen if event == "replication_link_down"][:1]
    assert down["failures"] == 1
    f.close()


async def test_a_primary_drops_a_backup_gone_silent_in_the_middle_of_a_snapshot(tmp_path: Path) -> None:
    # A window too small to tail from LSN 1, and a store far larger than the
    # socket buffers: the snapshot's sender blocks on a backup that reads nothing.
    node = PrimaryNode(tmp_path / "p", ping_interval_s=HEARTBEAT_S, idle_timeout_s=TIMEOUT_S, window_bytes=1000)
    with trio.fail_after(WAIT_S * 2):
        async with trio.open_nursery() as nursery:
            await node.start(nursery)
            for i in range(256):  # batch by batch: the window keeps only the newest
                node.store.add_message(message(f"m{i}", body=b"x" * 2**16), ["/queue/a"])
                await node.commit()
            stream = await trio.open_tcp_stream("127.0.0.1", node.port)
            link = Link(stream, r.Role.BACKUP)
            assert await link.authenticate("backup", "b", b"") == "p"
            await link.send(r.Hello("b", 0, 0, ()))
            await wait_for(lambda: "b" in node.replicator.peers and node.replicator.peers["b"].snapshotting,
                           "the snapshot begun")
            # The backup says nothing more and reads nothing: a frozen or cut-off peer.
            await wait_for(lambda: "b" not in node.replicator.peers, "the silent backup dropped",
                           timeout_s=HANDSHAKE_TIMEOUT_S)
            ended = [fields for event, fields in node.log.seen if event == "backup_link_ended"]
            assert ended and ended[0]["reason"] == f"nothing from the peer in {TIMEOUT_S:g} s"
            await stream.aclose()
            nursery.cancel_scope.cancel()
    node.store.close()
