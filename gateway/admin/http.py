"""What the admin port's HTTP is made of, shared by the API, the archive
endpoint, the WebSocket upgrade and the h11 server: the request and response
values and the headers every answer carries."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

# The headers every answer carries: no page may frame the console
# (clickjacking), no body is sniffed into another type, and no page address
# leaks to elsewhere through links.
SECURITY_HEADERS = (
    ("X-Frame-Options", "DENY"),
    ("Content-Security-Policy", "frame-ancestors 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
)


@dataclasses.dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes = b""
    host: str = "unknown"  # the client's address, what the login lockout counts
    user: str = ""  # who asked and their role (read|browse|write), once authorized
    role: str = ""


@dataclasses.dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    # A body too big to hold, or one that takes blocking reads to make (the
    # cluster's ZooKeeper records): an object whose blocking next_chunk()
    # returns the next piece (None at the end) and close(); admin/server.py
    # calls it in a worker thread and sends the pieces chunked.
    stream: Any = None


def error(status: int, reason: str, **headers: str) -> Response:
    return Response(status, json.dumps({"status": status, "reason": reason}).encode(), headers=list(headers.items()))


def ok(payload: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(payload, separators=(",", ":")).encode())
