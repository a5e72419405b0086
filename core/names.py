"""Destination names: ``/queue/``, ``/topic/``, ``/temp-queue/``, ``/temp-topic/``.

A name is dot-separated segments.  Subscriptions to topics may use ``*`` for
exactly one segment and ``>`` for all remaining segments (zero or more, so that
MQTT's ``a/#``, which also matches ``a``, maps onto it).
"""

from __future__ import annotations

import enum
import functools

MAX_NAME_CHARS = 1024
ANY_SEGMENT = "*"
ANY_REST = ">"


class Kind(enum.Enum):
    QUEUE = "/queue/"
    TOPIC = "/topic/"
    TEMP_QUEUE = "/temp-queue/"
    TEMP_TOPIC = "/temp-topic/"

    # Enum's own __hash__ is Python code, and routing keys dicts by kind on
    # every message: members are singletons, so identity hashing agrees.
    __hash__ = object.__hash__


# Kind.TOPIC.value is a Python-level property: read it once.
TOPIC_PREFIX = Kind.TOPIC.value

_QUEUE_KINDS = frozenset({Kind.QUEUE, Kind.TEMP_QUEUE})
_TEMP_KINDS = frozenset({Kind.TEMP_QUEUE, Kind.TEMP_TOPIC})


class Address:
    """A parsed destination.  Interned by :func:`parse`, so compare with ``is`` or ``==``."""

    __slots__ = ("kind", "name", "segments", "is_queue", "is_temporary", "is_pattern", "text")

    def __init__(self, kind: Kind, name: str) -> None:
        self.kind = kind
        self.name = name
        self.segments = tuple(name.split("."))
        self.is_queue = kind in _QUEUE_KINDS
        self.is_temporary = kind in _TEMP_KINDS
        self.is_pattern = ANY_SEGMENT in self.segments or ANY_REST in self.segments
        self.text = kind.value + name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Address) and self.text == other.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"Address({self.text!r})"

    def __str__(self) -> str:
        return self.text


def _check_name(name: str) -> str | None:
    """The reason ``name`` is malformed, or None."""
    if not name:
        return "empty destination name"
    if len(name) > MAX_NAME_CHARS:
        return f"destination name longer than {MAX_NAME_CHARS} characters"
    if any(ord(c) < 0x20 or c == "\x7f" for c in name):
        return "control character in destination name"
    segments = name.split(".")
    for i, segment in enumerate(segments):
        if not segment:
            return "empty segment in destination name"
        if segment != ANY_SEGMENT and segment != ANY_REST and (ANY_SEGMENT in segment or ANY_REST in segment):
            return "wildcards must be whole segments"
        if segment == ANY_REST and i != len(segments) - 1:
            return "'>' must be the last segment"
    return None


def _parse_uncached(text: str) -> Address | str:
    for kind in Kind:
        if text.startswith(kind.value):
            name = text[len(kind.value) :]
            reason = _check_name(name)
            return reason if reason else Address(kind, name)
    return "destination must start with /queue/, /topic/, /temp-queue/ or /temp-topic/"


CACHE_ENTRIES = 4096
CACHED_CHARS = 512
_parse = functools.lru_cache(maxsize=CACHE_ENTRIES)(_parse_uncached)


def parse(text: str) -> Address | str:
    """An :class:`Address`, or the reason ``text`` is not a valid destination.

    Returns rather than raises: a malformed name is ordinary input, and the
    caller decides how to tell the client.  Results are cached, bounded in
    entries and in the length of a name kept (a client may send a long one).
    """
    return _parse(text) if len(text) <= CACHED_CHARS else _parse_uncached(text)


def topic(name: str) -> Address | str:
    """The topic with a dot-separated ``name`` (used by protocols without prefixes)."""
    return parse(TOPIC_PREFIX + name)


# A temporary destination is private to the connection that names it: each
# connection's /temp-queue/x is its own queue, reached by other connections
# through a broker-made name ending in a segment that starts with this mark
# (/temp-queue/x.~17-a3f9c2), as ActiveMQ and RabbitMQ rewrite reply-to.
PRIVATE_MARK = "~"


def is_private(address: Address) -> bool:
    """Whether ``address`` is a broker-made private temporary name, which
    anyone may send to (a reply) but only its owner reads."""
    return address.is_temporary and address.segments[-1].startswith(PRIVATE_MARK)


def owner_name(address: Address) -> str:
    """The name the owner of a private temporary destination used."""
    return address.text.rpartition(".")[0] if is_private(address) else address.text


def matches(pattern: tuple[str, ...], name: tuple[str, ...]) -> bool:
    """Whether a topic name matches a subscription pattern, segment by segment."""
    for i, part in enumerate(pattern):
        if part == ANY_REST:
            return True
        if i >= len(name) or (part != ANY_SEGMENT and part != name[i]):
            return False
    return len(pattern) == len(name)
