"""STOMP and MQTT over WebSocket on the admin port (``/stomp``, ``/mqtt``).

The admin server parses the HTTP request with h11; a GET that asks to be
upgraded on one of our paths comes here.  The handshake is wsproto's
(``H11Handshake.initiate_upgrade_connection``, made for servers that already
parsed the request), the subprotocol is chosen from what the client offered,
and then the connection is handed to :meth:`Server.serve_stream` through
:class:`WebSocketStream`, a ``trio.abc.Stream`` whose bytes are the payloads of
WebSocket messages.  So a WebSocket client runs exactly the sessions, limits,
auth and back-pressure a TCP client does; the protocol sessions already accept
arbitrary byte splits, so a frame spanning messages or several frames in one
message need nothing here.

This module owns no socket: it is given a stream (plain or TLS) by the admin
server and only reads and writes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import h11
import trio
import wsproto
from wsproto import events as ws
from wsproto.connection import ConnectionState
from wsproto.frame_protocol import CloseReason
from wsproto.handshake import H11Handshake
from wsproto.utilities import RemoteProtocolError

from gateway.admin.http import Request, Response, error
from gateway.transports.server import SessionFactory

# Bytes asked of the transport per read.  Without extensions (we accept
# none, so no permessage-deflate) a payload is never larger than the frame
# bytes that carried it, so this also bounds what one read can leave pending.
RECEIVE_BYTES = 64 * 1024
# A peer that neither answers our close frame nor closes its side gets this
# long before the transport is closed under it (as long as a TLS close_notify
# gets in server.close_stream).
CLOSE_TIMEOUT_S = 1.0
# A message may carry one maximal frame plus a few small ones (a client
# batching a SEND with its heart-beat, say); more is refused with 1009.
MESSAGE_SLACK_BYTES = 64 * 1024

# STOMP over WebSocket: the version-named subprotocols stomp.js and ActiveMQ
# use, highest first, then the bare "stomp" some clients offer.  The session
# negotiates the version again on CONNECT (accept-version), so any of these
# runs the same session.
STOMP_SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp", "stomp")
# MQTT over WebSocket: "mqtt" [MQTT-6.0.0-3]; "mqttv3.1" is what 3.1 clients
# (MQTT.js and paho with protocol level 3) offer, a level the codec speaks.
MQTT_SUBPROTOCOLS = ("mqtt", "mqttv3.1")


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One WebSocket path: the connection name for logs and metrics, the
    session factory, the subprotocols we accept (in our order of preference)
    and whether payloads may be text."""

    name: str
    factory: SessionFactory
    subprotocols: tuple[str, ...]
    max_message_bytes: int
    # [MQTT-6.0.0-1] MQTT travels in binary messages only; STOMP clients
    # (stomp.js) send text and binary.
    text: bool


def choose_subprotocol(endpoint: Endpoint, offered: Sequence[str]) -> str | None | Response:
    """Our most preferred subprotocol among ``offered``; ``None`` when the
    client offered none (plain WebSocket clients; RFC 6455 §4.2.2 says to
    answer without one), or a 400 when it offered only ones we do not speak.
    Accepting without a subprotocol would make a browser fail the connection
    with no reason; a 400 with the reason at least tells a human."""
    if not offered:
        return None
    # Exact tokens: the accept must echo one the client sent (RFC 6455 §4.1),
    # which wsproto checks, and which a browser checks again.
    for candidate in endpoint.subprotocols:
        if candidate in offered:
            return candidate
    return error(400, f"{endpoint.name}: none of the offered subprotocols {', '.join(offered)} is spoken here; "
                      f"offer one of {', '.join(endpoint.subprotocols)}")


class Upgrades:
    """The WebSocket endpoints the admin server upgrades to, and the server
    whose connection machinery runs them."""

    def __init__(self, server: Any, endpoints: dict[str, Endpoint], origins: Sequence[str] = ()) -> None:
        self.server = server
        self.endpoints = endpoints
        self.origins = frozenset(origin.rstrip("/").lower() for origin in origins)

    @classmethod
    def for_broker(cls, server: Any, config: Any, stomp: SessionFactory, mqtt: SessionFactory) -> Upgrades:
        return cls(server, {
            "/stomp": Endpoint("stomp-ws", stomp, STOMP_SUBPROTOCOLS,
                               config.stomp.max_frame_bytes + MESSAGE_SLACK_BYTES, text=True),
            "/mqtt": Endpoint("mqtt-ws", mqtt, MQTT_SUBPROTOCOLS,
                              config.mqtt.max_packet_bytes + MESSAGE_SLACK_BYTES, text=False),
        }, config.admin.websocket_origins)

    def route(self, request: Request) -> Endpoint | None:
        """The endpoint this request is for, if any (other paths are the API's)."""
        return self.endpoints.get(urlsplit(request.target).path)

    async def serve(
        self, endpoint: Endpoint, request: Request, trailing: bytes, stream: trio.abc.Stream, peer: str
    ) -> Response | None:
        """Upgrade and run the connection until it ends (``None``), or the
        refusal the admin server should send instead."""
        if self.server.stopping:
            return error(503, "broker is shutting down")
        if request.method != "GET":
            return error(405, f"{request.target}: a WebSocket upgrade is a GET")
        if "websocket" not in request.headers.get("upgrade", "").lower():
            return error(426, f"{urlsplit(request.target).path} speaks {endpoint.name} only: "
                              "send a WebSocket upgrade (Upgrade: websocket)", upgrade="websocket")
        origin = request.headers.get("origin")
        if self.origins and origin is not None and origin.rstrip("/").lower() not in self.origins:
            # A page from elsewhere must not ride on what the browser brings
            # along (a client certificate) to reach the broker.
            return error(403, f"origin {origin[:200]} may not open WebSockets here (admin.websocket_origins)")
        handshake = H11Handshake(wsproto.ConnectionType.SERVER)
        try:
            headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in request.headers.items()]
            handshake.initiate_upgrade_connection(headers, request.target)
            opening = next(iter(handshake.events()))
        except RemoteProtocolError as exc:
            hint = exc.event_hint
            status = hint.status_code if isinstance(hint, ws.RejectConnection) else 400
            return error(status, f"bad WebSocket handshake: {exc}")
        except (UnicodeError, h11.ProtocolError) as exc:
            # wsproto reads Host as IDNA ("xn--zz" fails) and re-parses the
            # request with h11: whatever a client can make fail there is its
            # bad request, never the admin server's (or the broker's) end.
            return error(400, f"bad WebSocket handshake: {exc}")
        assert isinstance(opening, ws.Request)
        chosen = choose_subprotocol(endpoint, opening.subprotocols)
        if isinstance(chosen, Response):
            return chosen
        await stream.send_all(handshake.send(ws.AcceptConnection(subprotocol=chosen)))
        connection = handshake.connection
        assert connection is not None
        adapted = WebSocketStream(stream, connection, endpoint, trailing)
        await self.server.serve_stream(endpoint.name, endpoint.factory, adapted, peer)
        return None


class WebSocketStream(trio.abc.HalfCloseableStream):
    """A byte stream over one open WebSocket connection.

    ``receive_some`` returns message payloads (text as UTF-8) in whatever
    pieces they arrive, answers pings and ends (``b""``) at the peer's close;
    ``send_all`` sends one message, text when STOMP and the bytes are UTF-8,
    else binary; ``send_eof`` sends our close frame, after which we keep
    reading until the peer answers with its own, as a TCP half-close would.
    The reader and writer tasks of a connection may both write (a pong, a
    close) so writes to the transport are serialised by a lock.
    """

    def __init__(self, transport: trio.abc.Stream, connection: wsproto.Connection, endpoint: Endpoint,
                 trailing: bytes = b"") -> None:
        self.transport_stream = transport
        self.endpoint = endpoint
        self._ws = connection
        self._send_lock = trio.StrictFIFOLock()
        self._pending = bytearray()  # payload received but not yet returned; at most one read's worth
        self._message_bytes = 0  # size of the message being received so far
        self._eof = False
        self._failure: str | None = None  # why we closed the connection on the peer
        if trailing:  # frames the client sent right behind its handshake
            self._ws.receive_data(trailing)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        while not self._pending:
            if self._failure is not None:
                raise trio.BrokenResourceError(self._failure)
            if self._eof:
                return b""
            await self._handle_events()
            if self._pending or self._eof or self._failure is not None:
                continue
            data = await self.transport_stream.receive_some(RECEIVE_BYTES)
            # b"" is the transport's EOF: wsproto reports it as close 1006.
            self._ws.receive_data(data if data else None)
        size = len(self._pending) if max_bytes is None else min(max_bytes, len(self._pending))
        chunk = bytes(self._pending[:size])
        del self._pending[:size]
        return chunk

    async def _handle_events(self) -> None:
        for event in self._ws.events():
            if isinstance(event, (ws.TextMessage, ws.BytesMessage)):
                if isinstance(event, ws.TextMessage) and not self.endpoint.text:
                    await self._fail(CloseReason.UNSUPPORTED_DATA, "text message on MQTT (binary only, [MQTT-6.0.0-1])")
                    return
                payload = event.data.encode() if isinstance(event, ws.TextMessage) else bytes(event.data)
                self._message_bytes += len(payload)
                if self._message_bytes > self.endpoint.max_message_bytes:
                    await self._fail(CloseReason.MESSAGE_TOO_BIG,
                                     f"WebSocket message over {self.endpoint.max_message_bytes} bytes")
                    return
                if event.message_finished:
                    self._message_bytes = 0
                self._pending += payload
            elif isinstance(event, ws.Ping):
                await self._send_event(event.response())
            elif isinstance(event, ws.CloseConnection):
                # The peer's close (or wsproto's verdict on a bad frame or a
                # lost transport): answer it if still owed, then it is EOF.
                if self._ws.state in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
                    await self._send_event(event.response())
                self._eof = True
                return
            # Pongs need nothing: we send no pings (the sessions' own
            # heart-beats and keep-alives watch the peer).

    async def _fail(self, code: int, reason: str) -> None:
        self._failure = reason
        if self._ws.state is ConnectionState.OPEN:
            await self._send_event(ws.CloseConnection(code=code, reason=reason))

    async def _send_event(self, event: ws.Event) -> None:
        async with self._send_lock:
            # Only a close may follow the peer's close, and nothing ours.
            allowed = (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING) if isinstance(
                event, ws.CloseConnection) else (ConnectionState.OPEN,)
            if self._ws.state not in allowed:
                return
            data = self._ws.send(event)
            try:
                await self.transport_stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._eof = True  # the peer is gone; the reader sees it next

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        payload = bytes(data)
        message: ws.Event
        if self.endpoint.text:
            try:
                message = ws.TextMessage(data=payload.decode())
            except UnicodeDecodeError:
                message = ws.BytesMessage(data=payload)
        else:
            message = ws.BytesMessage(data=payload)
        async with self._send_lock:
            if self._ws.state is not ConnectionState.OPEN:
                raise trio.ClosedResourceError("the WebSocket is closing")
            await self.transport_stream.send_all(self._ws.send(message))

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self._send_event(ws.CloseConnection(code=CloseReason.NORMAL_CLOSURE))

    async def aclose(self) -> None:
        # Our close frame if none was sent yet, then the peer's answer, all
        # bounded in time: a peer that neither reads nor answers cannot hold
        # the connection open.
        try:
            with trio.move_on_after(CLOSE_TIMEOUT_S):
                await self._send_event(ws.CloseConnection(code=CloseReason.NORMAL_CLOSURE))
                await self._wait_peer_close()
        finally:  # closed even when cancelled (aclose_forcefully)
            await self.transport_stream.aclose()

    async def _wait_peer_close(self) -> None:
        """Read (and drop) until the peer answers our close (RFC 6455 §7.1.1:
        the server closes TCP after the closing handshake).  Closing with its
        data unread would make the kernel reset the connection, which can
        destroy our close frame (its 1009, say) before the peer reads it."""
        while self._ws.state is ConnectionState.LOCAL_CLOSING:
            try:
                data = await self.transport_stream.receive_some(RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            self._ws.receive_data(data if data else None)
            for _ in self._ws.events():
                pass  # only the state matters now: the peer's close makes it CLOSED
