"""What an MQTT 5 connection agreed at CONNECT (v5 §3.1.2.11, §3.2.2.3): the
client's limits on what the server sends it, the server's on what it may
send, and how much the client wants to be told.  A 3.1.1 connection has none
of this (its session's ``peer`` is None), so its hot path never looks.
Sans-IO.
"""

from __future__ import annotations

from collections import deque

from gateway.mqtt.aliases import InboundAliases, OutboundAliases
from gateway.mqtt.codec.packets import Properties
from gateway.mqtt.settings import MqttSettings

NEVER = 0xFFFFFFFF  # a Session Expiry Interval that never expires (v5 §3.1.2.11.2)
UNLIMITED = 268_435_455 + 5  # the largest packet MQTT can frame


class Peer:
    """One v5 connection's negotiated limits (built by :func:`negotiate`)."""

    __slots__ = ("receive_maximum", "maximum_packet_size", "aliases_in", "aliases_out", "problem_information",
                 "session_expiry", "keep_alive", "oversize_dropped", "held_acks")

    def __init__(self, receive_maximum: int, maximum_packet_size: int, aliases_in: InboundAliases,
                 aliases_out: OutboundAliases, problem_information: bool, session_expiry: int, keep_alive: int) -> None:
        # QoS 1/2 PUBLISHes the client takes unacknowledged at once [MQTT-3.3.4-9].
        self.receive_maximum = receive_maximum
        # The largest packet the client takes; a larger message is not sent [MQTT-3.1.2-25].
        self.maximum_packet_size = maximum_packet_size
        self.aliases_in = aliases_in
        self.aliases_out = aliases_out
        # False: no Reason String or User Property on anything but PUBLISH,
        # CONNACK and DISCONNECT [MQTT-3.1.2-29].
        self.problem_information = problem_information
        self.session_expiry = session_expiry  # seconds; 0: the session ends with the connection
        self.keep_alive = keep_alive  # what the server holds the client to (its own, or Server Keep Alive)
        self.oversize_dropped = 0  # messages too large for the client, not sent
        # The LSNs the PUBACKs held for the disk wait for, oldest first: with
        # the QoS 2 ids awaiting PUBREL, what counts against Receive Maximum.
        self.held_acks: deque[int] = deque()


def negotiate(properties: Properties | None, keep_alive: int, settings: MqttSettings) -> Peer:
    """The limits of a v5 CONNECT with these properties (the codec checked
    their values: no Receive Maximum or Maximum Packet Size of 0)."""
    props = properties if properties is not None else _NONE
    receive_maximum = props.receive_maximum or 65535  # absent: 65,535 (v5 §3.1.2.11.3)
    maximum_packet_size = props.maximum_packet_size or UNLIMITED
    session_expiry = props.session_expiry_interval or 0
    if settings.max_session_expiry_s < session_expiry:
        session_expiry = settings.max_session_expiry_s
    if settings.max_keep_alive_s and (keep_alive == 0 or keep_alive > settings.max_keep_alive_s):
        keep_alive = settings.max_keep_alive_s
    return Peer(
        receive_maximum=receive_maximum,
        maximum_packet_size=maximum_packet_size,
        aliases_in=InboundAliases(settings.topic_alias_maximum),
        aliases_out=OutboundAliases(props.topic_alias_maximum or 0),  # absent: none [MQTT-3.1.2-27]
        problem_information=props.request_problem_information != 0,  # absent: 1
        session_expiry=session_expiry,
        keep_alive=keep_alive,
    )


def connack_properties(peer: Peer, settings: MqttSettings, *, requested_expiry: int, requested_keep_alive: int,
                       assigned_client_id: str | None) -> Properties:
    """What the CONNACK tells the client (v5 §3.2.2.3): the server's limits,
    always; a Session Expiry Interval and Server Keep Alive only where the
    server changed what the client asked; the client id it made up."""
    props = Properties(
        receive_maximum=settings.receive_maximum,
        maximum_packet_size=whole_packet_limit(settings.max_packet_bytes),
        topic_alias_maximum=settings.topic_alias_maximum,
        retain_available=1,
        wildcard_subscription_available=1,
        subscription_identifier_available=1,
        shared_subscription_available=1,
    )
    if peer.session_expiry != requested_expiry:
        props.session_expiry_interval = peer.session_expiry  # the server's value applies (v5 §3.2.2.3.2)
    if peer.keep_alive != requested_keep_alive:
        props.server_keep_alive = peer.keep_alive  # [MQTT-3.2.2-21]
    if assigned_client_id is not None:
        props.assigned_client_identifier = assigned_client_id  # [MQTT-3.2.2-16]
    return props


def whole_packet_limit(max_remaining: int) -> int:
    """The Maximum Packet Size to announce for a limit on the remaining length
    (what the codec checks): v5's counts the whole packet [MQTT-3.2.2-15], the
    fixed header's first byte and the remaining length's own bytes too."""
    length_bytes = 1 if max_remaining < 128 else 2 if max_remaining < 16_384 else 3 if max_remaining < 2_097_152 else 4
    return max_remaining + 1 + length_bytes


_NONE = Properties()
