"""An MQTT listener's settings (the config file's [mqtt] table)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class MqttSettings:
    max_packet_bytes: int = 4 * 1024 * 1024
    # Until CONNECT succeeds a peer is unknown: it gets a tighter limit.
    preconnect_max_packet_bytes: int = 64 * 1024
    # MQTT 5: what one packet's properties may hold, property items (repeats
    # counted) and bytes of User Property names and values; one more and the
    # packet is refused with 0x95 (DISCONNECT; CONNACK for a CONNECT).  Each
    # item and byte costs the loop (parsed, turned into headers, journaled,
    # delivered), so a packet's cost is bounded by these, not by its size.
    # Peers allow less: Alibaba IoT 20 user properties, ApsaraMQ 8 KB of them.
    max_properties: int = 1024
    max_user_property_bytes: int = 64 * 1024
    # ... and for a CONNECT (its will's properties included), whose sender
    # is not known yet, as STOMP's preconnect limits.
    preconnect_max_properties: int = 64
    preconnect_max_user_property_bytes: int = 8 * 1024
    # Topic filters in one SUBSCRIBE or UNSUBSCRIBE (each is a subscription
    # made or refused, a code answered): one more closes the connection (v5:
    # DISCONNECT 0x95), before the rest is read.
    max_topic_filters: int = 1024
    connect_timeout_s: float = 10.0
    # A client silent for keep-alive times this is dropped [MQTT-3.1.2-24].
    keepalive_grace: float = 1.5
    # QoS 1/2 messages on their way to a client, unacknowledged, at most.
    max_inflight: int = 32
    # What a persistent session may hold; past it the oldest are dropped, counted.
    max_queued_messages: int = 1000
    # Persistent sessions (clean session 0) kept for one logged-in user, and
    # for all clients together: each is state kept until cleaned, so a client
    # cycling through client ids must not grow the broker without bound.  One
    # more gets CONNACK 0x05 (0 = no limit).  Anonymous clients of an open
    # broker have only the broker-wide bound (they are a whole fleet).
    max_persistent_sessions_per_user: int = 1000
    max_persistent_sessions: int = 100_000
    # MQTT 5 wills with a Will Delay Interval wait in memory after their
    # connection ends: per holder (a logged-in user; anonymous clients: per
    # source address) at most this many and these bytes (payload, topic and
    # kept properties), and all together at most these.  A CONNECT whose
    # delayed will has no room gets CONNACK 0x97; one whose room went by the
    # time its connection ends has its will published at once (0 = no limit).
    max_delayed_wills_per_user: int = 1000
    max_delayed_will_bytes_per_user: int = 4 * 1024 * 1024
    max_delayed_wills: int = 100_000
    max_delayed_will_bytes: int = 256 * 1024 * 1024
    outbox_high_water_bytes: int = 1024 * 1024
    # MQTT 5 (announced in CONNACK).  QoS 1/2 PUBLISHes a client may have
    # unacknowledged towards the broker; one more is answered with DISCONNECT
    # 0x93.  The acks wait for the disk, so this bounds what one client holds
    # back in the outbox.
    receive_maximum: int = 1024
    # Topic aliases a client may set on one connection.
    topic_alias_maximum: int = 64
    # The longest a v5 session is kept after its connection ends (seconds);
    # a client asking more is told this one.  0xFFFFFFFF: as long as asked.
    max_session_expiry_s: int = 0xFFFFFFFF
    # The longest keep-alive a client may choose (seconds; 0: any); a client
    # asking more, or none, is told this one (Server Keep Alive, v5 only).
    max_keep_alive_s: int = 0

    def __post_init__(self) -> None:
        for name in ("max_delayed_wills_per_user", "max_delayed_will_bytes_per_user", "max_delayed_wills",
                     "max_delayed_will_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"mqtt.{name} must be >= 0 (0: no limit), not {getattr(self, name)}")
        for name in ("max_properties", "max_user_property_bytes", "preconnect_max_properties",
                     "preconnect_max_user_property_bytes", "max_topic_filters"):
            if getattr(self, name) < 1:
                raise ValueError(f"mqtt.{name} must be at least 1, not {getattr(self, name)}")
