"""The broker's MQTT sessions: who is connected under which client id (for
take-over), and the persistent sessions kept between connections, counted
by owner so one user cannot grow the broker without bound."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from core.authorization import Principal
from core.clients import Client
from core.durables import ANONYMOUS_OWNER, MQTT_PREFIX, claim_refusal, owner_of
from core.tally import Tally
from gateway.mqtt.inflight import SessionState

# Durable subscriptions of MQTT sessions live beside STOMP's, under this owner
# prefix (reserved: no STOMP client-id may start with it), named
# "<granted qos>:<filter>".
OWNER_PREFIX = MQTT_PREFIX
# The store's namespace for a persistent session's inbound QoS 2 packet ids
# between PUBREC and PUBREL: kept on disk, so a PUBLISH resent after a broker
# restart is still recognised and not routed twice [MQTT-4.3.3-2].  The note's
# value names the session's owner after this mark (empty in older folders).
QOS2_NOTES = "mqtt-qos2"
OWNER_MARK = b"owner:"
QUOTA = "too many persistent sessions"  # how a quota refusal starts (MQTT 5 answers it with 0x97)


class Connected(Protocol):
    """A connected MQTT session, as the registry sees it."""

    client: Client | None

    def close(self, reason: str, code: int | None = None) -> None: ...


class Registry:
    """Connected MQTT sessions by client id (for take-over) and the state of
    persistent sessions between connections.  One per broker."""

    def __init__(self) -> None:
        self.active: dict[str, Connected] = {}
        self.states: dict[str, SessionState] = {}
        # Every persistent session the broker keeps, connected or away: client
        # id -> owner (None: stored before owners were), counted by owner.
        self.persistent: dict[str, str | None] = {}
        self.by_owner: Tally[str | None] = Tally()  # the same count the core keeps of durables
        # The last QoS 0 PUBLISH encoded for a delivery, and its message: a
        # topic fans one message out to every subscriber in a row, and the
        # QoS 0 packet is the same for each (the message's topic, body and
        # retain flag).  One entry; the reference keeps that one message alive.
        self.last_message: object = None
        self.last_qos0 = b""
        # MQTT 5 messages not sent for being over their subscriber's Maximum
        # Packet Size [MQTT-3.1.2-25], all connections since start (a metric).
        self.oversize_dropped = 0

    def restore(self, notes: dict[str, bytes], durables: Iterable[tuple[str, str | None]] = ()) -> None:
        """Inbound QoS 2 ids the store kept (``QOS2_NOTES``) from before a
        restart, and the sessions the core's durables (client id with the
        ``OWNER_PREFIX``, owner) show: both are persistent sessions kept."""
        for key, value in notes.items():
            client_id, _, packet_id = key.rpartition("\x00")
            if client_id and packet_id.isdigit():
                state = self.states.setdefault(client_id, SessionState())
                state.receive_qos2(int(packet_id))
                if value.startswith(OWNER_MARK):
                    state.owner = value[len(OWNER_MARK) :].decode("utf-8", "replace")
        for client_id, state in self.states.items():
            self.hold(client_id, state.owner)
        for client_id, owner in durables:
            if client_id.startswith(OWNER_PREFIX):
                self.hold(client_id[len(OWNER_PREFIX) :], owner)

    def hold(self, client_id: str, owner: str | None) -> None:
        """``client_id``'s session is kept, as ``owner``'s."""
        if client_id in self.persistent:
            if self.persistent[client_id] == owner:
                return
            self.release(client_id)
        self.persistent[client_id] = owner
        self.by_owner.add(owner)

    def release(self, client_id: str) -> None:
        """``client_id``'s session is gone (a clean session replaced it)."""
        if client_id in self.persistent:
            self.by_owner.remove(self.persistent.pop(client_id))

    def claim_refusal(
        self, client_id: str, principal: Principal, clean_session: bool, durable_owners: list[str | None], secured: bool
    ) -> str | None:
        """Why ``principal`` may not connect as ``client_id``: a session in
        use or kept (its durables, whose ``durable_owners`` the caller
        gives, its packet ids) belongs to the user that made it; taking it
        over, resuming it or cleaning it away is theirs alone.  A persistent
        session is durable state (core.durables.claim_refusal)."""
        previous = self.active.get(client_id)
        if previous is not None and previous.client is not None:
            if owner_of(previous.client.principal) != owner_of(principal):
                return "it is in use by another user"
        owners = list(durable_owners)
        saved = self.states.get(client_id)
        if saved is not None and saved.owner is not None:
            owners.append(saved.owner)
        if not clean_session:
            owners.append(owner_of(principal))  # anonymous may not keep one on a secured broker
        for owner in owners:
            reason = claim_refusal(owner, principal, secured)
            if reason is not None:
                return reason
        return None

    def quota_refusal(self, client_id: str, owner: str, limit: int, total: int) -> str | None:
        """Why one more persistent session, ``client_id`` of ``owner``, may
        not be kept (``limit`` per user, ``total`` for all; 0 = none); None if
        it may (resuming one kept already always may)."""
        if client_id in self.persistent:
            return None
        if limit and owner != ANONYMOUS_OWNER and self.by_owner[owner] >= limit:
            return f"{QUOTA} for user {owner!r} (limit {limit})"
        if total and len(self.persistent) >= total:
            return f"{QUOTA} on the broker (limit {total})"
        return None


def qos2_note(client_id: str, packet_id: int) -> str:
    return f"{client_id}\x00{packet_id}"
