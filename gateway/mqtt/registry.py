"""The broker's MQTT sessions: who is connected under which client id (for
take-over), and the persistent sessions kept between connections, counted
by owner so one user cannot grow the broker without bound, and when a kept
MQTT 5 session ends and a delayed will is due (gateway.mqtt.lifetime)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from core.authorization import Principal
from core.broker import Broker
from core.clients import Client
from core.durables import ANONYMOUS_OWNER, MQTT_PREFIX, claim_refusal, owner_of
from core.tally import Tally
from gateway.mqtt.inflight import SessionState
from gateway.mqtt.lifetime import CLOSED, EXPIRY_NOTES, NEVER, OPEN, Lifetimes, expiry_note, read_note, release_will

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
        # The same for MQTT 5: the last message's own property items.
        self.last_v5_message: object = None
        self.last_v5_items = b""
        # MQTT 5 messages not sent for being over their subscriber's Maximum
        # Packet Size [MQTT-3.1.2-25], all connections since start (a metric).
        self.oversize_dropped = 0
        self.lifetimes = Lifetimes()  # when kept v5 sessions end, and delayed wills

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

    def restore_lifetimes(self, broker: Broker, notes: dict[str, bytes], log: Any) -> None:
        """The ends the store noted (``EXPIRY_NOTES``) of v5 sessions kept
        before a restart: what is overdue ends now, before anyone connects;
        the rest is scheduled.  A session whose connection was open when the
        process stopped ends its interval after this start, noted so (a
        deadline from now on: restarts cannot put it off for ever).  A kept
        session is present on resuming even if it held nothing else."""
        now_ms = broker.clock.wall_ms()
        for client_id, value in notes.items():
            read = read_note(value, now_ms)
            if read is None:
                broker.store.note(EXPIRY_NOTES, client_id, None)
                continue
            due, owner = read
            if value.startswith(OPEN.encode()):
                broker.store.note(EXPIRY_NOTES, client_id, expiry_note(CLOSED, due, owner))
            self.lifetimes.noted.add(client_id)
            state = self.states.setdefault(client_id, SessionState())
            if state.owner is None:
                state.owner = owner
            self.hold(client_id, state.owner)
            self.lifetimes.end_at(client_id, due)
        self.expire_due(broker, now_ms, log)

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

    def connected(self, broker: Broker, client_id: str, clean_start: bool, expiry_s: int, owner: str, log: Any) -> None:
        """``client_id`` connected (what it took over already closed): its
        kept session's end is called off, and its pending will (published
        now if Clean Start ends that session [MQTT-3.1.3-9]); the store
        notes ``expiry_s`` (0 for a session not kept) until the connection ends."""
        pending = self.lifetimes.resume(client_id)
        if pending is not None and clean_start:
            release_will(broker, client_id, pending, broker.clock.wall_ms(), log, delayed=True)
        value = expiry_note(OPEN, expiry_s, owner) if 0 < expiry_s < NEVER else None
        if value is not None or client_id in self.lifetimes.noted:
            broker.store.note(EXPIRY_NOTES, client_id, value)
            (self.lifetimes.noted.add if value is not None else self.lifetimes.noted.discard)(client_id)

    def ends_with_connection(self, broker: Broker, client_id: str, owner: str) -> int:
        """A kept session resumed by a connection whose Session Expiry
        Interval is 0: it ends when the connection does, and, noted so, at
        the next start if the broker dies first [MQTT-3.1.2-23].  Returns the
        note's LSN: the CONNACK waits for it, so a crash after the client
        was told cannot keep the session."""
        self.lifetimes.noted.add(client_id)
        return broker.store.note(EXPIRY_NOTES, client_id, expiry_note(OPEN, 0, owner))

    def kept(self, broker: Broker, client_id: str, expiry_s: int, owner: str) -> None:
        """``client_id``'s connection ended; its session is kept ``expiry_s``
        seconds (``NEVER``: for ever), noted in the store so a restart keeps
        the deadline."""
        if expiry_s >= NEVER:  # (a DISCONNECT may have made it so: the note from CONNECT goes)
            if client_id in self.lifetimes.noted:
                self.lifetimes.noted.discard(client_id)
                broker.store.note(EXPIRY_NOTES, client_id, None)
            return
        due = broker.clock.wall_ms() + expiry_s * 1000
        self.lifetimes.end_at(client_id, due)
        broker.store.note(EXPIRY_NOTES, client_id, expiry_note(CLOSED, due, owner))
        self.lifetimes.noted.add(client_id)

    def end(self, broker: Broker, client_id: str, qos2_ids: Iterable[int] = ()) -> int:
        """``client_id``'s kept session ends (none of it is connected): its
        durable subscriptions and what they collected, its shared
        memberships, its QoS 2 ids (``qos2_ids`` if no state was kept), its
        place.  Returns the LSN of the removals."""
        owner = OWNER_PREFIX + client_id
        lsn = 0
        for durable in broker.durables.of_client(owner):
            if durable.active is None:
                lsn = max(lsn, broker.remove_durable(durable.key))
        for membership in broker.shared.of_client(owner):
            if membership.active is None:
                lsn = max(lsn, broker.shared.drop_member(membership))
        saved = self.states.pop(client_id, None)
        for packet_id in saved.inbound_qos2 if saved is not None else qos2_ids:
            lsn = max(lsn, broker.store.note(QOS2_NOTES, qos2_note(client_id, packet_id), None))
        self.lifetimes.ends.pop(client_id, None)
        if client_id in self.lifetimes.noted:
            self.lifetimes.noted.discard(client_id)
            lsn = max(lsn, broker.store.note(EXPIRY_NOTES, client_id, None))
        self.release(client_id)
        return lsn

    def expire_due(self, broker: Broker, now_ms: int, log: Any) -> None:
        """End the kept sessions and publish the wills due by ``now_ms``."""
        for client_id, ends, pending in self.lifetimes.pop_due(now_ms):
            if pending is not None:
                release_will(broker, client_id, pending, broker.clock.wall_ms(), log, delayed=True)
            if ends and client_id not in self.active:  # (a reconnect calls the end off first)
                self.end(broker, client_id)
                log.info("mqtt_session_expired", client_id=client_id)

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
