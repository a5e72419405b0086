"""Helpers for the end-to-end tests: polling with a deadline, a raw STOMP
socket client for misbehaving peers, and a recording stomp.py client.

Nothing here sleeps to make an assertion true: every wait polls a condition
until a deadline and fails loudly when the deadline passes.
"""

from __future__ import annotations

import base64
import itertools
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import stomp

from gateway.stomp import codec, frames

T = TypeVar("T")

TIMEOUT = 5.0
_ids = itertools.count(1)


def unique(prefix: str = "x") -> str:
    return f"{prefix}{next(_ids)}"


def http_request(url: str, auth: tuple[str, str] | None = None, method: str = "GET", timeout: float = 5.0) -> tuple[int, str]:
    """``(status, body text)`` of one HTTP request, with Basic auth when
    ``auth`` is given; an error status is returned, not raised."""
    request = urllib.request.Request(url, method=method)
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def wait_for(predicate: Callable[[], T], timeout: float = TIMEOUT, interval: float = 0.002, what: str = "") -> T:
    """Poll ``predicate`` until it returns something truthy; return that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(interval)


# -- a raw socket client ---------------------------------------------------


def encode_frame(command: str, headers: Iterable[tuple[str, str]] | dict[str, str] = (), body: bytes = b"", *, eol: str = "\n") -> bytes:
    """A frame exactly as given: no escaping, no content-length added."""
    items = headers.items() if isinstance(headers, dict) else headers
    head = eol.join([command, *(f"{k}:{v}" for k, v in items)]) + eol + eol
    return head.encode() + body + b"\x00"


class Closed(AssertionError):
    """The server closed the connection while a frame was expected."""


class RawClient:
    """A STOMP client on a plain socket that reads whole server frames.

    Frames are parsed with the project's own sans-IO codec in the client role.
    End-of-line bytes that arrive between frames are heart-beats; the time of
    each is kept in :attr:`heartbeats`.
    """

    def __init__(self, address: tuple[str, int] | None, timeout: float = TIMEOUT, *, rcvbuf: int | None = None,
                 sock: Any = None) -> None:
        if sock is not None:  # already connected, e.g. a WebSocket (tests/support/ws_helpers.py)
            self.sock = sock
        else:
            assert address is not None
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            if rcvbuf is not None:  # a small window makes a slow reader's backlog stay in the broker
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            self.sock.settimeout(timeout)
            self.sock.connect(address)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.codec = codec.StompConnection(codec.Role.CLIENT, max_frame_bytes=256 * 1024 * 1024)
        self.frames: deque[frames.Frame] = deque()
        self.heartbeats: list[float] = []
        self.received = bytearray()  # every byte the server sent, as sent
        self.eof = False
        self.reset = False

    # sending

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, command: str, headers: Iterable[tuple[str, str]] | dict[str, str] = (), body: bytes = b"", *, eol: str = "\n") -> None:
        self.send(encode_frame(command, headers, body, eol=eol))

    def connect(self, version: str | None = "1.2", heart_beat: str | None = None, command: str = "CONNECT", **extra: str) -> frames.Frame:
        """CONNECT and return the CONNECTED frame (fails on anything else)."""
        headers = {}
        if version is not None:
            headers["accept-version"] = version
        headers["host"] = "localhost"
        if heart_beat is not None:
            headers["heart-beat"] = heart_beat
        headers.update(extra)
        self.send_frame(command, headers)
        frame = self.next_frame()
        assert type(frame) is frames.Connected, f"expected CONNECTED, got {frame!r}"
        self.codec.set_version(frame.headers.get("version", "1.0"))
        return frame

    def abort(self) -> None:
        """Drop the connection with a TCP reset, as a killed process would."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self) -> None:
        self.sock.close()

    # receiving

    def pump(self, timeout: float) -> bool:
        """Read once; False if nothing arrived in ``timeout``."""
        if self.eof:
            return False
        self.sock.settimeout(max(timeout, 0.0001))
        try:
            data = self.sock.recv(256 * 1024)
        except TimeoutError:
            return False
        except ConnectionResetError:
            self.reset = True
            data = b""
        if not data:
            self.eof = True
            return True
        now = time.monotonic()
        self.received += data
        if not self.codec.mid_frame:
            stripped = data.lstrip(b"\r\n")
            self.heartbeats.extend([now] * data[: len(data) - len(stripped)].count(b"\n"))
            data = stripped
        if data:
            self.codec.receive_data(data)
            self.frames.extend(self.codec.events())
        return True

    def next_frame(self, timeout: float = TIMEOUT) -> frames.Frame:
        deadline = time.monotonic() + timeout
        while not self.frames:
            if self.eof:
                raise Closed("connection closed by the server while a frame was expected")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no frame within {timeout} s")
            self.pump(left)
        return self.frames.popleft()

    def expect(self, command: str, timeout: float = TIMEOUT) -> frames.Frame:
        frame = self.next_frame(timeout)
        assert frame.command == command, f"expected {command}, got {frame!r}"
        return frame

    def wait_closed(self, timeout: float = TIMEOUT) -> list[frames.Frame]:
        """Read until the server closes; return every frame that came before."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"server did not close the connection within {timeout} s")
            self.pump(left)
        got = list(self.frames)
        self.frames.clear()
        return got

    def quiet_for(self, seconds: float) -> list[frames.Frame]:
        """Everything that arrives in ``seconds`` (used to count heart-beats)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0 and not self.eof:
            self.pump(left)
        got = list(self.frames)
        self.frames.clear()
        return got

    def receipt(self, receipt_id: str, timeout: float = TIMEOUT) -> frames.Frame:
        frame = self.expect("RECEIPT", timeout)
        assert frame.headers["receipt-id"] == receipt_id
        return frame

    def expect_error_and_close(self, timeout: float = TIMEOUT) -> frames.Frame:
        """The next frame is an ERROR with a message header, and then the server closes."""
        frame = self.next_frame(timeout)
        assert type(frame) is frames.Error, f"expected ERROR, got {frame!r}"
        assert frame.headers.get("message"), f"ERROR without a message header: {frame!r}"
        rest = self.wait_closed(timeout)
        assert rest == [], f"frames after ERROR: {rest!r}"
        return frame


# -- a recording stomp.py client ------------------------------------------


class Recorder(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.connected: Any = None
        self.messages: list[Any] = []
        self.errors: list[Any] = []
        self.receipts: list[str] = []
        self.order: list[str] = []  # "MESSAGE" and "RECEIPT <id>", as they arrived
        self.disconnected = threading.Event()

    def on_connected(self, frame: Any) -> None:
        self.connected = frame

    def on_message(self, frame: Any) -> None:
        self.messages.append(frame)
        self.order.append("MESSAGE")

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame)

    def on_receipt(self, frame: Any) -> None:
        self.receipts.append(frame.headers["receipt-id"])
        self.order.append("RECEIPT " + frame.headers["receipt-id"])

    def on_disconnected(self) -> None:
        self.disconnected.set()


_CONNECTIONS = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}


class Client:
    """A stomp.py connection (bodies as bytes) with everything it receives recorded."""

    def __init__(self, address: tuple[str, int], version: str = "1.2", **kwargs: Any) -> None:
        kwargs.setdefault("auto_decode", False)
        kwargs.setdefault("reconnect_attempts_max", 1)
        self.version = version
        self.conn = _CONNECTIONS[version]([address], **kwargs)
        self.rec = Recorder()
        self.conn.set_listener("recorder", self.rec)

    def connect(self, **headers: str) -> Client:
        self.conn.connect(wait=True, headers=headers)
        return self

    @property
    def messages(self) -> list[Any]:
        return self.rec.messages

    @property
    def bodies(self) -> list[bytes]:
        return [m.body for m in self.rec.messages]

    def wait_messages(self, n: int, timeout: float = TIMEOUT) -> list[Any]:
        """Wait until at least ``n`` messages have arrived; return all of them."""
        wait_for(lambda: len(self.rec.messages) >= n, timeout, what=f"{n} messages (have {len(self.rec.messages)})")
        return list(self.rec.messages)

    def wait_receipt(self, receipt_id: str, timeout: float = TIMEOUT) -> None:
        wait_for(lambda: receipt_id in self.rec.receipts, timeout, what=f"receipt {receipt_id}")

    def wait_error(self, timeout: float = TIMEOUT) -> Any:
        wait_for(lambda: self.rec.errors, timeout, what="an ERROR frame")
        return self.rec.errors[0]

    def send(self, destination: str, body: bytes | str, *, receipt: bool = True, content_type: str | None = None, **headers: Any) -> None:
        """SEND; with ``receipt`` (the default) wait until the broker confirms it."""
        if receipt:
            rid = unique("send-")
            headers["receipt"] = rid
        self.conn.send(destination, body, content_type=content_type, headers=headers)
        if receipt:
            self.wait_receipt(rid)

    def subscribe(self, destination: str, sub_id: str | None = None, ack: str = "auto", **headers: Any) -> str:
        """SUBSCRIBE and wait for its receipt, so later sends find it."""
        sub_id = sub_id or unique("sub-")
        rid = unique("subscribe-")
        headers["receipt"] = rid
        self.conn.subscribe(destination, sub_id, ack=ack, headers=headers)
        self.wait_receipt(rid)
        return sub_id

    def unsubscribe(self, sub_id: str) -> None:
        rid = unique("unsubscribe-")
        if self.version == "1.0":
            self.conn.unsubscribe(id=sub_id, headers={"receipt": rid})
        else:
            self.conn.unsubscribe(sub_id, headers={"receipt": rid})
        self.wait_receipt(rid)

    def barrier(self) -> None:
        """Round trip through the broker: when this returns, every delivery the
        broker made to this connection before the call has been received."""
        rid = unique("barrier-")
        self.conn.send(f"/topic/barrier.{rid}", b"", headers={"receipt": rid})
        self.wait_receipt(rid)

    def close(self) -> None:
        """DISCONNECT (if still connected) and wait for stomp.py's threads to end."""
        transport = self.conn.transport
        if self.conn.is_connected():
            self.conn.disconnect()  # sends DISCONNECT with a receipt; the reply closes the socket
            self.rec.disconnected.wait(TIMEOUT)
        if transport.running:
            transport.disconnect_socket()
        thread = getattr(transport, "io_thread", None)
        if thread is not None:
            thread.join(TIMEOUT)


def splits(wire: bytes) -> Iterator[list[bytes]]:
    """All at once, byte by byte, and split in two at every index (h11 ``tr()``)."""
    yield [wire]
    yield [wire[i : i + 1] for i in range(len(wire))]
    for i in range(1, len(wire)):
        yield [wire[:i], wire[i:]]
