"""The connection task set over in-memory streams, with Trio's autojump clock
so heart-beat and login deadlines are exact and instant."""

from __future__ import annotations

import structlog
import trio
import trio.testing

from core.broker import Broker
from gateway.transports.timers import Timers
from gateway.session.timers import Beat
from gateway.transports.server import Connection, TrioClock
from gateway.stomp import codec, frames
from gateway.stomp.session import StompSession, StompSettings

CONNECT = b"CONNECT\naccept-version:1.2\nheart-beat:%d,%d\n\n\x00"


class Peer:
    """The client end: reads whole frames (and counts heart-beats) from the server."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.codec = codec.StompConnection(codec.Role.CLIENT)
        self.codec.set_version("1.2")
        self.heartbeats: list[float] = []
        self.frames: list[frames.Frame] = []
        self.eof = trio.Event()

    async def read_all(self) -> None:
        while True:
            data = await self.stream.receive_some(65536)
            if not data:
                self.eof.set()
                return
            if data.strip(b"\n") == b"":
                self.heartbeats.extend([trio.current_time()] * data.count(b"\n"))
                continue
            self.codec.receive_data(data)
            self.frames.extend(self.codec.events())


async def run_and_close(connection: Connection) -> None:
    """What the server does per connection: run it, then close the socket."""
    try:
        await connection.run()
    finally:
        await connection.stream.aclose()


def make_connection(stream: trio.abc.Stream, timers: Timers | None = None, **settings: float) -> tuple[Connection, StompSession]:
    clock = TrioClock()
    session = StompSession(
        Broker(clock),
        clock,
        StompSettings(**settings),  # type: ignore[arg-type]
        conn_id="c1",
        log=structlog.get_logger().bind(conn_id="c1"),
    )
    return Connection(stream, session, session.log, lambda: 0, timers=timers), session


async def test_broker_sends_heartbeats_at_the_agreed_rate(autojump_clock: trio.testing.MockClock) -> None:
    server_end, client_end = trio.testing.memory_stream_pair()
    connection, session = make_connection(server_end, heartbeat_send_ms=500, heartbeat_receive_ms=0)
    peer = Peer(client_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_and_close, connection)
        nursery.start_soon(peer.read_all)
        await client_end.send_all(CONNECT % (0, 2000))  # client wants one every 2 s
        await trio.sleep(10.5)
        assert type(peer.frames[0]) is frames.Connected
        assert peer.frames[0].headers["heart-beat"] == "500,0"
        # max(500 offered, 2000 wanted) = every 2 s: at 2, 4, 6, 8, 10.
        assert len(peer.heartbeats) == 5
        gaps = [b - a for a, b in zip(peer.heartbeats, peer.heartbeats[1:])]
        assert all(abs(gap - 2.0) < 0.01 for gap in gaps)
        nursery.cancel_scope.cancel()


async def test_silent_client_is_dropped_after_interval_times_grace(autojump_clock: trio.testing.MockClock) -> None:
    server_end, client_end = trio.testing.memory_stream_pair()
    connection, session = make_connection(server_end, heartbeat_send_ms=0, heartbeat_receive_ms=1000)
    peer = Peer(client_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_and_close, connection)
        nursery.start_soon(peer.read_all)
        await client_end.send_all(CONNECT % (1000, 0))
        # A little late (1.9 s between beats, within grace 2) keeps the connection.
        for _ in range(3):
            await trio.sleep(1.9)
            await client_end.send_all(b"\n")
        assert not session.closed
        started = trio.current_time()
        await peer.eof.wait()
        assert trio.current_time() - started >= 2.0
        errors = [f for f in peer.frames if type(f) is frames.Error]
        assert errors and "heart-beat" in errors[0].headers["message"]
        assert session.closed


async def test_strict_grace_drops_a_client_at_the_agreed_interval(autojump_clock: trio.testing.MockClock) -> None:
    server_end, client_end = trio.testing.memory_stream_pair()
    connection, session = make_connection(server_end, heartbeat_send_ms=0, heartbeat_receive_ms=1000, heartbeat_grace=1.0)
    peer = Peer(client_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_and_close, connection)
        nursery.start_soon(peer.read_all)
        await client_end.send_all(CONNECT % (1000, 0))
        await trio.sleep(0.9)
        await client_end.send_all(b"\n")  # on time
        started = trio.current_time()
        await peer.eof.wait()
        # No grace: dropped once the 1 s interval passes, not at 2 s.
        assert 0.999 < trio.current_time() - started < 1.5
        errors = [f for f in peer.frames if type(f) is frames.Error]
        assert errors and "heart-beat" in errors[0].headers["message"]


async def test_no_connect_within_login_timeout_is_closed(autojump_clock: trio.testing.MockClock) -> None:
    server_end, client_end = trio.testing.memory_stream_pair()
    connection, session = make_connection(server_end, connect_timeout_s=3.0)
    peer = Peer(client_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_and_close, connection)
        nursery.start_soon(peer.read_all)
        await peer.eof.wait()
        assert 3.0 <= trio.current_time() < 3.0 + 5.0
        assert type(peer.frames[0]) is frames.Error
        assert "CONNECT" in peer.frames[0].headers["message"]


async def test_error_is_flushed_before_close(autojump_clock: trio.testing.MockClock) -> None:
    server_end, client_end = trio.testing.memory_stream_pair()
    connection, session = make_connection(server_end)
    peer = Peer(client_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_and_close, connection)
        nursery.start_soon(peer.read_all)
        await client_end.send_all(CONNECT % (0, 0) + b"BOGUS\nreceipt:r9\n\n\x00")
        await peer.eof.wait()
        assert [type(f) for f in peer.frames] == [frames.Connected, frames.Error]
        assert "unknown command" in peer.frames[1].headers["message"]
        assert session.close_reason is not None


class BrokenBeat(Beat):
    """A heart-beat whose check meets a bug, as a session's might (a Beat:
    the skeleton's slot is typed, and checked when compiled with ``make fast``)."""

    __slots__ = ()

    def __init__(self, at: float) -> None:
        super().__init__(at, b"\n")
        self.interval_s = 0.5

    def due(self, now: float) -> bool:
        raise RuntimeError("bug")


async def test_a_bug_at_one_connections_deadline_costs_that_connection_only(autojump_clock: trio.testing.MockClock) -> None:
    timers = Timers()  # shared, as the server's: one task fires both connections' deadlines
    ends = [trio.testing.memory_stream_pair() for _ in range(2)]
    (broken, broken_session), (fine, _) = [make_connection(server_end, timers, heartbeat_send_ms=500) for server_end, _ in ends]
    broken_peer, fine_peer = [Peer(client_end) for _, client_end in ends]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timers.run)
        for connection, peer in ((broken, broken_peer), (fine, fine_peer)):
            nursery.start_soon(run_and_close, connection)
            nursery.start_soon(peer.read_all)
            await peer.stream.send_all(CONNECT % (0, 500))
        await trio.sleep(0.1)
        broken_session.skeleton.beat = BrokenBeat(trio.current_time())
        await broken_peer.eof.wait()
        assert broken_session.close_reason == "internal error"
        since = trio.current_time()
        await trio.sleep(2.1)
        assert len([t for t in fine_peer.heartbeats if t > since]) == 4  # every 0.5 s, as agreed
        nursery.cancel_scope.cancel()
