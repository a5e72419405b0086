"""What the STOMP codec tests share: the versions, which frames each role
sends, and helpers that drive a connection (connection, decode, expected)."""

from __future__ import annotations

from gateway.stomp import frames
from gateway.stomp.codec import Role, StompConnection

VERSIONS = ("1.0", "1.1", "1.2")
# Which frames each role sends.
SENT_BY = {Role.CLIENT: tuple(frames.CLIENT_FRAMES.values()), Role.SERVER: tuple(frames.SERVER_FRAMES.values())}


def connection(role: Role, version: str = "1.2", **limits: int) -> StompConnection:
    conn = StompConnection(role, **limits)
    conn.set_version(version)
    return conn


def decode(chunks: list[bytes], role: Role = Role.SERVER, version: str = "1.2", **limits: int) -> list[frames.Frame]:
    """Feed ``chunks`` one by one, collecting frames after each; check nothing is left over."""
    conn = connection(role, version, **limits)
    out: list[frames.Frame] = []
    for chunk in chunks:
        if chunk:
            conn.receive_data(chunk)
            out.extend(conn.events())
    assert conn.buffered_bytes == 0
    assert not conn.mid_frame
    return out


def expected(frame: frames.Frame) -> frames.Frame:
    """What the peer decodes: ``send`` adds content-length to any frame with a body."""
    headers = dict(frame.headers)
    if frame.body:
        headers.setdefault("content-length", str(len(frame.body)))
    return type(frame)(headers, frame.body)
