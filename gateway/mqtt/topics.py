"""One topic space: MQTT topic names and filters <-> the core's topic addresses.

MQTT ``a/b/c`` is the topic ``a.b.c``; ``+`` is ``*`` and ``#`` is ``>``.  What
a level may hold but a segment may not is escaped reversibly, so every MQTT
topic survives the round trip byte for byte (ActiveMQ swaps ``.`` and ``/``
instead, which breaks Sparkplug's ``spBv1.0/...``):

    ``%`` -> ``%25``   ``.`` -> ``%2E``   ``*`` -> ``%2A``   ``>`` -> ``%3E``
    an empty level -> ``%``  (a lone ``%`` never comes out of the rest)

A STOMP client sees those escapes in the name (``/topic/spBv1%2E0.group``) and
may use them the same way.
"""

from __future__ import annotations

import functools

from core import names
from core.names import Address
from gateway.mqtt.codec.encoders import topic_field

_ESCAPES = str.maketrans({"%": "%25", ".": "%2E", "*": "%2A", ">": "%3E"})
_UNESCAPES = (("%2E", "."), ("%2A", "*"), ("%3E", ">"), ("%25", "%"))
EMPTY_LEVEL = "%"


def _escape(level: str) -> str:
    if not level:
        return EMPTY_LEVEL
    return level.translate(_ESCAPES) if any(c in level for c in "%.*>") else level


def _unescape(segment: str) -> str:
    if segment == EMPTY_LEVEL:
        return ""
    if "%" not in segment:
        return segment
    out = []
    i = 0
    while i < len(segment):
        chunk = segment[i : i + 3]
        for escaped, plain in _UNESCAPES:
            if chunk == escaped:
                out.append(plain)
                i += 3
                break
        else:
            out.append(segment[i])
            i += 1
    return "".join(out)


# Every PUBLISH maps its topic, and every delivery maps it back: a fifth of an
# MQTT message's CPU when computed each time (profiled).  A device publishes
# to few topics, so both are cached, bounded in entries and, since a topic
# may be 64 KiB, in the length of what is kept.
CACHE_ENTRIES = names.CACHE_ENTRIES
CACHED_CHARS = names.CACHED_CHARS


def _map(topic: str) -> Address | str:
    return names.topic(".".join(_escape(level) for level in topic.split("/")))


class _Addresses(dict):  # type: ignore[type-arg]
    """Topic name -> its core address, or why it cannot be one.  A dict whose
    hits are one C lookup (every PUBLISH asks), filled by ``__missing__``,
    bounded: at most CACHE_ENTRIES names (emptied when full), none longer
    than CACHED_CHARS kept."""

    def __missing__(self, topic: str) -> Address | str:
        address = _map(topic)
        if len(topic) <= CACHED_CHARS:
            if len(self) >= CACHE_ENTRIES:
                self.clear()
            self[topic] = address
        return address


# to_address(topic): the core address of an MQTT topic name, or why it cannot
# be one.  The cache's own lookup, bound: no Python call on a hit.
to_address = _Addresses().__getitem__


def to_pattern(topic_filter: str) -> Address | str:
    """The core pattern of a (valid) MQTT topic filter."""
    levels = []
    for level in topic_filter.split("/"):
        if level == "+":
            levels.append(names.ANY_SEGMENT)
        elif level == "#":
            levels.append(names.ANY_REST)
        else:
            levels.append(_escape(level))
    return names.topic(".".join(levels))


def from_address(address: Address) -> str:
    """The MQTT topic name of a core topic address (for deliveries)."""
    return _from_address(address) if len(address.name) <= CACHED_CHARS else _unmap(address)


def _unmap(address: Address) -> str:
    return "/".join(_unescape(segment) for segment in address.segments)


_from_address = functools.lru_cache(maxsize=CACHE_ENTRIES)(_unmap)


class _DeliveryFields(dict):  # type: ignore[type-arg]
    """Address text -> the PUBLISH topic field of a delivery to it, or None
    for a name MQTT cannot carry ('+' or '#' inside a segment, from STOMP).

    A dict whose hits are one C lookup (every delivery asks; a wrapper
    function call would cost more than the lookup), filled by ``__missing__``
    and bounded as the caches above: at most CACHE_ENTRIES names (emptied
    when full), none longer than CACHED_CHARS kept."""

    def __missing__(self, text: str) -> bytes | None:
        address = names.parse(text)
        assert not isinstance(address, str), address  # the text of an Address
        topic = from_address(address)
        # validate_topic_name's other rules cannot fail for a core name (never
        # empty, no NUL, far below 65535 bytes); topic_field checks them anyway.
        field = None if "+" in topic or "#" in topic else topic_field(topic)
        if len(text) <= CACHED_CHARS:
            if len(self) >= CACHE_ENTRIES:
                self.clear()
            self[text] = field
        return field


# delivery_field[address.text]: see _DeliveryFields.
delivery_field = _DeliveryFields()


def topic_of(text: str) -> str | None:
    """The MQTT topic name of a destination's text (a STOMP ``reply-to``,
    say), or None when it is not a topic an MQTT client can publish to: a
    queue, a temporary destination, a pattern, a name MQTT cannot carry."""
    address = names.parse(text)
    if isinstance(address, str) or address.kind is not names.Kind.TOPIC or address.is_pattern:
        return None
    topic = from_address(address)
    return None if "+" in topic or "#" in topic else topic
