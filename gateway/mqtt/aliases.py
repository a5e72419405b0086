"""MQTT 5 topic aliases, both ways (v5 §3.3.2.3.4).

A client may name a topic by a number it chose earlier on the same
connection, up to the server's Topic Alias Maximum; the server may do the
same towards the client, up to the client's.  Aliases belong to one network
connection and start empty on each [MQTT-3.3.2-7]; both tables are bounded
by the maximum agreed at CONNECT.  Sans-IO.
"""

from __future__ import annotations


class InboundAliases:
    """The client's aliases: alias -> topic name, at most ``maximum``."""

    __slots__ = ("maximum", "topics")

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.topics: dict[int, str] = {}

    def resolve(self, topic: str, alias: int | None) -> str | None:
        """The topic a PUBLISH names: its topic name (setting the alias if it
        carries one too), or the topic its alias was set to.  None when the
        PUBLISH is a protocol error: an alias of 0 or over the maximum
        (0x94, [MQTT-3.3.2-8], [MQTT-3.3.2-9]), or an empty topic name with an
        alias never set (0x82)."""
        if alias is None:
            return topic or None  # an empty topic needs an alias [MQTT-3.3.2-1]
        if not 0 < alias <= self.maximum:
            return None
        if topic:
            self.topics[alias] = topic  # set, or replace [MQTT-3.3.2-12]
            return topic
        return self.topics.get(alias)


class OutboundAliases:
    """Ours towards the client: topic -> alias, at most ``maximum``; once
    every alias is given, further topics go by name (aliases are never
    reassigned, so a topic keeps the alias the client learnt)."""

    __slots__ = ("maximum", "aliases", "items")

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.aliases: dict[str, int] = {}
        # The Topic Alias property item of each, made once (a delivery by
        # alias adds it to its property block as it is).
        self.items: dict[str, bytes] = {}

    def alias(self, topic: str) -> tuple[int | None, bool]:
        """(the alias to send ``topic`` by, or None; whether the topic name
        must be sent too: the first use sets the alias)."""
        alias = self.aliases.get(topic)
        if alias is not None:
            return alias, False
        if len(self.aliases) >= self.maximum:
            return None, True
        alias = self.aliases[topic] = len(self.aliases) + 1
        self.items[topic] = bytes((0x23, alias >> 8, alias & 0xFF))  # Topic Alias (v5 §3.3.2.3.4)
        return alias, True

    def forget(self, topic: str) -> None:
        """Take back the alias just given to ``topic`` (its PUBLISH was not sent)."""
        if self.aliases.get(topic) == len(self.aliases):
            del self.aliases[topic]
            del self.items[topic]
