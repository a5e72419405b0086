"""A blocking WebSocket client on wsproto for the WebSocket tests.

:class:`WebSocketSocket` has the few socket methods the raw STOMP and MQTT
test clients use (``sendall``, ``recv``, ``settimeout``, ``close``), so
``RawClient(sock=...)`` and ``RawMqtt(sock=...)`` speak through a WebSocket
unchanged: ``sendall`` sends one message, ``recv`` returns message payloads
and ``b""`` once the server closed.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
from collections.abc import Sequence
from typing import Any

import wsproto
from wsproto import events as ws

from tests.support.helpers import TIMEOUT


class Refused(AssertionError):
    """The server answered the upgrade with an HTTP error."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"upgrade refused: {status} {body!r}")
        self.status = status
        self.body = body

    @property
    def reason(self) -> str:
        return str(json.loads(self.body)["reason"])


class WebSocketSocket:
    def __init__(self, port: int, path: str, subprotocols: Sequence[str] = (), *, text: bool = False,
                 timeout: float = TIMEOUT, tls: ssl.SSLContext | None = None) -> None:
        plain = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        plain.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # wss://: the same WebSocket inside TLS
        self.sock = tls.wrap_socket(plain, server_hostname="127.0.0.1") if tls is not None else plain
        self.text = text  # send payloads as text messages
        self.ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        self.pending = bytearray()
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.pongs: list[bytes] = []
        self.kinds: list[str] = []  # "text" / "bytes" per message received, in order
        try:
            self._handshake(port, path, subprotocols)
        except BaseException:
            self.sock.close()
            raise

    def _handshake(self, port: int, path: str, subprotocols: Sequence[str]) -> None:
        self.sock.sendall(self.ws.send(ws.Request(host=f"127.0.0.1:{port}", target=path,
                                                  subprotocols=list(subprotocols))))
        rejection: ws.RejectConnection | None = None
        body = bytearray()
        while True:
            data = self.sock.recv(65536)
            self.ws.receive_data(data or None)
            for event in self.ws.events():
                if isinstance(event, ws.AcceptConnection):
                    self.subprotocol = event.subprotocol
                    return
                if isinstance(event, ws.RejectConnection):
                    rejection = event
                    if not event.has_body:
                        raise Refused(event.status_code, b"")
                elif isinstance(event, ws.RejectData):
                    body += event.data
                    if event.body_finished:
                        assert rejection is not None
                        raise Refused(rejection.status_code, bytes(body))
            if not data:
                raise AssertionError("the server closed during the handshake")

    @property
    def local_address(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"{host}:{port}"

    # the socket methods the raw clients use

    def settimeout(self, timeout: float) -> None:
        self.sock.settimeout(timeout)

    def sendall(self, data: bytes) -> None:
        self.send_message(data)

    def send_message(self, data: bytes | str, *, finished: bool = True) -> None:
        if isinstance(data, str) or self.text:
            payload: Any = data if isinstance(data, str) else data.decode()
            event: ws.Event = ws.TextMessage(data=payload, message_finished=finished)
        else:
            event = ws.BytesMessage(data=data, message_finished=finished)
        self.sock.sendall(self.ws.send(event))

    def ping(self, payload: bytes) -> None:
        self.sock.sendall(self.ws.send(ws.Ping(payload=payload)))

    def recv(self, _size: int = 65536) -> bytes:
        """The next payload bytes; ``b""`` once the server closed."""
        while not self.pending:
            if self.close_code is not None:
                return b""
            data = self.sock.recv(65536)  # a timeout propagates, as from a socket
            self.ws.receive_data(data or None)
            for event in self.ws.events():
                if isinstance(event, (ws.TextMessage, ws.BytesMessage)):
                    if event.message_finished:
                        self.kinds.append("text" if isinstance(event, ws.TextMessage) else "bytes")
                    self.pending += event.data.encode() if isinstance(event, ws.TextMessage) else event.data
                elif isinstance(event, ws.Ping):
                    self.sock.sendall(self.ws.send(event.response()))
                elif isinstance(event, ws.Pong):
                    self.pongs.append(bytes(event.payload))
                elif isinstance(event, ws.CloseConnection):
                    self.close_code, self.close_reason = event.code, event.reason
                    if self.ws.state is wsproto.connection.ConnectionState.REMOTE_CLOSING:
                        self.sock.sendall(self.ws.send(event.response()))
        data = bytes(self.pending)
        self.pending.clear()
        return data

    def wait_closed(self, timeout: float = TIMEOUT) -> int:
        """Read (and drop) until the server's close frame; its code."""
        self.sock.settimeout(timeout)
        while self.recv():
            pass
        assert self.close_code is not None
        return self.close_code

    def close(self) -> None:
        if self.ws.state is wsproto.connection.ConnectionState.OPEN:
            try:
                self.sock.sendall(self.ws.send(ws.CloseConnection(code=1000)))
            except OSError:
                pass
        self.sock.close()

    def abort(self) -> None:
        """Drop the TCP connection with a reset: no close frame, as a crashed client."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()
