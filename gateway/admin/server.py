"""The admin HTTP server: h11 over Trio, one task per connection, every
request bounded in size and time.  What a request means is api.py's job."""

from __future__ import annotations

import dataclasses
import ssl
from typing import Any

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
PROBES = ("/healthz", "/readyz")  # what Kubernetes asks; answered quietly


class _StreamAborted(Exception):
    """A streamed body failed part-way: the connection is cut, so the client
    sees an incomplete body rather than a short one that looks whole."""


class AdminSlots:
    """Connections open on the admin ports (plain and TLS together), bounded
    by ``[admin] max_connections`` in all and by the server's
    ``max_connections_per_address`` from one address.  Past either, a new
    connection is closed at accept: idle sockets on this port cannot take the
    file descriptors the messaging listeners need.  A connection that becomes
    a WebSocket gives its slot back, as the server's own limits count it
    from then on (and refuse its CONNECT the protocol's way)."""

    def __init__(self, server: Any, limit: int) -> None:
        self.server = server
        self.limit = limit
        self.open = 0
        self.refused = 0
        self.by_host: dict[str, int] = {}

    def take(self, host: str) -> bool:
        per_address = self.server.limits.max_connections_per_address
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
    served = _Port(api, settings, log, upgrades, threads, slots or AdminSlots(api.server, settings.max_connections))
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
            # A client gets request_timeout_s for each whole request, idle
            # keep-alive time included: a slow or silent client cannot hold
            # a task forever.
            progress: list[int] = []
            with trio.move_on_after(settings.request_timeout_s) as timer:
                request = await _read_request(conn, stream, settings, progress)
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
    conn: h11.Connection, stream: trio.abc.Stream, settings: AdminSettings, progress: list[int]
) -> Request | Response | None:
    head: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(RECEIVE_BYTES)
            if data:
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
