"""The admin HTTP server: h11 over Trio, one task per connection, every
request bounded in size and time; and the probe port beside it.  What a
request means is api.py's job."""

from __future__ import annotations

import dataclasses
import ssl
from collections import deque
from typing import Any, Protocol

import h11
import trio

from gateway import tasks
from gateway.auth import ADMIN, Gatekeeper, VerificationPending
from gateway.transports.server import close_stream, open_listeners, peer_address, peer_host
from gateway.admin.api import AdminApi, AdminSettings
from gateway.admin.http import SECURITY_HEADERS, Request, Response, error
from gateway.transports.websocket import Upgrades

MAX_HEAD_BYTES = 16 * 1024
RECEIVE_BYTES = 64 * 1024
SERVER_HEADER = b"gateway-admin"
# Password checks waiting for a worker on a port that checks its own
# (a backup's); past it, "busy" (503), as the broker's own backlog does.
PASSWORD_BACKLOG = 16
PROBES = ("/healthz", "/livez", "/readyz")  # what Kubernetes asks; answered quietly


class _StreamAborted(Exception):
    """A streamed body failed part-way: the connection is cut, so the client
    sees an incomplete body rather than a short one that looks whole."""


class AdminSlots:
    """Connections open on the admin ports (plain and TLS together), bounded
    by ``[admin] max_connections`` in all and, from one address, by ``[admin]
    max_connections_per_address`` (and the server's own
    ``max_connections_per_address`` where that is lower).  Past either, a new
    connection is closed at accept: idle sockets on this port cannot take the
    file descriptors the messaging listeners need, and (with the idle
    timeout) a few addresses cannot hold every slot.  A connection that
    becomes a WebSocket gives its slot back, as the server's own limits count
    it from then on (and refuse its CONNECT the protocol's way).  The probes
    have a port of their own (the probe port, below), so a full admin port
    need fail no probe."""

    def __init__(self, server: Any, limit: int, per_address: int = 0) -> None:
        self.server = server
        self.limit = limit
        self.per_address = per_address
        self.open = 0
        self.refused = 0
        self.by_host: dict[str, int] = {}

    def take(self, host: str) -> bool:
        per_address = min((n for n in (self.per_address, self.server.limits.max_connections_per_address) if n),
                          default=0)
        if self.open >= self.limit or (per_address and self.by_host.get(host, 0) >= per_address):
            self.refused += 1
            return False
        self.open += 1
        self.by_host[host] = self.by_host.get(host, 0) + 1
        return True

    def give(self, host: str) -> None:
        self.open -= 1
        if self.by_host[host] == 1:
            del self.by_host[host]
        else:
            self.by_host[host] -= 1


@dataclasses.dataclass
class _Port:
    api: AdminApi
    settings: AdminSettings
    log: Any
    upgrades: Upgrades | None
    threads: trio.CapacityLimiter | None
    slots: AdminSlots


async def serve_admin(
    api: AdminApi,
    settings: AdminSettings,
    host: str,
    port: int,
    log: Any,
    *,
    ssl_context: ssl.SSLContext | None = None,
    upgrades: Upgrades | None = None,
    threads: trio.CapacityLimiter | None = None,
    slots: AdminSlots | None = None,
    passwords: Gatekeeper | None = None,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """``upgrades``: the WebSocket endpoints (STOMP, MQTT) this port also
    serves; ``threads``: the worker threads streamed bodies are read in;
    ``slots``: the connection bound, shared by the plain and TLS ports;
    ``passwords``: a gate whose password checks this port runs itself, in
    one worker thread (where no broker runs the broker's: an HA backup)."""
    listeners = await open_listeners("admin" if ssl_context is None else "admin-tls", host, port)
    bound = listeners[0].socket.getsockname()[1]
    if ssl_context is not None:
        # The handshake happens on the first read, inside the request's time
        # bound; a failed one is a broken stream like any other.
        listeners = [trio.SSLListener(listener, ssl_context) for listener in listeners]
    log.info("listener_started", protocol="admin", host=host, port=bound, tls=ssl_context is not None)
    task_status.started(bound)
    served = _Port(api, settings, log, upgrades, threads,
                   slots or AdminSlots(api.server, settings.max_connections, settings.max_connections_per_address))
    async with trio.open_nursery() as nursery:
        if passwords is not None:
            # A backup's port, with no broker to check them: its own, one at a time.
            nursery.start_soon(tasks.verify_passwords, tasks.password_checks(passwords, ADMIN, PASSWORD_BACKLOG), threads)
        # (trio's accept loop waits and retries on EMFILE rather than spinning or
        # ending; the slots keep this port from being the one that causes it.)
        await trio.serve_listeners(lambda stream: _guarded(served, stream), listeners)


async def _guarded(port: _Port, stream: trio.abc.Stream) -> None:
    peer = peer_address(stream)
    host = peer_host(peer)
    if not port.slots.take(host):
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(stream)
        return
    held = [True]

    def release() -> None:
        if held[0]:
            held[0] = False
            port.slots.give(host)

    try:
        await _connection(port, stream, peer, release)
    except Exception:  # a bug costs this connection, not the admin server or the broker
        port.log.exception("admin_connection_failed", peer=peer)
    finally:
        release()


async def _connection(port: _Port, stream: trio.abc.Stream, peer: str, release: Any = lambda: None) -> None:
    api, settings, log, upgrades = port.api, port.settings, port.log, port.upgrades
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    try:
        while True:
            # A client gets idle_timeout_s to begin each request (the first,
            # or the next on a kept-alive connection) and request_timeout_s
            # for the whole of it: a silent client gives its slot back soon,
            # a slow one cannot hold a task forever.
            progress: list[int] = []
            began = trio.current_time()
            idle_s = min(settings.idle_timeout_s, settings.request_timeout_s)
            with trio.CancelScope(deadline=began + idle_s) as timer:

                def begun(scope: trio.CancelScope = timer, began: float = began) -> None:
                    scope.deadline = began + settings.request_timeout_s

                request = await _read_request(conn, stream, settings, progress, begun)
            if timer.cancelled_caught:
                if progress:  # a request begun and not finished; an idle keep-alive just ends
                    await _send(conn, stream, error(408, "request not completed in time"), close=True)
                return
            if request is None:
                return
            if isinstance(request, Response):  # refused before routing
                await _send(conn, stream, request, close=True)
                return
            endpoint = upgrades.route(request) if upgrades is not None else None
            if endpoint is not None:  # /stomp, /mqtt: the connection becomes a WebSocket, or is refused
                release()  # from here the server's limits count it
                refused = await upgrades.serve(endpoint, request, conn.trailing_data[0], stream, peer)
                if refused is not None:
                    await _send(conn, stream, refused, close=True)
                return
            request.host = peer_host(peer)
            response = await _answer(api, request, log)
            # A probe's 503 is an answer (a backup, a broker draining), asked every
            # few seconds by Kubernetes: not a failure worth a line.
            if response.status >= 500 and request.target.split("?")[0] not in PROBES:
                log.warning("admin_request_failed", method=request.method, target=request.target[:200],
                            status=response.status)
            if response.stream is not None:
                await _send_stream(conn, stream, response, log, port.threads)
            else:
                await _send(conn, stream, response, close=False)
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()
    except (trio.BrokenResourceError, trio.ClosedResourceError, _StreamAborted):
        return
    except h11.RemoteProtocolError as exc:
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            try:
                await _send(conn, stream, error(exc.error_status_hint, f"bad request: {exc}"), close=True)
            except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
                pass
    finally:
        await close_stream(stream)


async def _answer(api: AdminApi, request: Request, log: Any) -> Response:
    """``api.handle(request)``; a password to check first is checked by the
    broker's gate off the event loop (the admin door's own bounded budget,
    apart from the clients' logins), and then handle() is asked again and
    finds the answer."""
    for _ in range(3):  # a check evicted from the cache before the retry is asked for anew, not forever
        try:
            return api.handle(request)
        except VerificationPending as pending:
            done = trio.Event()
            if not pending.start(done.set):
                return error(503, "too many password checks in progress; try again", **{"Retry-After": "1"})
            await done.wait()
        except Exception:  # a bug answers 500 to this request; the broker goes on
            log.exception("admin_request_crashed", method=request.method, target=request.target[:200])
            return error(500, "internal error")
    return error(503, "too many password checks in progress; try again", **{"Retry-After": "1"})


async def _read_request(
    conn: h11.Connection, stream: trio.abc.Stream, settings: AdminSettings, progress: list[int],
    begun: Any = lambda: None,
) -> Request | Response | None:
    """The next request; ``begun()`` is called at its first bytes."""
    head: h11.Request | None = None
    body = bytearray()
    if conn.trailing_data[0]:  # pipelined behind the last one: begun already
        begun()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(RECEIVE_BYTES)
            if data:
                if not progress:
                    begun()
                progress.append(len(data))
            conn.receive_data(data)
            continue
        if isinstance(event, h11.ConnectionClosed):
            return None
        if isinstance(event, h11.Request):
            head = event
            # h11 bounds a head that arrives in pieces; one read can bring a
            # whole oversized head, so measure it here too.
            if sum(len(name) + len(value) + 4 for name, value in event.headers) > MAX_HEAD_BYTES:
                return error(431, f"request headers over {MAX_HEAD_BYTES} bytes")
            declared = dict(event.headers).get(b"content-length")
            if declared is not None and declared.isdigit() and int(declared) > settings.max_request_bytes:
                return error(413, f"request body over {settings.max_request_bytes} bytes")
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > settings.max_request_bytes:
                return error(413, f"request body over {settings.max_request_bytes} bytes")
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in head.headers}
            return Request(head.method.decode("ascii", "replace"), head.target.decode("ascii", "replace"), headers, bytes(body))


async def _send_stream(
    conn: h11.Connection, stream: trio.abc.Stream, response: Response, log: Any, threads: trio.CapacityLimiter | None
) -> None:
    """A body produced piece by piece in a worker thread (the blocking
    reads stay off the event loop), sent with chunked transfer encoding."""
    body = response.stream
    try:
        await stream.send_all(conn.send(h11.Response(status_code=response.status, headers=_headers(response, None))))
        while True:
            try:
                chunk = await trio.to_thread.run_sync(body.next_chunk, limiter=threads)
            except Exception as exc:  # an I/O or decoding error: this response alone fails
                log.warning("admin_stream_failed", reason=str(exc)[:200], error=type(exc).__name__)
                raise _StreamAborted from exc
            if chunk is None:
                break
            if chunk:
                await stream.send_all(conn.send(h11.Data(data=chunk)))
        await stream.send_all(conn.send(h11.EndOfMessage()))
    finally:
        body.close()


def _headers(response: Response, length: int | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", response.content_type.encode())]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    headers += [
        (b"server", SERVER_HEADER),
        (b"cache-control", b"no-store"),
    ]
    headers += [(name.lower().encode(), value.encode()) for name, value in SECURITY_HEADERS]
    headers += [(name.encode(), value.encode()) for name, value in response.headers]
    return headers


async def _send(conn: h11.Connection, stream: trio.abc.Stream, response: Response, *, close: bool) -> None:
    headers = _headers(response, len(response.body))
    if close:
        headers.append((b"connection", b"close"))
    data = conn.send(h11.Response(status_code=response.status, headers=headers))
    data += conn.send(h11.Data(data=response.body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    await stream.send_all(data)


# -- the probe port ----------------------------------------------------------
#
# The probe port (``[admin] probe_port``): ``/healthz``, ``/livez`` and
# ``/readyz``, without auth, on a listener of its own, so Kubernetes' probes
# are answered whatever the admin port carries.
#
# Why a listener of its own rather than slots held back on the admin port for
# probes: a probe can only be told from any other request once its request
# line has been read, and the sockets that starve a port are the ones that
# never send one.  Slots held back for probes would be taken by the same idle
# sockets as the rest (they too are "a connection that has not said what it
# wants yet"), so reserving capacity there only moves the problem.  A port that
# serves nothing but three answers can instead be generous in a way the admin
# port cannot: no connection here is ever long-lived (no console, no WebSocket,
# no streamed body), so when all its slots are taken a new connection takes the
# place of the oldest one from the address that holds the most, rather than
# being turned away.  A kubelet connects and sends its request at once; an idle
# flood only pushes out its own sockets.  Each connection gets one request and
# a short, fixed time to send it.
#
# Nothing here says anything a probe does not (no data, no users), so there is
# nothing to authenticate; the README says so.

# Connections open at once on the probe port; past it, the oldest of the
# address holding the most is closed (see above).
PROBE_CONNECTIONS = 64
# A probe's whole request and answer; a kubelet's takes milliseconds.
PROBE_TIMEOUT_S = 2.0
PROBE_HEAD_BYTES = 4096


class Probed(Protocol):
    """What answers the probes: the broker's API or a backup's."""

    def probe(self, path: str) -> Response | None: ...


class ProbeSlots:
    """The probe port's connections, by address, oldest first; each is the
    cancel scope its task runs under, so making room closes it."""

    def __init__(self, limit: int = PROBE_CONNECTIONS) -> None:
        self.limit = limit
        self.open = 0
        self.evicted = 0
        self.by_host: dict[str, deque[trio.CancelScope]] = {}

    def take(self, host: str, scope: trio.CancelScope) -> None:
        if self.open >= self.limit:
            crowded_host = max(self.by_host, key=lambda h: len(self.by_host[h]))
            crowded = self.by_host[crowded_host]
            crowded.popleft().cancel()  # its task gives nothing back: it is no longer counted
            if not crowded:
                del self.by_host[crowded_host]
            self.open -= 1
            self.evicted += 1
        self.by_host.setdefault(host, deque()).append(scope)
        self.open += 1

    def give(self, host: str, scope: trio.CancelScope) -> None:
        held = self.by_host.get(host)
        if held is None or scope not in held:
            return  # evicted already
        held.remove(scope)
        self.open -= 1
        if not held:
            del self.by_host[host]


async def serve_probes(api: Probed, host: str, port: int, log: Any, *, slots: ProbeSlots | None = None,
                       task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    listeners = await open_listeners("probe", host, port)
    bound = listeners[0].socket.getsockname()[1]
    log.info("listener_started", protocol="probe", host=host, port=bound, tls=False, paths=",".join(PROBES))
    task_status.started(bound)
    held = slots or ProbeSlots()
    await trio.serve_listeners(lambda stream: _probe(api, held, stream), listeners)


async def _probe(api: Probed, slots: ProbeSlots, stream: trio.abc.Stream) -> None:
    host = peer_host(peer_address(stream))
    with trio.CancelScope(deadline=trio.current_time() + PROBE_TIMEOUT_S) as scope:
        slots.take(host, scope)
        try:
            await _answer_probe(api, stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            pass
        finally:
            slots.give(host, scope)
    await close_stream(stream)


async def _answer_probe(api: Probed, stream: trio.abc.Stream) -> None:
    """One request read (its head only: a probe has no body) and answered."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=PROBE_HEAD_BYTES)
    request = await _probe_request(conn, stream)
    if request is None:
        return
    path = request.target.decode("ascii", "replace").split("?", 1)[0]
    response = api.probe(path) if request.method in (b"GET", b"HEAD") else None
    if response is None:
        response = error(404, f"the probe port serves only {', '.join(PROBES)} (GET)")
    headers = [(b"content-type", response.content_type.encode()), (b"content-length", str(len(response.body)).encode()),
               (b"connection", b"close"), (b"cache-control", b"no-store")]
    data = conn.send(h11.Response(status_code=response.status, headers=headers)) or b""
    if request.method != b"HEAD":
        data += conn.send(h11.Data(data=response.body)) or b""
    await stream.send_all(data)


async def _probe_request(conn: h11.Connection, stream: trio.abc.Stream) -> h11.Request | None:
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(PROBE_HEAD_BYTES)
            if not data:
                return None
            conn.receive_data(data)
            continue
        return event if isinstance(event, h11.Request) else None
