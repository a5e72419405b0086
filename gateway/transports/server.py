"""Listeners and connections: with connection.py (one connection's reads,
writes and tasks) and the admin server, the only place that owns sockets and
tasks.

The server accepts sockets (plain, TLS, WebSocket) and runs each as a
:class:`~gateway.transports.connection.Connection` over a protocol-agnostic
session; the same loop serves every protocol whose session has the shape of
:class:`~gateway.transports.connection.Session`.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import itertools
import ssl
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import trio

from gateway.auth import Transport
from gateway.transports.connection import Connection, Pass, Session
from gateway.transports.timers import Timers

T = TypeVar("T")
# How long closing a stream may take (a TLS close_notify to a stuck peer).
CLOSE_NOTIFY_S = 1.0


class TrioClock:
    """The core's clock, on Trio's time so tests can use an autojump clock."""

    def monotonic(self) -> float:
        return trio.current_time()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000


# Where each listener's port is set, for the line a port that cannot be bound gets.
PORT_SETTINGS = {
    "stomp": "stomp_port or --stomp-port", "mqtt": "mqtt_port or --mqtt-port", "admin": "admin_port or --admin-port",
    "stomp-tls": "stomp_tls_port", "mqtt-tls": "mqtt_tls_port", "admin-tls": "admin_tls_port",
    "replication": "ha.replication_listen",
}


class ListenError(OSError):
    """A listener that could not bind: the message names the listener, its
    address and port, and what to do about it (one line, for the operator)."""


def listen_failure(name: str, host: str, port: int, exc: OSError) -> ListenError:
    where = f"{name} listener cannot listen on {host}:{port}"
    setting = PORT_SETTINGS.get(name, "its port")
    if exc.errno == errno.EADDRINUSE:
        text = (f"{where}: the port is already in use by another process (a system mosquitto often holds 1883): "
                f"stop it, or choose another port with {setting} (0 picks a free one)")
    elif exc.errno == errno.EACCES:
        text = f"{where}: permission denied (ports below 1024 need privileges): choose a port above 1023 with {setting}"
    elif exc.errno == errno.EADDRNOTAVAIL:
        text = f"{where}: {host} is no address of this machine: set bind or --bind to one of its addresses (or 0.0.0.0)"
    else:
        text = f"{where}: {exc.strerror or exc}"
    failure = ListenError(text)
    failure.errno = exc.errno
    return failure


async def open_listeners(name: str, host: str, port: int) -> list[Any]:
    """``trio.open_tcp_listeners``, failing with a :class:`ListenError` that names the listener."""
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise listen_failure(name, host, port, exc) from None


# Builds a session for a new connection: (connection id, bound logger,
# what the server knows of its transport) -> session.
SessionFactory = Callable[[str, Any, Transport], Session]
# Connections over a limit still get a session, which refuses their CONNECT
# the protocol's way; past this many such connections at once, more are
# closed at accept without a word (a flood must not buy sessions).
REFUSAL_SLOTS = 256


@dataclasses.dataclass(frozen=True)
class ListenerSpec:
    name: str  # protocol name, for logs and the port map
    host: str
    port: int
    factory: SessionFactory
    ssl_context: ssl.SSLContext | None = None


@dataclasses.dataclass(frozen=True)
class Limits:
    max_connections: int = 0  # 0: no limit
    max_connections_per_address: int = 0
    tls_handshake_timeout_s: float = 10.0


class Server:
    """Runs listeners and every connection they accept; drains on :meth:`stop`."""

    def __init__(
        self,
        log: Any,
        *,
        durable_lsn: Callable[[], int],
        grace_s: float = 10.0,
        limits: Limits = Limits(),
        certificate_user: Callable[[dict[str, Any] | None], str | None] = lambda certificate: None,
    ) -> None:
        self.log = log
        self.grace_s = grace_s
        self.stop_reason = "broker is shutting down"  # what clients are told when it stops
        self.limits = limits
        self.certificate_user = certificate_user
        # Connections served (not refused) by source host, and those being refused.
        self.by_host: dict[str, int] = {}
        self.refusing = 0
        self.tls_handshakes_failed = 0
        self.connections: dict[str, Connection] = {}
        self._durable_lsn = durable_lsn
        self._conn_ids = itertools.count(1)
        self._stop = trio.Event()
        self._idle = trio.Event()
        self._idle.set()
        self._gated: set[Connection] = set()
        self._pass = Pass()  # output of the pass running now, written at its end
        self._timers = Timers()  # every connection's deadlines, one task
        # Totals of connections already gone (live ones are added on demand).
        self.closed_bytes_in = 0
        self.closed_bytes_out = 0
        self.accepted: dict[str, int] = {}  # connections accepted, by protocol
        self.stopping = False

    @property
    def after_input(self) -> Callable[[], None] | None:
        """What to call once a session has acted (the app starts a store
        write): after each connection's input, and after a pass's writes
        resumed deliveries."""
        return self._pass.after_output

    @after_input.setter
    def after_input(self, hook: Callable[[], None] | None) -> None:
        self._pass.after_output = hook

    @property
    def admitted(self) -> int:
        """Connections served, not being refused."""
        return len(self.connections) - self.refusing

    def traffic(self) -> tuple[int, int]:
        """Bytes received and sent since start, all connections."""
        live = list(self.connections.values())
        return (
            self.closed_bytes_in + sum(c.bytes_in for c in live),
            self.closed_bytes_out + sum(c.io.outbox.sent_bytes for c in live),
        )

    def durable_advanced(self) -> None:
        """The store made more LSNs durable: write what it held (receipts,
        PUBACKs), each connection's in one send, in this pass."""
        # In place: every connection holds this very set.
        gated = list(self._gated)
        self._gated.clear()
        with self._pass:
            self._pass.dirty.extend(gated)

    def durable_failed(self, first_lsn: int, last_lsn: int, reason: str, *, stored: bool = False) -> None:
        """The store could not write this LSN range (``stored``: an HA primary
        wrote it, but its backups did not confirm it): whoever waits on it is told."""
        for connection in list(self.connections.values()):
            connection.session.storage_failed(first_lsn, last_lsn, reason, stored=stored)
            connection.wake_writer()

    def act(self, change: Callable[[], T]) -> T:
        """Run ``change``, something other than a connection's input that
        acts on sessions (a reload's re-check of what clients may read), as a
        pass: what it puts in outboxes is written once at its end, and each
        session it closed gets its closing bound and its writer, as one
        closed by its own input does."""
        with self._pass:
            result = change()
        for connection in list(self.connections.values()):
            if connection.io.closed:
                connection.closed_elsewhere()
        return result

    def stop(self, reason: str = "broker is shutting down", *, grace_s: float | None = None) -> None:
        """Close the listeners, tell every client ``reason``, drain within
        ``grace_s`` (the configured grace by default; 0: closed at once)."""
        self.stopping = True
        self.stop_reason = reason
        if grace_s is not None:
            self.grace_s = grace_s
        self._stop.set()

    async def run(self, specs: list[ListenerSpec], *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Bind every listener, report ``{name: port}``, serve until :meth:`stop`, then drain."""
        for spec in specs:  # counted from zero, so /metrics has their samples before anyone connects
            self.accepted.setdefault(spec.name, 0)
        async with trio.open_nursery() as handlers:  # owns every connection task
            handlers.start_soon(self._timers.run)
            async with trio.open_nursery() as listeners:  # owns the accept loops
                ports = {}
                for spec in specs:
                    ports[spec.name] = await listeners.start(self._listen, spec, handlers)
                task_status.started(ports)
                await self._stop.wait()
                listeners.cancel_scope.cancel()
            self.log.info("listeners_closed", connections=len(self.connections))
            for connection in list(self.connections.values()):
                connection.shutdown(self.stop_reason)
            with trio.move_on_after(self.grace_s):
                await self._idle.wait()
            handlers.cancel_scope.cancel()

    async def _listen(self, spec: ListenerSpec, handlers: trio.Nursery, *, task_status: Any) -> None:
        listeners = await open_listeners(spec.name, spec.host, spec.port)
        port = listeners[0].socket.getsockname()[1]
        if spec.ssl_context is not None:
            listeners = [trio.SSLListener(listener, spec.ssl_context) for listener in listeners]
        self.log.info("listener_started", protocol=spec.name, host=spec.host, port=port, tls=spec.ssl_context is not None)
        task_status.started(port)
        # Connection tasks go in the server-wide handler nursery, not this one,
        # so closing the listeners stops accepting without cutting connections.
        await trio.serve_listeners(
            functools.partial(self._accepted, spec, handlers), listeners, handler_nursery=handlers
        )

    def _accepted(self, spec: ListenerSpec, handlers: trio.Nursery, stream: trio.abc.Stream) -> Coroutine[Any, Any, None]:
        """The task for an accepted stream: a plain socket goes straight to
        :meth:`serve_stream` (one coroutine frame less per idle connection)."""
        if isinstance(stream, trio.SSLStream):
            return self._handshake(spec, handlers, stream)
        return self.serve_stream(spec.name, spec.factory, stream, peer_address(stream), tasks=handlers)

    async def _handshake(self, spec: ListenerSpec, handlers: trio.Nursery, stream: trio.SSLStream) -> None:
        peer = peer_address(stream)
        # Handshake before the session exists, so a client certificate's
        # user is known at CONNECT; a peer that stalls it is cut off.
        failure: str | None = "handshake timed out"
        with trio.move_on_after(self.limits.tls_handshake_timeout_s):
            try:
                await stream.do_handshake()
                failure = None
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                failure = str(exc.__cause__ or exc)
        if failure is not None:
            self.tls_handshakes_failed += 1
            self.log.info("tls_handshake_failed", protocol=spec.name, peer=peer, reason=failure[:200])
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            return
        await self.serve_stream(spec.name, spec.factory, stream, peer, tasks=handlers)

    def _admission(self, host: str) -> str | None:
        """Why a new connection from ``host`` is over a limit, or None."""
        limits = self.limits
        if limits.max_connections and self.admitted >= limits.max_connections:
            return f"too many connections (limit {limits.max_connections})"
        if limits.max_connections_per_address and self.by_host.get(host, 0) >= limits.max_connections_per_address:
            return f"too many connections from {host} (limit {limits.max_connections_per_address})"
        return None

    async def serve_stream(
        self, name: str, factory: SessionFactory, stream: trio.abc.Stream, peer: str, *, tasks: trio.Nursery | None = None
    ) -> None:
        """Run one connection over any byte stream (a socket, TLS, a
        WebSocket's messages) until it closes; ``name`` is its protocol label,
        ``tasks`` where its writer runs (None: a nursery of its own)."""
        host = peer_host(peer)
        refused = self._admission(host)
        if refused is not None and self.refusing >= REFUSAL_SLOTS:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            return
        conn_id = f"{name}-{next(self._conn_ids)}"
        log = self.log.bind(conn_id=conn_id, peer=peer)
        tls = _tls_stream(stream)
        transport = Transport(
            peer=peer, host=host, tls=tls is not None, refused=refused,
            certificate_user=self._certificate_user(tls, log),
        )
        session = factory(conn_id, log, transport)
        connection = Connection(stream, session, log, self._durable_lsn, self._gated, self.after_input, self._pass, self._timers, tasks)
        connection.protocol = name
        connection.peer = peer
        self.accepted[name] = self.accepted.get(name, 0) + 1
        self.connections[conn_id] = connection
        if refused is None:
            self.by_host[host] = self.by_host.get(host, 0) + 1
        else:
            self.refusing += 1
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        log.info("connection_opened", protocol=name, tls=transport.tls)
        try:
            await connection.run()
        except Exception:
            connection.failed()
        finally:
            session.close(self.stop_reason)
            del self.connections[conn_id]
            if refused is None:
                if self.by_host[host] == 1:
                    del self.by_host[host]
                else:
                    self.by_host[host] -= 1
            else:
                self.refusing -= 1
            self._gated.discard(connection)
            self.closed_bytes_in += connection.bytes_in
            self.closed_bytes_out += connection.io.outbox.sent_bytes
            if not self.connections:
                self._idle.set()
            log.info("connection_closed", reason=connection.io.close_reason)
            await close_stream(stream)

    def _certificate_user(self, tls: trio.SSLStream | None, log: Any) -> str | None:
        if tls is None:
            return None
        certificate = tls.getpeercert()
        user = self.certificate_user(certificate)
        if certificate and user is None:
            log.info("client_certificate_unmapped", detail="verified, but no user for its subject; CONNECT credentials apply")
        return user


def peer_address(stream: trio.abc.Stream) -> str:
    """``host:port`` of the client on an accepted socket or TLS stream."""
    socket_stream = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    try:
        host, port = socket_stream.socket.getpeername()[:2]  # type: ignore[attr-defined]
    except OSError:
        return "unknown"
    return f"{host}:{port}"


def peer_host(peer: str) -> str:
    """The host of a ``host:port`` peer: what per-address limits count."""
    return peer.rsplit(":", 1)[0] if ":" in peer else peer


async def close_stream(stream: trio.abc.Stream) -> None:
    """Close ``stream`` even while being cancelled; a TLS close_notify gets
    a moment, not forever, from a peer that stopped reading."""
    with trio.CancelScope(shield=True):
        with trio.move_on_after(CLOSE_NOTIFY_S):
            await stream.aclose()
            return
        await trio.aclose_forcefully(stream)


def _tls_stream(stream: Any) -> trio.SSLStream | None:
    """The TLS layer under ``stream`` (itself, or under a WebSocket), if any."""
    for _ in range(4):  # transports nest a few deep at most
        if isinstance(stream, trio.SSLStream):
            return stream
        stream = getattr(stream, "transport_stream", None)
        if stream is None:
            return None
    return None
