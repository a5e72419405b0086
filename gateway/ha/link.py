"""One replication connection as Trio sees it: a stream and its sans-IO
codec (persistence/replica/replication.py), with its liveness (gateway/ha/liveness.py):
both ends ping when idle and drop the link after a bounded silence.  Shared
by gateway/ha/replicator.py (the primary) and gateway/ha/backup.py."""

from __future__ import annotations

import ssl
from typing import Any

import trio

from gateway.ha.liveness import HEARTBEAT_S, TIMEOUT_S, Liveness
from persistence.replica import replication as r
from persistence.replica.handshake import AuthenticationError, Handshake

# Bytes read from the socket at once (a Batch frame may be far larger).
RECEIVE_BYTES = 2**20
# A side that hears nothing for this long drops the link ([ha] link_timeout_s).
IDLE_TIMEOUT_S = TIMEOUT_S
# The whole handshake (persistence/replica/handshake.py) must be done within this.
HANDSHAKE_TIMEOUT_S = 5.0


# Connections to a primary's replication port still proving membership (a
# member needs one at a time): at most this many from one address, and in all.
HANDSHAKES_PER_ADDRESS = 4
HANDSHAKES_TOTAL = 64
FULL = ""  # Handshakes.told's key for "the whole pool was full"


def ignore(*args: Any, **kwargs: Any) -> None:
    pass


class Handshakes:
    """The pool a stranger can fill on a primary's replication port: the
    connections that have not yet proved membership, each holding a task and
    a socket for up to :data:`HANDSHAKE_TIMEOUT_S`.  Bounded in all and per
    source address, so a flood from one address cannot keep the members
    out, nor one from many exhaust the process's descriptors."""

    def __init__(self, total: int = HANDSHAKES_TOTAL, per_address: int = HANDSHAKES_PER_ADDRESS) -> None:
        self.total, self.per_address = total, per_address
        self.by_address: dict[str, int] = {}
        self.count = 0
        self.told: set[str] = set()  # addresses whose refusal was logged, until their count drops to 0

    def enter(self, address: str) -> str | None:
        """Count a new connection from ``address``; else the reason it is refused."""
        held = self.by_address.get(address, 0)
        if held >= self.per_address:
            return f"{held} connections from this address are still authenticating (at most {self.per_address})"
        if self.count >= self.total:
            return f"{self.count} connections are still authenticating (at most {self.total}, from all addresses)"
        self.by_address[address] = held + 1
        self.count += 1
        return None

    def leave(self, address: str) -> None:
        held = self.by_address.pop(address) - 1
        self.count -= 1
        if held:
            self.by_address[address] = held
        else:
            self.told.discard(address)
        self.told.discard(FULL)

    def first_refusal(self, address: str) -> bool:
        """Is this refusal news, to be logged?  Once per flood: from one
        address while it holds its share, or into a full pool (any address)
        until a place frees.  So the set holds counted addresses only."""
        key = address if self.by_address.get(address, 0) >= self.per_address else FULL
        if key in self.told:
            return False
        self.told.add(key)
        return True


class LinkDead(Exception):
    """The peer went silent, or its bytes broke the protocol."""


# The errors that end one link (and nothing else).
LINK_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError, r.ProtocolError, LinkDead,
               AuthenticationError)


def peer_host(stream: trio.abc.Stream) -> str:
    """The other end's address without its port (what :class:`Handshakes` counts by)."""
    address = peer_address(stream)
    return address.rpartition(":")[0] or address


def peer_address(stream: trio.abc.Stream) -> str:
    """host:port of the other end, for the log."""
    if isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    try:
        host, port = stream.socket.getpeername()[:2]  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return "?"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Link:
    """One replication connection: a stream and its codec.  One task
    receives; sends are whole frames, one at a time (a lock), so that the
    heartbeat (:meth:`keep_alive`) goes out between the frames of the task
    that streams."""

    def __init__(self, stream: trio.abc.Stream, role: r.Role, *, heartbeat_s: float = HEARTBEAT_S,
                 timeout_s: float = TIMEOUT_S) -> None:
        self.stream = stream
        self.conn = r.ReplicationConnection(role)
        self.liveness = Liveness.start(trio.current_time(), heartbeat_s, timeout_s)
        self._sending = trio.Lock()

    async def authenticate(self, role: str, node_id: str, secret: bytes,
                           timeout_s: float = HANDSHAKE_TIMEOUT_S) -> str:
        """Prove membership and check the peer's (persistence/replica/handshake.py)
        before any frame of the stream; the peer's node id.  Raises
        AuthenticationError (a stranger, a wrong secret, too slow, too many
        bytes); nothing the peer sent is handed on unless it proved itself."""
        shake = Handshake(role, node_id, secret)
        with trio.move_on_after(timeout_s) as scope:
            try:
                await self.stream.send_all(shake.data_to_send())
                while not shake.done:
                    shake.receive_data(await self.stream.receive_some(RECEIVE_BYTES))
                    out = shake.data_to_send()
                    if out:
                        await self.stream.send_all(out)
            except trio.BrokenResourceError as exc:
                # [ha] link_tls: a certificate the CA did not sign, or no TLS at all.
                if isinstance(exc.__cause__, ssl.SSLError):
                    raise AuthenticationError(f"TLS handshake failed: {exc.__cause__}") from None
                raise
        if scope.cancelled_caught:
            raise AuthenticationError(f"no complete handshake within {timeout_s:g} s")
        assert shake.peer_id is not None
        now = trio.current_time()  # the silence bound counts from here, not from the connection
        self.liveness.heard(now)
        self.liveness.sent(now)
        leftover = shake.leftover()
        if leftover:
            self.conn.receive_data(leftover)
        return shake.peer_id

    async def receive(self, timeout_s: float | None = None) -> r.Frame | None:
        """The next frame; None at EOF; LinkDead once nothing was heard for
        ``timeout_s`` (by default the link's timeout)."""
        live = self.liveness
        bound = live.timeout_s if timeout_s is None else timeout_s
        while True:
            frame = next(self.conn.events(), None)
            if frame is not None:
                return frame
            if self.conn.their_eof:
                return None
            with trio.move_on_at(live.heard_at + bound) as scope:
                data = await self.stream.receive_some(RECEIVE_BYTES)
            if scope.cancelled_caught:
                raise LinkDead(f"nothing from the peer in {bound:g} s")
            live.heard(trio.current_time())
            self.conn.receive_data(data)

    async def send(self, frame: r.Frame) -> None:
        data = self.conn.send(frame)
        async with self._sending:
            await self.stream.send_all(data)
            self.liveness.sent(trio.current_time())

    async def keep_alive(self) -> None:
        """Send a Ping whenever nothing else was sent for the heartbeat
        interval, until cancelled (with the link).  Its own task: a send
        blocked by a full socket delays it, a disk write does not."""
        live = self.liveness
        token = 0
        while True:
            if live.ping_due(trio.current_time()):
                token += 1
                await self.send(r.Ping(token))
            else:
                await trio.sleep_until(live.ping_at())
