"""QoS 1 and 2 messages on their way to an MQTT client, and what of them
outlives one connection of a persistent session.

Each message sent with QoS > 0 is an :class:`InFlight` record keyed by its
packet id, moved along by the client's PUBACK / PUBREC / PUBCOMP through one
transition table, as h2 moves a stream's state.  Sans-IO.
"""

from __future__ import annotations

import enum
from typing import Any

from gateway.mqtt.codec import packets

MAX_PACKET_ID = 65535
NO_IDS: frozenset[int] = frozenset()  # shared by the sessions that hold none


class Stage(enum.Enum):
    AWAITING_PUBACK = "awaiting-puback"  # QoS 1 PUBLISH sent
    AWAITING_PUBREC = "awaiting-pubrec"  # QoS 2 PUBLISH sent
    AWAITING_PUBCOMP = "awaiting-pubcomp"  # QoS 2 PUBREL sent: the message is the client's

    # Enum's own __hash__ is Python code, and every ack looks up TRANSITIONS:
    # members are singletons, so identity hashing agrees.
    __hash__ = object.__hash__


# The stage a delivery starts in, by its QoS (0 is not tracked).
FIRST_STAGE = (None, Stage.AWAITING_PUBACK, Stage.AWAITING_PUBREC)


class RefusingPubRec:
    """The TRANSITIONS key of a v5 PUBREC with a reason code of 0x80 or more:
    the client refused the message, and the exchange ends there, with no
    PUBREL [MQTT-4.3.3-4] (not a packet type: a PUBREC's code picks it)."""


# (stage, the client's packet) -> (the next stage, or None: the exchange is
# over; whether the core's message is acknowledged now).  A packet with no
# entry here for its id's stage (a duplicate, one out of order, one for the
# other QoS, or an id not in flight) changes nothing [MQTT-4.3.2, MQTT-4.3.3].
TRANSITIONS: dict[tuple[Stage, type], tuple[Stage | None, bool]] = {
    (Stage.AWAITING_PUBACK, packets.PubAck): (None, True),
    (Stage.AWAITING_PUBREC, packets.PubRec): (Stage.AWAITING_PUBCOMP, True),
    # Acknowledged as a refusing PUBACK is: the client has seen it and said no,
    # so it is not sent again (nor kept in the queue for ever).
    (Stage.AWAITING_PUBREC, RefusingPubRec): (None, True),
    (Stage.AWAITING_PUBCOMP, packets.PubComp): (None, False),
}


class InFlight:
    """One QoS 1/2 message sent and not yet fully acknowledged.  (A slotted
    class, built once per delivery: cheaper than a dataclass.)"""

    __slots__ = ("token", "message_id", "stage")

    def __init__(self, token: Any, message_id: str, stage: Stage) -> None:
        self.token = token  # the session's token for the core subscription
        self.message_id = message_id
        self.stage = stage

    def __repr__(self) -> str:
        return f"InFlight({self.message_id!r}, {self.stage.name})"


class SessionState:
    """What outlives one connection of a persistent session: packet ids in
    flight, so a resend keeps its id [MQTT-4.4.0-1] (in memory), and inbound
    QoS 2 ids not yet released, so a resent PUBLISH is not routed twice (also
    noted in the store, so across a restart too)."""

    __slots__ = ("outbound", "ids_by_message", "inbound_qos2", "_last_id", "owner")

    def __init__(self) -> None:
        # Who may resume it (core.durables.owner_of).  None: restored from an
        # older folder; it holds only packet ids, so its durables decide.
        self.owner: str | None = None
        self.outbound: dict[int, InFlight] = {}
        # Packet ids of messages sent but not acknowledged when the last
        # connection ended, by message id: the resend keeps its id.
        self.ids_by_message: dict[str, int] = {}
        # Made at the first one (most sessions never see QoS 2): see receive_qos2.
        self.inbound_qos2: set[int] | frozenset[int] = NO_IDS
        # The last packet id given; ids go round 1..MAX_PACKET_ID.  (Not an
        # itertools.cycle: that keeps every id it yielded, 2.5 MiB a session.)
        self._last_id = 0

    def receive_qos2(self, packet_id: int) -> None:
        """The client sent a QoS 2 PUBLISH with ``packet_id``: held until its PUBREL."""
        if self.inbound_qos2 is NO_IDS:
            self.inbound_qos2 = set()
        self.inbound_qos2.add(packet_id)  # type: ignore[union-attr]

    def next_packet_id(self) -> int:
        packet_id = self._last_id
        for _ in range(MAX_PACKET_ID):
            packet_id = packet_id % MAX_PACKET_ID + 1
            if packet_id not in self.outbound:
                self._last_id = packet_id
                return packet_id
        raise RuntimeError("no free packet identifier")  # bounded by max_inflight long before

    def advance(self, packet_id: int, kind: type) -> tuple[InFlight, bool] | None:
        """The client sent ``kind`` (PUBACK, PUBREC, PUBCOMP) for ``packet_id``:
        move its record on.  Returns it and whether the core's message is now
        acknowledged, or None if the packet changed nothing."""
        entry = self.outbound.get(packet_id)
        if entry is None:
            return None
        step = TRANSITIONS.get((entry.stage, kind))
        if step is None:
            return None
        stage, acked = step
        if stage is None:
            del self.outbound[packet_id]
        else:
            entry.stage = stage
        return entry, acked

    def suspend(self, owner: str) -> None:
        """The connection ended; the session is kept, as ``owner``'s.  The
        core puts unacked messages back and they come again with DUP and the
        same packet id; PUBRELs awaiting PUBCOMP stay, to be resent as they are."""
        self.owner = owner
        for packet_id, entry in list(self.outbound.items()):
            if entry.stage is not Stage.AWAITING_PUBCOMP:
                self.ids_by_message[entry.message_id] = packet_id
                del self.outbound[packet_id]

    def unanswered_qos2(self) -> set[str]:
        """Ids of the messages sent at QoS 2 and not yet answered with PUBREC:
        from a shared subscription, only this session may have them
        [MQTT-4.8.2-4], [MQTT-4.8.2-5] (core.shared's reservations)."""
        return {entry.message_id for entry in self.outbound.values() if entry.stage is Stage.AWAITING_PUBREC}

    def released(self) -> list[int]:
        """Packet ids whose PUBREL awaits its PUBCOMP (resent on resume)."""
        return [packet_id for packet_id, entry in self.outbound.items() if entry.stage is Stage.AWAITING_PUBCOMP]
