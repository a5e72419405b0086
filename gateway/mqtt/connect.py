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
from gateway.auth import AccessDenied, VerificationPending, spent_door
from gateway.mqtt import packets
from gateway.mqtt.codec import MqttConnection
from gateway.mqtt.inflight import SessionState
from gateway.mqtt.registry import OWNER_PREFIX, QOS2_NOTES, Registry, qos2_note
from gateway.mqtt.settings import MqttSettings
from gateway.session.outbox import Outbox
from gateway.session.skeleton import Skeleton


class Connecting(Protocol):
    """What CONNECT reads and sets of its session (gateway.mqtt.session),
    named here so this module need not import the one that imports it."""

    broker: Broker
    settings: MqttSettings
    registry: Registry
    log: Any
    admit: Callable[[str | None, str | None], Principal]
    codec: MqttConnection
    skeleton: Skeleton
    outbox: Outbox
    client: Client | None
    client_id: str
    clean_session: bool
    session: SessionState
    will: packets.Will | None

    def refuse(self, code: int, reason: str) -> None: ...

    def subscribe(self, topic_filter: str, qos: int) -> object: ...



def on_connect(session: Connecting, packet: packets.Connect) -> None:
    principal = _admitted(session, packet)
    if principal is None:
        return
    client_id = packet.client_id
    if not client_id:
        if not packet.clean_session:
            session.refuse(packets.IDENTIFIER_REJECTED, "an empty client id needs clean session")  # [MQTT-3.1.3-8]
            return
        client_id = f"gw-{os.urandom(6).hex()}"  # [MQTT-3.1.3-6]
    refusal = _claim_refusal(session, client_id, principal, packet.clean_session)
    if refusal is not None:  # checked before anything is taken over or cleaned
        session.refuse(packets.NOT_AUTHORIZED, f"user {principal.name!r} may not use client id {client_id[:80]!r}: {refusal}")
        return
    registry = session.registry
    if packet.clean_session:
        registry.release(client_id)  # [MQTT-3.1.2-6]: whatever was kept goes
    else:
        registry.hold(client_id, owner_of(principal))
    previous = registry.active.get(client_id)
    if previous is not None:
        previous.close("session taken over by a new connection")  # [MQTT-3.1.4-2]
    session.client_id = client_id
    session.clean_session = packet.clean_session
    session.will = packet.will
    session.skeleton.silence.limit_s = packet.keep_alive * session.settings.keepalive_grace  # [MQTT-3.1.2-24]
    session.codec.max_packet_bytes = session.settings.max_packet_bytes
    client = session.client = session.broker.open_client(session, client_id=client_id, principal=principal)
    registry.active[client_id] = session
    session.skeleton.connected(client)
    _resume(session, packet)


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
    owners = [d.owner for d in broker.durables.of_client(OWNER_PREFIX + client_id)]
    refusal = registry.claim_refusal(client_id, principal, clean, owners, broker.secured)
    if refusal is None and not clean:
        settings = session.settings
        refusal = registry.quota_refusal(client_id, owner_of(principal), settings.max_persistent_sessions_per_user,
                                         settings.max_persistent_sessions)
    return refusal


def _resume(session: Connecting, packet: packets.Connect) -> None:
    """Answer CONNACK, then pick up what the session kept: PUBRELs owed, and
    its durable subscriptions with what they collected while it was away."""
    client = session.client
    assert client is not None
    client_id = session.client_id
    owner = OWNER_PREFIX + client_id
    durables = [d for d in session.broker.durables.of_client(owner) if d.active is None]
    saved = session.registry.states.pop(client_id, None)
    lsn = 0
    if packet.clean_session:
        for durable in durables:  # [MQTT-3.1.2-6]: a clean session starts from nothing
            lsn = client.remove_durable(owner, durable.name)
        for packet_id in saved.inbound_qos2 if saved is not None else ():
            lsn = max(lsn, session.broker.store.note(QOS2_NOTES, qos2_note(client_id, packet_id), None))
        durables = []
        present = False
    else:
        present = bool(durables) or saved is not None  # [MQTT-3.2.2-2]
        if saved is not None:
            session.session = saved
    session.outbox.append(session.codec.send(packets.ConnAck(present, packets.ACCEPTED)), lsn)
    session.log.info("mqtt_connected", client_id=client_id, clean_session=packet.clean_session,
                     keep_alive=packet.keep_alive, session_present=present)
    for packet_id in session.session.released():
        session.outbox.append(session.codec.send(packets.PubRel(packet_id)))
    dropped = 0
    for durable in durables:
        qos_text, _, topic_filter = durable.name.partition(":")
        dropped += durable.queue.stats.discarded
        durable.queue.stats.discarded = 0
        refusal = session.subscribe(topic_filter, int(qos_text) if qos_text in ("0", "1", "2") else 1)
        if isinstance(refusal, str):
            session.log.info("mqtt_subscribe_refused", filter=topic_filter[:200], reason=refusal)
    if dropped:
        session.log.warning("mqtt_session_overflow", client_id=client_id, dropped=dropped,
                            limit=session.settings.max_queued_messages)
