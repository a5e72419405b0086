"""What the selector tests evaluate against: a message, the headers of the
grammar table's message, and JMS's three-valued AND, OR and NOT tables."""

from __future__ import annotations

from typing import Any

from core import names
from core.messages import Message

T, F, U = True, False, None  # JMS's TRUE, FALSE, UNKNOWN


def msg(headers: dict[str, str] | None = None, **fields: Any) -> Message:
    address = names.parse(fields.pop("destination", "/queue/orders"))
    return Message(fields.pop("id", "ID:1"), address, headers, b"body", **fields)


H = {
    "n": "5",
    "f": "2.5",
    "neg": "-3",
    "s": "hello",
    "t": "true",
    "fa": "FALSE",
    "empty": "",
    "content-type": "text/plain",
    "and": "kw",
    "pct": "50%",
    "q": "it's",
    "type": "order",
    "correlation-id": "c-1",
    "reply-to": "/queue/replies",
    "JMSXGroupID": "g1",
    "JMSXGroupSeq": "3",
}

# JMS 1.1 §3.8.1.2, tables 3-4, 3-5 and 3-6, written out rather than computed.
AND_TABLE = {(T, T): T, (T, F): F, (T, U): U, (F, T): F, (F, F): F, (F, U): F, (U, T): U, (U, F): F, (U, U): U}
OR_TABLE = {(T, T): T, (T, F): T, (T, U): T, (F, T): T, (F, F): F, (F, U): U, (U, T): T, (U, F): U, (U, U): U}
NOT_TABLE = {T: F, F: T, U: U}
