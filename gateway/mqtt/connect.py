"""CONNECT: who the client is, which session it gets, and the CONNACK.

A plain function of (session, packet), the connecting row of the session's
transition table, split from the session because it is the one packet that
decides everything after it: the login (through the same gate as STOMP's),
the client id's owner and take-over, a clean or kept session, and resuming
what a kept session holds (its durable subscriptions, its QoS 2 ids).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol

from core.authorization import Principal
from core.broker import Broker
from core.clients import Client
from core.durables import owner_of
from core.ports import Clock
from core.tally import holder_of
from gateway.auth import AccessDenied, VerificationPending, spent_door
from gateway.mqtt.codec import packets
from gateway.mqtt.codec import MqttConnection
from gateway.mqtt.outgoing import fitted
from gateway.mqtt.peer import Peer, connack_properties, negotiate
from gateway.mqtt.codec.reasons import ReasonCode as R
from gateway.mqtt.inflight import SessionState
from gateway.mqtt.lifetime import prepare_will, release_will, will_bytes, will_delay, will_refusal
from gateway.mqtt.registry import OWNER_PREFIX, QOS2_NOTES, QUOTA, Registry, qos2_note
from gateway.mqtt.settings import MqttSettings
from gateway.mqtt.subscribing import Token, resume
from gateway.mqtt.codec.wire import MQTT5, MQTT31
from gateway.session.outbox import Outbox
from gateway.session.skeleton import Skeleton


class Connecting(Protocol):
    """What CONNECT reads and sets of its session (gateway.mqtt.session),
    named here so this module need not import the one that imports it."""

    broker: Broker
    clock: Clock
    settings: MqttSettings
    registry: Registry
    log: Any
    admit: Callable[[str | None, str | None], Principal]
    source: str | None
    codec: MqttConnection
    skeleton: Skeleton
    outbox: Outbox
    client: Client | None
    client_id: str
    clean_session: bool
    session: SessionState
    will: packets.Will | None

    peer: Peer | None
    window: int
    subs: dict[str, Token]

    def refuse(self, code: int, reason: str, v5_code: int | None = None) -> None: ...

    def fail(self, reason: str, packet: Any = None, code: int | None = None) -> None: ...




def server_codec(settings: MqttSettings) -> MqttConnection:
    """A new connection's codec, with the limits it has until its CONNECT is
    accepted: a socket that has not logged in may send a packet of
    ``preconnect_max_packet_bytes`` holding ``preconnect_max_properties``
    (on_connect raises both once it is in)."""
    return MqttConnection(max_packet_bytes=settings.preconnect_max_packet_bytes,
                          max_properties=settings.preconnect_max_properties,
                          max_user_property_bytes=settings.preconnect_max_user_property_bytes,
                          max_topic_filters=settings.max_topic_filters)

def on_connect(session: Connecting, packet: packets.Connect) -> None:
    settings = session.settings
    peer = None
    if session.codec.protocol_level == MQTT5:
        peer = session.peer = negotiate(packet.properties, packet.keep_alive, settings)
        if packet.properties is not None and packet.properties.authentication_method is not None:
            # No enhanced authentication method is offered: user name and password only.
            session.refuse(packets.NOT_AUTHORIZED, "no authentication method is supported but user name and password",
                           R.BAD_AUTHENTICATION_METHOD)  # [MQTT-4.12.0-1]
            return
    principal = _admitted(session, packet)
    if principal is None:
        return
    # Kept after this connection: 3.1.1's clean session 0, v5's Session
    # Expiry Interval over 0 [MQTT-3.1.2-23].  Clean Start (3.1.1's same bit)
    # says only whether what was kept before is discarded now.
    keep = peer.session_expiry > 0 if peer is not None else not packet.clean_session
    client_id = packet.client_id
    assigned = None
    if not client_id:
        if peer is None and not packet.clean_session:
            session.refuse(packets.IDENTIFIER_REJECTED, "an empty client id needs clean session")  # [MQTT-3.1.3-8]
            return
        if packet.protocol_level == MQTT31:
            # 3.1 has no assigned ids: its client id is 1 to 23 characters (3.1 §3.1, "Client Identifier").
            session.refuse(packets.IDENTIFIER_REJECTED, "MQTT 3.1 needs a client id")
            return
        client_id = assigned = f"gw-{os.urandom(6).hex()}"  # [MQTT-3.1.3-6]
    refusal = _claim_refusal(session, client_id, principal, not keep)
    if refusal is not None:  # checked before anything is taken over or cleaned
        session.refuse(packets.NOT_AUTHORIZED, f"user {principal.name!r} may not use client id {client_id[:80]!r}: {refusal}",
                       R.QUOTA_EXCEEDED if refusal.startswith(QUOTA) else R.NOT_AUTHORIZED)
        return
    registry = session.registry
    if peer is not None and keep and packet.will is not None and will_delay(packet.will):
        # Told now, while the client can hear it, if its will could not wait.
        refusal = will_refusal(registry.lifetimes, holder_of(principal, session.source), will_bytes(packet.will),
                               settings, client_id)
        if refusal is not None:
            session.refuse(packets.SERVER_UNAVAILABLE, f"its delayed will cannot be kept: {refusal}", R.QUOTA_EXCEEDED)
            return
    previous = registry.active.get(client_id)
    if previous is not None:  # first: its close may keep or end what this connection then finds
        previous.close("session taken over by a new connection", R.SESSION_TAKEN_OVER)  # [MQTT-3.1.4-2]
    owner = owner_of(principal)
    registry.connected(session.broker, client_id, packet.clean_session, peer.session_expiry if keep and peer else 0,
                       owner, session.log)
    if packet.clean_session:
        registry.release(client_id)  # [MQTT-3.1.2-6]: whatever was kept goes
    if keep:
        registry.hold(client_id, owner)
    session.client_id = client_id
    session.clean_session = not keep
    session.will = packet.will
    keep_alive = packet.keep_alive if peer is None else peer.keep_alive
    session.skeleton.silence.limit_s = keep_alive * settings.keepalive_grace  # [MQTT-3.1.2-24]
    session.codec.max_packet_bytes = settings.max_packet_bytes
    session.codec.max_properties = settings.max_properties
    session.codec.max_user_property_bytes = settings.max_user_property_bytes
    if peer is not None:
        session.window = min(settings.max_inflight, peer.receive_maximum)  # [MQTT-3.3.4-9]
    client = session.client = session.broker.open_client(session, client_id=client_id, principal=principal,
                                                         source=session.source)
    registry.active[client_id] = session
    session.skeleton.connected(client)
    _resume(session, packet, assigned)


def _admitted(session: Connecting, packet: packets.Connect) -> Principal | None:
    """The user the login names, or None when CONNECT was answered (refused)
    or put off (the password check runs elsewhere and handles it again)."""
    password = packet.password.decode("utf-8", "replace") if packet.password is not None else None
    try:
        principal = session.admit(packet.username, password)
    except VerificationPending as pending:
        if pending.start(session.skeleton.gate.release):
            session.skeleton.defer(packet)
        else:
            session.refuse(packets.SERVER_UNAVAILABLE, "the broker is busy checking logins")
        return None
    except AccessDenied as exc:
        session.log.warning("login_refused", login=(packet.username or "")[:80], kind=exc.kind, reason=exc.reason)
        if exc.kind == "unavailable":
            code = packets.SERVER_UNAVAILABLE
        elif exc.kind == "credentials" and packet.username is not None:
            code = packets.BAD_USERNAME_OR_PASSWORD
        else:
            code = packets.NOT_AUTHORIZED
        session.refuse(code, exc.reason)
        return None
    session.admit = spent_door  # asked once: let go of what it knew of the transport
    return principal


def _claim_refusal(session: Connecting, client_id: str, principal: Principal, clean: bool) -> str | None:
    """Why ``principal`` may not take ``client_id`` (its owner's, or over quota)."""
    registry = session.registry
    broker = session.broker
    held = [*broker.durables.of_client(OWNER_PREFIX + client_id), *broker.shared.of_client(OWNER_PREFIX + client_id)]
    owners = [kept.owner for kept in held]
    refusal = registry.claim_refusal(client_id, principal, clean, owners, broker.secured)
    if refusal is None and not clean:
        settings = session.settings
        refusal = registry.quota_refusal(client_id, owner_of(principal), settings.max_persistent_sessions_per_user,
                                         settings.max_persistent_sessions)
    return refusal


def _resume(session: Connecting, packet: packets.Connect, assigned: str | None) -> None:
    """Answer CONNACK, then pick up what the session kept: PUBRELs owed, and
    its durable subscriptions with what they collected while it was away."""
    client = session.client
    assert client is not None
    client_id = session.client_id
    owner = OWNER_PREFIX + client_id
    durables = [d for d in session.broker.durables.of_client(owner) if d.active is None]
    memberships = [m for m in session.broker.shared.of_client(owner) if m.active is None]
    saved = session.registry.states.pop(client_id, None)
    lsn = 0
    if packet.clean_session:
        for durable in durables:  # [MQTT-3.1.2-6]: a clean session starts from nothing
            lsn = client.remove_durable(owner, durable.name)
        for membership in memberships:
            lsn = max(lsn, client.drop_shared(owner, membership.name))  # type: ignore[arg-type]
        for packet_id in saved.inbound_qos2 if saved is not None else ():
            lsn = max(lsn, session.broker.store.note(QOS2_NOTES, qos2_note(client_id, packet_id), None))
        durables = []
        memberships = []
        present = False
    else:
        present = bool(durables) or bool(memberships) or saved is not None  # [MQTT-3.2.2-2]
        if saved is not None:
            session.session = saved
        if present and session.clean_session:
            # A v5 session resumed but not to be kept: its durable queues
            # are taken up (their backlog is owed) and removed at the close.
            session.clean_session = False
            lsn = session.registry.ends_with_connection(session.broker, client_id, owner_of(client.principal))
    peer = session.peer
    if peer is None:
        connack = packets.ConnAck(present, packets.ACCEPTED)
    else:
        props = packet.properties
        asked = props.session_expiry_interval or 0 if props is not None else 0
        connack = packets.ConnAck(present, packets.ACCEPTED, connack_properties(
            peer, session.settings, requested_expiry=asked, requested_keep_alive=packet.keep_alive,
            assigned_client_id=assigned))
    data = session.codec.send(connack) if peer is None else fitted(peer, session.codec.send, connack)
    if data is None:
        # Not even what the client must know fits its Maximum Packet Size: no
        # CONNACK may be sent [MQTT-3.1.2-24], so the connection ends, willless
        # (the client never learnt it was connected).
        session.will = None
        limit = peer.maximum_packet_size  # type: ignore[union-attr]  # (None: a 3.1.1 CONNACK always fits)
        session.fail(f"the CONNACK does not fit the client's Maximum Packet Size of {limit}", packet, None)
        return
    session.outbox.append(data, lsn)
    session.log.info("mqtt_connected", client_id=client_id, clean_session=packet.clean_session,
                     keep_alive=packet.keep_alive, session_present=present)
    for packet_id in session.session.released():
        session.outbox.append(session.codec.send(packets.PubRel(packet_id)))
    dropped = 0
    for durable in durables:
        dropped += durable.queue.stats.discarded
        durable.queue.stats.discarded = 0
    names = [durable.name for durable in durables] + [membership.name for membership in memberships]
    resume(session, names, session.log.info)  # type: ignore[arg-type]
    if dropped:
        session.log.warning("mqtt_session_overflow", client_id=client_id, dropped=dropped,
                            limit=session.settings.max_queued_messages)


def connection_closed(session: Connecting, will: packets.Will | None) -> None:
    """The connection is gone (its client still open): the will, now or
    after its Will Delay Interval; then the session kept (ending after its
    Session Expiry Interval) or ended."""
    client = session.client
    assert client is not None
    peer = session.peer
    registry = session.registry
    # The session ends with this connection: a clean one, or a resumed v5 one whose interval is 0.
    ends = session.clean_session or (peer is not None and peer.session_expiry == 0)
    if will is not None:
        pending = prepare_will(session.broker, client, will)
        delay = will_delay(will) if peer is not None and not ends else 0
        refusal = None
        if delay and not isinstance(pending, str):
            refusal = will_refusal(registry.lifetimes, pending.holder, pending.nbytes, session.settings)
        if isinstance(pending, str):
            session.log.warning("mqtt_will_refused", client_id=session.client_id, topic=will.topic[:200], reason=pending)
        elif refusal is not None:  # its share filled since CONNECT: said now rather than held past the bound
            session.log.warning("mqtt_will_not_delayed", client_id=session.client_id, topic=will.topic[:200],
                                reason=refusal)
            release_will(session.broker, session.client_id, pending, session.clock.wall_ms(), session.log, client)
        elif delay:  # [MQTT-3.1.3-9]: unless the client id connects first
            registry.lifetimes.will_at(session.client_id, session.clock.wall_ms() + delay * 1000, pending)
        else:
            release_will(session.broker, session.client_id, pending, session.clock.wall_ms(), session.log, client)
    client.close(reserve=session.session.unanswered_qos2())
    if session.clean_session:
        registry.states.pop(session.client_id, None)
        return
    if ends:
        end_session(session)  # resumed, but not to be kept past this connection
        return
    owner = owner_of(client.principal)
    session.session.suspend(owner)
    registry.states[session.client_id] = session.session
    if peer is not None:
        registry.kept(session.broker, session.client_id, peer.session_expiry, owner)


def end_session(session: Connecting) -> None:
    """A resumed v5 session whose Session Expiry Interval is 0 ends with its
    connection: what it kept goes (its durable subscriptions, its shared
    memberships, its QoS 2 ids)."""
    session.registry.end(session.broker, session.client_id, session.session.inbound_qos2)
