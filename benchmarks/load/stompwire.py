"""Just enough STOMP on raw sockets for the load generator (stdlib only).

The hot paths never parse frames: producers send pre-encoded bytes, and
consumers count NUL terminators and pull the sequence number (and send time)
out of the 128-byte bodies with one regular expression per received chunk.
Only the few control frames (CONNECTED, RECEIPT, ERROR) go through
:func:`parse_frames`.
"""

from __future__ import annotations

import re
import select
import socket
import time

HOST = "127.0.0.1"
BODY_SIZE = 128

# Bodies: "SEQ<10 digits>:" [+ "T<20 digits>:" for latency] padded to 128 bytes.
# No NUL and no "SEQ" anywhere else in a MESSAGE frame the broker sends us,
# so one NUL = one frame and one match = one of our messages.
SEQ_RE = re.compile(rb"SEQ(\d{10}):")
SEQ_TIME_RE = re.compile(rb"SEQ(\d{10}):T(\d{20}):")

CONNECT = b"CONNECT\naccept-version:1.2\nhost:localhost\nheart-beat:0,0\n\n\x00"


class StompError(Exception):
    pass


def send_frame(destination: str) -> bytes:
    """The head of a SEND frame; append a 128-byte body and a NUL."""
    return f"SEND\ndestination:{destination}\ncontent-length:{BODY_SIZE}\n\n".encode()


def body(seq: int) -> bytes:
    head = b"SEQ%010d:" % seq
    return head + b"x" * (BODY_SIZE - len(head))


def timed_body(seq: int, t_ns: int) -> bytes:
    head = b"SEQ%010d:T%020d:" % (seq, t_ns)
    return head + b"x" * (BODY_SIZE - len(head))


def subscribe_frame(destination: str, sub_id: str, receipt: str) -> bytes:
    return f"SUBSCRIBE\nid:{sub_id}\ndestination:{destination}\nack:auto\nreceipt:{receipt}\n\n\x00".encode()


def disconnect_frame(receipt: str | None = None) -> bytes:
    if receipt is None:
        return b"DISCONNECT\n\n\x00"
    return f"DISCONNECT\nreceipt:{receipt}\n\n\x00".encode()


def parse_frames(buf: bytes) -> tuple[list[tuple[str, dict[str, str], bytes]], bytes]:
    """Complete frames in ``buf`` (LF or CRLF line ends) and the unparsed rest."""
    out = []
    pos = 0
    n = len(buf)
    while True:
        while pos < n and buf[pos] in (10, 13):  # heart-beats / EOLs between frames
            pos += 1
        if pos >= n:
            return out, b""
        end = buf.find(b"\n\n", pos)
        crlf = buf.find(b"\r\n\r\n", pos)
        if crlf >= 0 and (end < 0 or crlf < end):
            head_end, body_start = crlf, crlf + 4
        elif end >= 0:
            head_end, body_start = end, end + 2
        else:
            return out, buf[pos:]
        lines = buf[pos:head_end].decode("utf-8", "replace").replace("\r\n", "\n").split("\n")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            key, _, value = line.partition(":")
            headers.setdefault(key, value)
        length = headers.get("content-length")
        if length is not None and length.isdigit():
            body_end = body_start + int(length)
            if body_end >= n:
                return out, buf[pos:]
        else:
            body_end = buf.find(b"\x00", body_start)
            if body_end < 0:
                return out, buf[pos:]
        out.append((lines[0], headers, buf[body_start:body_end]))
        pos = body_end + 1


def describe(frame: tuple[str, dict[str, str], bytes]) -> str:
    command, headers, payload = frame
    if command == "ERROR":
        detail = payload.decode("utf-8", "replace").strip()
        return f"ERROR message={headers.get('message')!r}" + (f" ({detail})" if detail else "")
    return f"{command} {headers}"


class ControlReader:
    """Waits for one control frame on a blocking socket, with a deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rest = b""

    def expect(self, command: str, deadline: float, *, header: tuple[str, str] | None = None, stop=None):
        """The first frame, which must be ``command`` (with ``header``); ``stop``
        is a file whose becoming readable (the runner's STOP) aborts the wait."""
        while True:
            frames, self.rest = parse_frames(self.rest)
            for frame in frames:
                if frame[0] == command and (header is None or frame[1].get(header[0]) == header[1]):
                    # Anything after it stays for the caller.
                    return frame
                if frame[0] == "ERROR":
                    raise StompError(f"broker sent {describe(frame)} while waiting for {command}")
                raise StompError(f"unexpected {describe(frame)} while waiting for {command}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StompError(f"timed out waiting for {command}")
            if stop is not None:
                ready, _, _ = select.select([self.sock, stop], [], [], remaining)
                if stop in ready:
                    raise StompError(f"stopped by the runner while waiting for {command}")
                if not ready:
                    continue
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise StompError(f"timed out waiting for {command}") from None
            if not data:
                raise StompError(f"broker closed the connection while waiting for {command}")
            self.rest += data


def connect(port: int, deadline: float) -> tuple[socket.socket, ControlReader]:
    """Open a TCP connection and complete the STOMP 1.2 handshake."""
    sock = socket.create_connection((HOST, port), timeout=max(0.1, deadline - time.monotonic()))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(CONNECT)
    reader = ControlReader(sock)
    _, headers, _ = reader.expect("CONNECTED", deadline)
    if headers.get("version") != "1.2":
        raise StompError(f"broker negotiated version {headers.get('version')!r}, not 1.2")
    return sock, reader
