"""STOMP frames as value objects, one class per command as the spec spells it.

Hot-path note: frames are plain ``__slots__`` classes rather than frozen
dataclasses.  A SEND is parsed and a MESSAGE built for every message the broker
moves, and a frozen dataclass costs several times more to construct (its
``__init__`` goes through ``object.__setattr__``).  The subclasses add no state;
they exist so a session can dispatch on ``type(frame)`` through a dict.
"""

from __future__ import annotations

from typing import ClassVar


class Frame:
    """A STOMP frame: a command, headers (first occurrence wins) and a body."""

    __slots__ = ("headers", "body", "receipt")
    command: ClassVar[str] = ""

    def __init__(self, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.headers: dict[str, str] = {} if headers is None else headers
        self.body: bytes = body
        # The receipt this frame asked for, kept by a session before handlers
        # pop headers, so an ERROR about the frame can still name it.
        self.receipt: str | None = None

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and self.headers == other.headers
            and self.body == other.body
        )

    def __hash__(self) -> int:  # pragma: no cover - frames are not dict keys
        raise TypeError("frames are mutable and unhashable")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.headers!r}, {self.body[:64]!r})"


# Client frames (STOMP 1.2 §Client Frames).
class Connect(Frame):
    __slots__ = ()
    command = "CONNECT"


class Stomp(Frame):
    __slots__ = ()
    command = "STOMP"


class Send(Frame):
    __slots__ = ()
    command = "SEND"


class Subscribe(Frame):
    __slots__ = ()
    command = "SUBSCRIBE"


class Unsubscribe(Frame):
    __slots__ = ()
    command = "UNSUBSCRIBE"


class Ack(Frame):
    __slots__ = ()
    command = "ACK"


class Nack(Frame):
    __slots__ = ()
    command = "NACK"


class Begin(Frame):
    __slots__ = ()
    command = "BEGIN"


class Commit(Frame):
    __slots__ = ()
    command = "COMMIT"


class Abort(Frame):
    __slots__ = ()
    command = "ABORT"


class Disconnect(Frame):
    __slots__ = ()
    command = "DISCONNECT"


# Server frames (STOMP 1.2 §Server Frames).
class Connected(Frame):
    __slots__ = ()
    command = "CONNECTED"


class Message(Frame):
    __slots__ = ()
    command = "MESSAGE"


class Receipt(Frame):
    __slots__ = ()
    command = "RECEIPT"


class Error(Frame):
    __slots__ = ()
    command = "ERROR"


CLIENT_FRAMES: dict[str, type[Frame]] = {
    cls.command: cls
    for cls in (Connect, Stomp, Send, Subscribe, Unsubscribe, Ack, Nack, Begin, Commit, Abort, Disconnect)
}
SERVER_FRAMES: dict[str, type[Frame]] = {
    cls.command: cls for cls in (Connected, Message, Receipt, Error)
}

# Frames whose headers are never escaped (STOMP 1.2 §Value Encoding).
UNESCAPED_COMMANDS = frozenset({"CONNECT", "STOMP", "CONNECTED"})

# Which body a command may carry (STOMP 1.2 §Body: only SEND, MESSAGE and ERROR).
COMMANDS_WITH_BODY = frozenset({"SEND", "MESSAGE", "ERROR"})
