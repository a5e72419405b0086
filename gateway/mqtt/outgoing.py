"""A delivery to an MQTT 5 client: the PUBLISH's properties (the message's
metadata, its expiry left, the subscription's identifier), the topic alias,
and the client's Maximum Packet Size.  3.1.1 deliveries never come here (the
session encodes them inline, on the hot path).  Sans-IO.
"""

from __future__ import annotations

from gateway.mqtt import metadata
from gateway.mqtt.codec import publish_bytes
from gateway.mqtt.packets import Properties
from gateway.mqtt.peer import Peer
from gateway.mqtt.properties import EMPTY_PROPERTIES, encode_properties

NO_TOPIC = b"\x00\x00"  # the topic name of a PUBLISH that goes by its alias alone


def publish_v5(peer: Peer, field: bytes, topic: str, headers: dict[str, str] | None, expires_ms: int, now_ms: int,
               body: bytes, qos: int, retain: bool, dup: bool, packet_id: int | None,
               subscription_id: int) -> bytes | None:
    """The whole PUBLISH, or None when it is larger than the client takes
    (then it is not sent, and counted: the caller settles it as if it had
    been [MQTT-3.1.2-25])."""
    properties: Properties | None = None
    if headers or expires_ms:
        properties = metadata.to_properties(headers or {}, expires_ms, now_ms)
    if subscription_id:
        if properties is None:
            properties = Properties()
        properties.subscription_identifiers = (subscription_id,)  # [MQTT-3.3.4-3]
    aliases = peer.aliases_out
    alias = None
    named = True
    if aliases.maximum:
        alias, named = aliases.alias(topic)
        if alias is not None:
            if properties is None:
                properties = Properties()
            properties.topic_alias = alias
            if not named:
                field = NO_TOPIC
    block = EMPTY_PROPERTIES if properties is None else encode_properties(properties)
    packet = publish_bytes(field, body, qos, retain, dup, packet_id, block)
    if len(packet) > peer.maximum_packet_size:
        if alias is not None and named:
            aliases.forget(topic)  # the client never learnt it
        peer.oversize_dropped += 1
        return None
    return packet
