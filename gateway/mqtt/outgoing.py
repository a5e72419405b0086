"""A delivery to an MQTT 5 client: the PUBLISH's property block (the
message's metadata and expiry left, the subscription's identifier, the topic
alias) and the client's Maximum Packet Size, which every other packet to it
keeps too (:func:`fitted`).  3.1.1 deliveries never come here (the session
encodes them inline, on the hot path).  Sans-IO.

The block is assembled from property items, not a Properties object: a
message's own items are made once and shared by every subscriber it fans out
to (the session caches them), a subscription's identifier item once per
subscription, and only the alias and the expiry left are per delivery.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from gateway.mqtt import metadata
from gateway.mqtt.codec import EMPTY_PROPERTIES, EMPTY_TOPIC_FIELD, publish_bytes
from gateway.mqtt.peer import Peer
from gateway.mqtt.codec.properties import message_expiry_item, property_items
from gateway.mqtt.codec.wire import remaining_length


def message_items(headers: dict[str, str] | None, expires_ms: int, now_ms: int) -> bytes:
    """The property items of a message's metadata (gateway.mqtt.metadata's
    table) and, if it expires, the interval left [MQTT-3.3.2-6]."""
    items = b""
    if headers:
        properties = metadata.to_properties(headers, 0, now_ms)
        if properties is not None:
            items = property_items(properties)
    if expires_ms:
        items += message_expiry_item(max(1, -((now_ms - expires_ms) // 1000)))
    return items


def publish_v5(peer: Peer, field: bytes, key: str, items: bytes, body: bytes, qos: int, retain: bool, dup: bool,
               packet_id: int | None) -> bytes | None:
    """The whole PUBLISH of ``items`` (the message's and the subscription's
    property items) to the topic ``field`` names (``key``: its address, what
    the aliases are kept by), or None when it is larger than the client
    takes: then it is not sent, and counted, and the caller settles it as if
    it had been [MQTT-3.1.2-25]."""
    aliases = peer.aliases_out
    named = False  # an alias set by this PUBLISH, which names the topic too
    if aliases.maximum:
        item = aliases.items.get(key)
        if item is not None:  # known to the client: the alias alone
            items += item
            field = EMPTY_TOPIC_FIELD
        elif aliases.alias(key)[0] is not None:
            items += aliases.items[key]
            named = True
    if not items:
        block = EMPTY_PROPERTIES
    elif len(items) < 128:
        block = bytes((len(items),)) + items  # a one-byte length: most blocks
    else:
        block = remaining_length(len(items)) + items
    packet = publish_bytes(field, body, qos, retain, dup, packet_id, block)
    if len(packet) > peer.maximum_packet_size:
        if named:
            aliases.forget(key)  # the client never learnt it
        peer.oversize_dropped += 1
        return None
    return packet


# What a packet other than PUBLISH sheds, in this order, until it fits the
# client's Maximum Packet Size [MQTT-3.1.2-24]: first the Reason String and
# User Properties [MQTT-3.1.2-25]; then, on a CONNACK, what the client
# assumes anyway when absent (the four "available" flags, v5 §3.2.2.3); then
# what only narrows what the client may do (no Topic Alias Maximum: it uses
# none), last the server's own limits, which the server enforces whether told
# or not (a client told no Maximum Packet Size or Receive Maximum that goes
# over them is disconnected with 0x95 or 0x93).  What the client must know
# (Assigned Client Identifier, Session Expiry Interval, Server Keep Alive)
# is never shed.
SHED: tuple[tuple[str, Any], ...] = (
    ("reason_string", None), ("user_properties", ()),
    ("retain_available", None), ("wildcard_subscription_available", None),
    ("subscription_identifier_available", None), ("shared_subscription_available", None),
    ("topic_alias_maximum", None), ("maximum_packet_size", None), ("receive_maximum", None),
)


def fitted(peer: Peer, encode: Callable[[Any], bytes], packet: Any) -> bytes | None:
    """``packet`` (a ConnAck, PubAck, PubRec, Disconnect ... with a
    ``properties`` field) encoded within the client's Maximum Packet Size,
    shedding properties as SHED says; None when even the rest is too large:
    then it must not be sent at all [MQTT-3.1.2-24]."""
    data = encode(packet)
    limit = peer.maximum_packet_size
    if len(data) <= limit:
        return data
    props = packet.properties
    if props is None:
        return None
    props = dataclasses.replace(props)  # the caller's object stays as it was
    for attr, absent in SHED:
        if getattr(props, attr) != absent:
            setattr(props, attr, absent)
            data = encode(dataclasses.replace(packet, properties=props))
            if len(data) <= limit:
                return data
    return None
