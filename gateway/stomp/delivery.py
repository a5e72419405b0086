"""A core delivery as the bytes of a STOMP MESSAGE frame.

A MESSAGE is built from pieces: the subscription's prefix (command and
``subscription`` header, encoded once per subscription), its ``ack`` header
if it needs one, then what every subscriber of the message shares
(:func:`shared`, once per message and version): the other headers, the
body and the NUL.  The bytes are those
:meth:`StompConnection.send` would write for the same headers in the same
order (a unit test holds them to it).
"""

from __future__ import annotations

from collections.abc import Callable

from core import names
from core.messages import Message
from core.subscriptions import Subscription

# The ``destination`` header line of each address, per version (escaping
# differs): every message encodes one, and a producer sends to few.  Bounded
# in entries and in the length of a name kept, as core.names caches parsing.
CACHE_ENTRIES = names.CACHE_ENTRIES
CACHED_CHARS = names.CACHED_CHARS
_DESTINATION_LINES: dict[str, dict[str, str]] = {}
_PERSISTENT = "persistent:true\n"
# A body up to this size is joined to the shared headers once per message,
# so a delivery is one outbox chunk, not four (the outbox walks its chunks in
# Python); a larger one is not copied again, and not kept twice in memory
# while the message waits for its acknowledgement.
JOINED_BODY_BYTES = 4096


class SubscriptionState:
    """What a session keeps per STOMP subscription: the id and the
    pre-encoded start of each MESSAGE frame for it."""

    __slots__ = ("id", "number", "prefix", "ack_prefix", "core")

    def __init__(self, sub_id: str, number: int, prefix: bytes, ack_prefix: str | None) -> None:
        self.id = sub_id
        self.number = number
        self.prefix = prefix
        self.ack_prefix = ack_prefix
        self.core: Subscription | None = None


def prefix(sub_id: str, escape: Callable[[str], str]) -> bytes:
    """The start of every MESSAGE for the subscription ``sub_id``."""
    return f"MESSAGE\nsubscription:{escape(sub_id)}\n".encode()


def destination_line(text: str, address: names.Address, version: str, escape: Callable[[str], str]) -> str:
    """``destination:<name>\\n`` for ``address`` (whose text is ``text``),
    escaped by ``escape`` (which must be ``version``'s)."""
    lines = _DESTINATION_LINES.get(version)
    if lines is None:
        lines = _DESTINATION_LINES[version] = {}
    line = lines.get(text)
    if line is None:
        # A temporary destination's owner (its only reader) sees the name it used.
        destination = names.owner_name(address) if address.is_temporary else text
        line = f"destination:{escape(destination)}\n"
        if len(text) <= CACHED_CHARS:
            if len(lines) >= CACHE_ENTRIES:
                lines.clear()  # many short-lived names: start over rather than grow
            lines[text] = line
    return line


def shared(message: Message, version: str, escape: Callable[[str], str]) -> tuple[str, bytes, bytes | None]:
    """``(version, shared, body)``: what every subscriber's MESSAGE has in
    common, escaped by ``escape`` (``version``'s).  A MESSAGE is the
    subscription's prefix and ack header, then ``shared`` (every other header,
    the blank line and, for a small body, the body and NUL), then, if not
    None, ``body`` and a NUL."""
    address = message.address
    text = address.text
    # Inline cache probe: the call below only on a miss (hot path).
    lines = _DESTINATION_LINES.get(version)
    destination = lines.get(text) if lines is not None else None
    if destination is None:
        destination = destination_line(text, address, version, escape)
    message_id = message.id
    if "\\" in message_id or ":" in message_id or "\n" in message_id or "\r" in message_id:
        message_id = escape(message_id)
    redeliveries = message.redeliveries
    # One f-string per message rather than a list of lines joined (hot path).
    redelivered = f"redelivered:true\nx-delivery-count:{redeliveries}\n" if redeliveries else "redelivered:false\n"
    headers = message.headers
    if headers:
        redelivered += "".join([f"{escape(key)}:{escape(value)}\n" for key, value in headers.items()])
    body = message.body
    assert body is not None  # a stub is loaded back before it is delivered
    head = (
        f"message-id:{message_id}\n{destination}timestamp:{message.timestamp}\nexpires:{message.expires}\n"
        f"priority:{message.priority}\n{_PERSISTENT if message.persistent else ''}"
        f"{redelivered}content-length:{len(body)}\n\n"
    ).encode()
    if len(body) <= JOINED_BODY_BYTES:
        return version, head + body + b"\x00", None
    return version, head, body
