"""A sans-IO STOMP 1.0/1.1/1.2 codec in the style of h11.

Feed bytes with :meth:`StompConnection.receive_data`, take frames from
:meth:`StompConnection.events`, turn frames into bytes with
:meth:`StompConnection.send`.  It never touches a socket, a clock or a logger;
when the peer breaks the protocol it raises :class:`RemoteProtocolError`, which
carries the ERROR headers to send back.

Spec references are to https://stomp.github.io/stomp-specification-1.2.html.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator

from gateway.stomp import frames

# Defaults from the issue; a server tightens them before CONNECT completes.
MAX_FRAME_BYTES = 4 * 1024 * 1024
MAX_HEADERS = 100
MAX_HEADER_BYTES = 100 * 1024

SUPPORTED_VERSIONS = ("1.0", "1.1", "1.2")


class Role(enum.Enum):
    SERVER = "server"  # parses client frames, serializes server frames
    CLIENT = "client"  # the reverse; used by tests and benchmarks


class State(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"  # the peer sent EOF
    ERROR = "error"  # a protocol error was raised; the connection is unusable


class ProtocolError(Exception):
    """A STOMP protocol violation.

    ``headers`` are the headers of the ERROR frame that tells the peer why
    (always including ``message``); ``body`` is its optional detail text.
    """

    def __init__(self, message: str, *, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        super().__init__(message)
        self.message = message
        self.headers: dict[str, str] = {"message": message, **(headers or {})}
        self.body = body


class RemoteProtocolError(ProtocolError):
    """The peer sent something we cannot accept."""


class LocalProtocolError(ProtocolError):
    """We were asked to send something the protocol does not allow."""


# STOMP 1.2 §Value Encoding.  1.1 defines the same escapes but carriage return.
_ESCAPES_12 = {"\\": "\\\\", "\r": "\\r", "\n": "\\n", ":": "\\c"}
_ESCAPES_11 = {"\\": "\\\\", "\n": "\\n", ":": "\\c"}
_UNESCAPES_12 = {"\\\\": "\\", "\\r": "\r", "\\n": "\n", "\\c": ":"}
_UNESCAPES_11 = {"\\\\": "\\", "\\n": "\n", "\\c": ":"}
_ESCAPE_TABLE = {
    "1.0": str.maketrans({"\n": " ", "\r": " "}),  # 1.0 cannot carry EOLs at all
    "1.1": str.maketrans(_ESCAPES_11),
    "1.2": str.maketrans(_ESCAPES_12),
}


# What may come between frames: EOLs (heart-beats) and stray NULs.
_BETWEEN_FRAMES = re.compile(rb"(?:\r?\n|\x00)*")
_BETWEEN_BYTES = b"\r\n\x00"
# What a frame that takes no body may carry instead of one.
_BLANK = b" \t\r\n"

# The fast path: a head it remembers is at most this long (one per
# connection), and a content-length it reads has at most this many digits.
_SIMPLE_HEAD_CACHED_BYTES = 1024
_SIMPLE_LENGTH_DIGITS = 18
# (frame class, headers, head length, header count, content-length,
#  smallest max_frame_bytes with that many digits, may carry a body)
_SimpleHead = tuple[type[frames.Frame], dict[str, str], int, int, int, int, bool]

# Frames parsed before a version is agreed: they may use CRLF whatever it is.
_PRE_NEGOTIATION = frozenset({"CONNECT", "STOMP", "CONNECTED"})


def _receipt_of(lines: list[str]) -> dict[str, str]:
    """The receipt header of a rejected frame, so its ERROR can name it."""
    for line in lines[1:]:
        if line.startswith("receipt:"):
            return {"receipt-id": line[8:].rstrip("\r")}
    return {}


def _command_prefixes(commands: dict[str, type[frames.Frame]]) -> frozenset[bytes]:
    return frozenset(c.encode()[:i] for c in commands for i in range(len(c) + 1))


_PREFIXES = {
    id(frames.CLIENT_FRAMES): _command_prefixes(frames.CLIENT_FRAMES),
    id(frames.SERVER_FRAMES): _command_prefixes(frames.SERVER_FRAMES),
}


def _unescape(text: str, table: dict[str, str]) -> str:
    out = []
    i = 0
    n = len(text)
    while i < n:
        j = text.find("\\", i)
        if j < 0:
            out.append(text[i:])
            break
        out.append(text[i:j])
        seq = text[j : j + 2]
        replacement = table.get(seq)
        if replacement is None:
            # "Undefined escape sequences such as \t MUST be treated as a fatal protocol error."
            raise RemoteProtocolError(f"undefined escape sequence {seq!r} in header")
        out.append(replacement)
        i = j + 2
    return "".join(out)


def negotiate_version(accept_version: str | None) -> str | None:
    """The highest version both sides speak; 1.0 when the client names none."""
    if accept_version is None:
        return "1.0"
    offered = {v.strip() for v in accept_version.split(",")}
    for version in reversed(SUPPORTED_VERSIONS):
        if version in offered:
            return version
    return None


class StompConnection:
    """One side of a STOMP byte stream."""

    def __init__(
        self,
        role: Role = Role.SERVER,
        *,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        max_headers: int = MAX_HEADERS,
        max_header_bytes: int = MAX_HEADER_BYTES,
        fast_path: bool = True,
    ) -> None:
        self.role = role
        self.max_frame_bytes = max_frame_bytes
        self.max_headers = max_headers
        self.max_header_bytes = max_header_bytes
        self.state = State.OPEN
        self.version = "1.0"
        self._incoming = frames.CLIENT_FRAMES if role is Role.SERVER else frames.SERVER_FRAMES
        self._outgoing = frames.SERVER_FRAMES if role is Role.SERVER else frames.CLIENT_FRAMES
        self._prefixes = _PREFIXES[id(self._incoming)]
        self._unescapes: dict[str, str] | None = None
        self._escape_table = _ESCAPE_TABLE["1.0"]
        self._buf = b""
        self._pos = 0
        # How much of the current frame's body was already searched for NUL, so a
        # large body arriving in small pieces is scanned once, not quadratically.
        self._body_scanned = 0
        # False: every frame takes the general parser, the reference the fast
        # path (:meth:`_next_simple`) is tested against.
        self._fast = fast_path
        # The last head the fast path parsed (with its blank line) and what it
        # said: a producer mostly repeats its head byte for byte, and then one
        # compare replaces the parse.
        self._last_head = b""
        self._last_parse: _SimpleHead | None = None

    # -- configuration -----------------------------------------------------

    def set_version(self, version: str) -> None:
        """Fix the negotiated version; it decides header escaping from now on."""
        if version not in SUPPORTED_VERSIONS:
            raise LocalProtocolError(f"unsupported STOMP version {version!r}")
        self.version = version
        self._unescapes = {"1.0": None, "1.1": _UNESCAPES_11, "1.2": _UNESCAPES_12}[version]
        self._escape_table = _ESCAPE_TABLE[version]

    # -- receiving ---------------------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._pos

    def receive_data(self, data: bytes | bytearray) -> None:
        """Add bytes from the peer; ``b""`` means the peer closed its side."""
        if self.state is not State.OPEN:
            raise LocalProtocolError(f"cannot receive data in state {self.state.name}")
        if not data:
            self.state = State.CLOSED
            return
        if self._pos:
            self._buf = self._buf[self._pos :] + data
            self._pos = 0
        elif self._buf:
            self._buf += data
        else:
            self._buf = bytes(data)

    def events(self) -> Iterator[frames.Frame]:
        """Yield every complete frame buffered so far, lazily."""
        if self.state is State.ERROR:
            raise LocalProtocolError("the connection already failed")
        fast = self._fast
        try:
            while True:
                frame = self._next_simple() if fast else None
                if frame is None:
                    frame = self._next_frame()
                    if frame is None:
                        return
                yield frame
        except RemoteProtocolError:
            self.state = State.ERROR
            raise

    @property
    def mid_frame(self) -> bool:
        """True when a partial frame is buffered (EOF now would cut it)."""
        return self._pos < len(self._buf)

    def _next_simple(self) -> frames.Frame | None:
        """The common frame, parsed without the general path's checks: an
        ASCII head without CR or backslash, within every limit, with a
        content-length and the NUL after it.  None leaves the frame to
        :meth:`_next_frame` (incomplete, an error, or anything else), so the
        fast path only ever returns what the general one would."""
        buf = self._buf
        pos = self._pos
        n = len(buf)
        parsed = self._last_parse
        # The repeated head first; only else the heart-beats before a head.
        if parsed is None or not buf.startswith(self._last_head, pos):
            if pos >= n:
                return None
            if buf[pos] in _BETWEEN_BYTES:  # skipped as _next_frame does
                skipped = _BETWEEN_FRAMES.match(buf, pos)
                assert skipped is not None  # "*" matches the empty string
                pos = self._pos = skipped.end()
            if parsed is None or not buf.startswith(self._last_head, pos):
                parsed = self._simple_head(buf, pos)
                if parsed is None:
                    return None
        cls, template, head_bytes, header_count, length, digits_floor, takes_body = parsed
        # The limits may have changed since the head was parsed (CONNECT).
        # A head no longer than one header line has no line too long, and
        # ends within the head limit; a content-length with more digits than
        # max_frame_bytes is refused however small its value.
        if head_bytes > self.max_header_bytes or header_count > self.max_headers:
            return None
        max_frame_bytes = self.max_frame_bytes
        if digits_floor > max_frame_bytes:
            return None
        body_start = pos + head_bytes + 2
        body_end = body_start + length
        if body_end >= n or body_end >= pos + max_frame_bytes or buf[body_end] != 0:
            return None
        if not length:
            self._pos = body_end + 1
            return cls(template.copy(), b"")
        if not takes_body:
            return None  # blank or refused: the general path says which
        self._pos = body_end + 1
        return cls(template.copy(), buf[body_start:body_end])

    def _simple_head(self, buf: bytes, pos: int) -> _SimpleHead | None:
        """Parse a head for :meth:`_next_simple`, or None if it is not simple."""
        term = buf.find(b"\n\n", pos, pos + self.max_header_bytes + 2)
        if term < 0:
            return None
        head = buf[pos:term]
        # With no CR there is no CRLF to strip, with no backslash nothing to
        # unescape (whatever the version), and ASCII counts bytes as characters.
        if b"\r" in head or b"\\" in head or not head.isascii():
            return None
        # Without a content-length only an empty body is simple (ACK, NACK,
        # SUBSCRIBE, BEGIN: the NUL right after the blank line); a body that
        # must be scanned for its NUL goes to the general parser before the
        # head is split, not after.
        if b"\ncontent-length:" not in head and buf[term + 2 : term + 3] != b"\x00":
            return None
        lines = head.decode("ascii").split("\n")
        cls = self._incoming.get(lines[0])
        if cls is None:
            return None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            key, colon, value = line.partition(":")
            if not colon:
                return None
            if key not in headers:  # §Repeated Header Entries: the first wins
                headers[key] = value
        length_text = headers.get("content-length")
        if length_text is None:
            length = digits_floor = 0  # _next_simple finds the NUL or leaves the frame
        elif not length_text.isdigit() or len(length_text) > _SIMPLE_LENGTH_DIGITS:
            return None
        else:
            length = int(length_text)
            digits_floor = 10 ** (len(length_text) - 1)
        parsed = (
            cls, headers, term - pos, len(lines) - 1, length, digits_floor, cls.command in frames.COMMANDS_WITH_BODY,
        )
        if term - pos <= _SIMPLE_HEAD_CACHED_BYTES:
            self._last_head = buf[pos : term + 2]
            self._last_parse = parsed
        return parsed

    def _next_frame(self) -> frames.Frame | None:
        buf = self._buf
        pos = self._pos
        n = len(buf)
        # EOLs between frames are heart-beats (§Heart-beating); a NUL there is
        # a client ending its frames twice.  Both are skipped and dropped at
        # once, so a flood of them is never buffered.
        if pos < n and buf[pos] in _BETWEEN_BYTES:
            skipped = _BETWEEN_FRAMES.match(buf, pos)
            assert skipped is not None  # "*" matches the empty string
            pos = self._pos = skipped.end()
        if pos >= n:
            if pos:
                self._buf = b""
                self._pos = 0
            return None
        if buf[pos] == 13:
            if pos + 1 == n:
                return None  # a lone CR at the end; wait for its LF
            raise RemoteProtocolError("carriage return not followed by line feed")

        # Find the blank line that ends the headers.  LF-only frames end in
        # "\n\n"; with 1.2 CRLF endings it is "\r\n\r\n", which contains
        # "\n\r\n" but not "\n\n" (a "\n\n" found later may be in the body).
        line_limit = self.max_header_bytes
        frame_end_limit = pos + self.max_frame_bytes
        head_limit = min(frame_end_limit, pos + (self.max_headers + 1) * (line_limit + 2) + 2)
        term = buf.find(b"\n\n", pos, head_limit)
        # "+ 1": in "X\r\n\r\n\nbody" the "\n\n" found overlaps the real end.
        crlf = buf.find(b"\n\r\n", pos, head_limit if term < 0 else term + 1)
        if crlf >= 0:
            term = crlf
            body_start = crlf + 3
        elif term >= 0:
            body_start = term + 2
        else:
            if n >= head_limit:
                if head_limit == frame_end_limit:
                    raise RemoteProtocolError("frame too large", headers={"max-frame-bytes": str(self.max_frame_bytes)})
                raise RemoteProtocolError("too many headers", headers={"max-headers": str(self.max_headers)})
            self._check_partial_head(buf, pos, n)
            return None
        try:
            head = buf[pos:term].decode()
        except UnicodeDecodeError:
            raise RemoteProtocolError("frame command or header is not valid UTF-8") from None
        lines = head.split("\n")
        command = lines[0]
        if command.endswith("\r"):
            command = lines[0] = command[:-1]
        cls = self._incoming.get(command)
        if cls is None:
            raise RemoteProtocolError(f"unknown command {command[:40]!r}", headers=_receipt_of(lines))
        # Only 1.2 ends lines with CRLF; in 1.0/1.1 a trailing CR belongs to
        # the value.  CONNECT precedes negotiation, so accept both there.
        if "\r" in head and (self.version == "1.2" or command in _PRE_NEGOTIATION):
            lines = [line[:-1] if line.endswith("\r") else line for line in lines]
        bytes_differ = not head.isascii()
        if len(lines) > self.max_headers + 1:
            raise RemoteProtocolError("too many headers", headers={"max-headers": str(self.max_headers)})
        unescapes = None if command in frames.UNESCAPED_COMMANDS else self._unescapes
        if unescapes is not None and "\\" not in head:
            unescapes = None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if len(line) > line_limit or (bytes_differ and len(line.encode()) > line_limit):
                raise RemoteProtocolError("header line too long", headers={"max-header-bytes": str(line_limit)})
            key, colon, value = line.partition(":")
            if not colon:
                raise RemoteProtocolError("header line without a colon")
            if unescapes is not None:
                key = _unescape(key, unescapes)
                value = _unescape(value, unescapes)
            # §Repeated Header Entries: only the first value is used.
            if key not in headers:
                headers[key] = value

        length_text = headers.get("content-length")
        if length_text is not None:
            if not length_text.isdigit() or not length_text.isascii():
                raise RemoteProtocolError(f"invalid content-length {length_text[:20]!r}")
            if len(length_text) > len(str(self.max_frame_bytes)):
                raise RemoteProtocolError("frame too large", headers={"max-frame-bytes": str(self.max_frame_bytes)})
            body_end = body_start + int(length_text)
            if body_end >= frame_end_limit:
                raise RemoteProtocolError("frame too large", headers={"max-frame-bytes": str(self.max_frame_bytes)})
            if n <= body_end:
                return None
            if buf[body_end] != 0:
                raise RemoteProtocolError("frame body not terminated by NUL after content-length octets")
        else:
            body_end = buf.find(b"\x00", body_start + self._body_scanned)
            if body_end < 0:
                if n > frame_end_limit:
                    raise RemoteProtocolError("frame too large", headers={"max-frame-bytes": str(self.max_frame_bytes)})
                self._body_scanned = n - body_start
                return None
            if body_end >= frame_end_limit:
                raise RemoteProtocolError("frame too large", headers={"max-frame-bytes": str(self.max_frame_bytes)})
        self._body_scanned = 0
        self._pos = body_end + 1
        if body_end == body_start:
            return cls(headers, b"")
        body = buf[body_start:body_end]
        if cls.command not in frames.COMMANDS_WITH_BODY:
            # Clients end CONNECT (and others) with a newline before the NUL;
            # like RabbitMQ, take such blank bodies as none.  Anything else is
            # a body the frame cannot carry.
            if body.strip(_BLANK):
                raise RemoteProtocolError(f"{cls.command} frame must not have a body")
            body = b""
        return cls(headers, body)

    def _check_partial_head(self, buf: bytes, pos: int, n: int) -> None:
        """Fail early on an incomplete head that already breaks a limit or names
        an unknown command, rather than buffering up to the frame limit."""
        eol = buf.find(b"\n", pos, n)
        if eol < 0:
            # A command line that cannot become a known command (a TLS hello,
            # an HTTP request, noise without a line end) fails now, not at the
            # frame limit.
            partial = buf[pos:n].rstrip(b"\r")
            if partial not in self._prefixes:
                raise RemoteProtocolError(f"unknown command {partial[:40]!r}")
            return
        command = buf[pos:eol].rstrip(b"\r").decode("utf-8", "replace")
        if command not in self._incoming:
            raise RemoteProtocolError(f"unknown command {command[:40]!r}")
        last = buf.rfind(b"\n", pos, n)
        if n - last - 1 > self.max_header_bytes + 1:
            raise RemoteProtocolError("header line too long", headers={"max-header-bytes": str(self.max_header_bytes)})

    # -- sending -----------------------------------------------------------

    def send(self, frame: frames.Frame) -> bytes:
        """Serialize a frame, escaping headers for the negotiated version."""
        command = frame.command
        if command not in self._outgoing:
            raise LocalProtocolError(f"a {self.role.value} cannot send {command}")
        escape = command not in ("CONNECT", "STOMP", "CONNECTED")
        lines = [command]
        for key, value in frame.headers.items():
            lines.append(f"{self.escape(key)}:{self.escape(value)}" if escape else f"{key}:{value}")
        body = frame.body
        if body and "content-length" not in frame.headers:
            lines.append(f"content-length:{len(body)}")
        lines.append("\n")
        return "\n".join(lines).encode() + body + b"\x00"

    def receipt(self, receipt_id: str) -> bytes:
        """``send(Receipt({"receipt-id": receipt_id}))``, byte for byte: a
        receipted producer gets one per SEND, so it skips the general path."""
        if self.role is not Role.SERVER:
            raise LocalProtocolError("a client cannot send RECEIPT")
        return f"RECEIPT\nreceipt-id:{self.escape(receipt_id)}\n\n\x00".encode()

    def escape(self, text: str) -> str:
        """Escape one header key or value for the negotiated version."""
        if "\\" in text or ":" in text or "\n" in text or "\r" in text:
            return text.translate(self._escape_table)
        return text

    @staticmethod
    def heartbeat() -> bytes:
        return b"\n"
