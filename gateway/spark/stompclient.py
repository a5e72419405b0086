"""A small blocking STOMP 1.2 client for Spark tasks, on the project's own
sans-IO codec in the client role (so no STOMP library is a runtime dependency).

It does what a writer task needs and nothing more: CONNECT, transactions of
SENDs, each COMMIT with a receipt, DISCONNECT.  Sends are buffered and
written in large chunks; the broker answers nothing inside a transaction
unless something is wrong, so between chunks the client only checks, without
waiting, whether an ERROR arrived.
"""

from __future__ import annotations

import select
import socket
import ssl
import time

from gateway.stomp import codec, frames

FLUSH_BYTES = 256 * 1024  # write in chunks this large
MAX_FRAME_BYTES = 16 * 1024 * 1024  # a server frame larger than this is refused


class StompError(RuntimeError):
    """The broker sent ERROR, closed the connection, or did not answer in time."""


class Refused(StompError):
    """The broker answered ERROR; ``reason`` is its message header."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class Stalled(StompError):
    """The broker read nothing and answered nothing for ``timeout`` seconds."""


class StompClient:
    def __init__(self, host: str, port: int, *, timeout_s: float, tls: ssl.SSLContext | None = None) -> None:
        self.timeout_s = timeout_s
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as error:
            raise StompError(f"cannot reach the broker's STOMP port at {host}:{port}: {error}") from None
        if tls is not None:
            try:
                self.sock = tls.wrap_socket(self.sock, server_hostname=host)
            except (ssl.SSLError, OSError) as error:
                self.sock.close()
                raise StompError(f"TLS with the broker's STOMP port at {host}:{port} failed: {error}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.codec = codec.StompConnection(codec.Role.CLIENT, max_frame_bytes=MAX_FRAME_BYTES)
        self.out = bytearray()
        self._receipts = 0
        # From a COMMIT's RECEIPT: the queue whose high-water mark now holds
        # this producer (the broker stops reading us until it drains).
        self.held_by: str | None = None

    def __enter__(self) -> StompClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    # -- frames out -------------------------------------------------------

    def send_frame(self, frame: frames.Frame) -> None:
        self.send_raw(self.codec.send(frame))

    def send_raw(self, data: bytes) -> None:
        """Frames the caller encoded (gateway.spark.writer.RowEncoder)."""
        self.out += data
        if len(self.out) >= FLUSH_BYTES:
            self.flush()
            self._check_no_error()

    def flush(self) -> None:
        """Write what is buffered.  The wait is for progress, not for the
        whole: a broker that holds this producer back (flow control) and reads
        on as a consumer drains the queue is waited for; one that reads
        nothing for ``timeout`` seconds is :class:`Stalled`."""
        if not self.out:
            return
        view = memoryview(self.out)
        sent = 0
        try:
            while sent < len(view):
                self.sock.settimeout(self.timeout_s)
                try:
                    sent += self.sock.send(view[sent:])
                except TimeoutError:
                    raise self._stalled() from None
                except OSError as error:
                    # The broker may have refused a frame and closed: its ERROR says why.
                    self._check_no_error()
                    raise StompError(f"lost the connection to the broker: {error}") from None
        finally:
            view.release()
        self.out.clear()

    def _stalled(self) -> Stalled:
        why = f"no answer from the broker within {self.timeout_s} s"
        if self.held_by is not None:
            why += (
                f": it holds this writer back (producer flow control) since {self.held_by} is at its high-water mark,"
                " until consumers drain it to half; start a consumer, raise queue_high_water for the destination,"
                " set send_fail_if_no_space, or raise the timeout option to wait longer"
            )
        return Stalled(why)

    # -- frames in --------------------------------------------------------

    def _next_frame(self, deadline: float) -> frames.Frame:
        while True:
            for frame in self.codec.events():
                if isinstance(frame, frames.Error):
                    raise _refusal(frame)
                return frame
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._stalled()
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(64 * 1024)
            except TimeoutError:
                continue
            if not data:
                raise StompError("the broker closed the connection")
            self.codec.receive_data(data)

    def _check_no_error(self) -> None:
        """Raise now if the broker already refused something, instead of at COMMIT."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
            data = self.sock.recv(64 * 1024) if readable else None
        except OSError:
            return  # nothing more to learn from this socket; the caller reports it
        if data is None:
            return
        if not data:
            raise StompError("the broker closed the connection")
        self.codec.receive_data(data)
        for frame in self.codec.events():
            if isinstance(frame, frames.Error):
                raise _refusal(frame)

    def request(self, frame: frames.Frame) -> frames.Frame:
        """Send ``frame`` with a receipt and return the RECEIPT (ERROR raises)."""
        self._receipts += 1
        receipt = f"r{self._receipts}"
        frame.headers["receipt"] = receipt
        self.out += self.codec.send(frame)
        self.flush()
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._next_frame(deadline)
            if isinstance(reply, frames.Receipt) and reply.headers.get("receipt-id") == receipt:
                if "held-by" in reply.headers:
                    self.held_by = reply.headers["held-by"]
                return reply

    # -- the conversation --------------------------------------------------

    def connect(self, host: str, user: str | None, password: str | None) -> None:
        headers = {"accept-version": "1.2", "host": host, "heart-beat": "0,0"}
        if user is not None:
            headers["login"] = user
            headers["passcode"] = password or ""
        self.out += self.codec.send(frames.Connect(headers))
        self.flush()
        try:
            reply = self._next_frame(time.monotonic() + self.timeout_s)
        except Refused as refusal:
            if refusal.reason == "authentication failed":  # the broker's one answer to a bad login, on purpose
                who = f"user {user!r}" if user is not None else "a client without a login (set the user and password options)"
                raise StompError(f"the broker's STOMP port refused {who}: wrong user or password") from None
            raise
        if not isinstance(reply, frames.Connected):
            raise StompError(f"expected CONNECTED, got {reply.command}")
        self.codec.set_version(reply.headers.get("version", "1.2"))

    def disconnect(self) -> None:
        """DISCONNECT and wait for its receipt (so nothing sent is still in
        flight when the socket closes)."""
        self.request(frames.Disconnect({}))


def _refusal(frame: frames.Frame) -> Refused:
    """The broker's ERROR as an exception: its message header, then its body."""
    detail = frame.body.decode("utf-8", "replace")
    reason = frame.headers.get("message", "")
    return Refused(f"broker sent ERROR: {reason} {detail}".strip(), reason)
