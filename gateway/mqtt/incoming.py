"""A PUBLISH from an MQTT 5 client, before it becomes a core message: its
topic alias resolved, its properties turned into the message's headers and
expiry, its payload format checked, and the server's Receive Maximum
enforced.  A refusal is a v5 reason code with a reason, for the session to
answer with (an ack's reason code, or a DISCONNECT).  Sans-IO.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.mqtt import metadata
from gateway.mqtt.codec.packets import Publish
from gateway.mqtt.peer import Peer
from gateway.mqtt.codec.reasons import ReasonCode as R


# What to route: (topic, headers, Message Expiry Interval in seconds, 0 for
# never).  A plain tuple, not a NamedTuple: one is made per PUBLISH, and a
# NamedTuple's constructor is Python code.
Accepted = tuple[str, dict[str, str], int]


@dataclass(frozen=True, slots=True)
class Refused:
    code: int
    reason: str
    disconnect: bool  # True: the connection ends (else only this PUBLISH is refused, in its ack)


def accept(peer: Peer, packet: Publish, in_flight: int, receive_maximum: int) -> Accepted | Refused:
    """What to route for ``packet``, or why not.  ``in_flight``: the client's
    QoS 1/2 PUBLISHes the server has not answered yet, this one excluded
    (the caller counts them only for a QoS 1/2 one)."""
    if packet.qos and in_flight >= receive_maximum:
        return Refused(R.RECEIVE_MAXIMUM_EXCEEDED, f"more than {receive_maximum} QoS 1/2 PUBLISHes unacknowledged",
                       True)  # [MQTT-3.3.4-8]
    props = packet.properties
    topic = packet.topic
    if props is None:
        if not topic:
            return Refused(R.PROTOCOL_ERROR, "a PUBLISH with neither a topic name nor a topic alias", True)
        return topic, {}, 0
    if props.topic_alias is not None or not topic:
        resolved = peer.aliases_in.resolve(topic, props.topic_alias)
        if resolved is None:
            alias = props.topic_alias
            if alias is not None and not 0 < alias <= peer.aliases_in.maximum:
                return Refused(R.TOPIC_ALIAS_INVALID, f"topic alias {alias} is over the maximum "
                               f"{peer.aliases_in.maximum}", True)  # [MQTT-3.3.2-9], [MQTT-3.3.2-10]
            return Refused(R.PROTOCOL_ERROR, f"topic alias {alias} was never set", True)
        topic = resolved
        if (props.message_expiry_interval is None and props.payload_format_indicator is None
                and props.content_type is None and props.response_topic is None and props.correlation_data is None
                and not props.user_properties):
            return topic, {}, 0  # an alias and nothing else: most PUBLISHes of a device using aliases
    if props.payload_format_indicator == 1:
        try:
            packet.payload.decode("utf-8")
        except UnicodeDecodeError:
            # [MQTT-3.3.2-4]'s check: refused in the ack, or, at QoS 0, by closing.
            return Refused(R.PAYLOAD_FORMAT_INVALID, "the payload is not UTF-8, as its format indicator says",
                           packet.qos == 0)
    headers = metadata.to_headers(props)
    if isinstance(headers, str):
        return Refused(R.PROTOCOL_ERROR, headers, True)
    return topic, headers, props.message_expiry_interval or 0
