"""MQTT 3.1.1 and 5.0 semantics over the same core STOMP uses: packets in, core calls
out; core deliveries in, packets out.

An MQTT subscription is a core subscription to a topic pattern: ack mode AUTO
when granted QoS 0, CLIENT_INDIVIDUAL otherwise (PUBACK / PUBREC is the ack).
A persistent session (clean session 0) subscribes durably, so what is
published while the client is away waits in a durable subscription's queue,
on disk for QoS >= 1, exactly as for a STOMP durable subscriber.  PUBACK and
PUBREC wait in the outbox for the store's LSN, like a STOMP RECEIPT.

Synchronous and socket-free.  The session's :class:`Skeleton` takes the
server's bytes and deadlines and hands each packet to this session's handler
table; what remains here is what MQTT says: the handlers (CONNECT's among
them), the will, clean and persistent sessions, and
how a PUBLISH is delivered (its in-flight record and
transitions: :mod:`gateway.mqtt.inflight`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from core.authorization import ANONYMOUS_PRINCIPAL, Principal
from core.broker import Broker
from core.clients import Client
from core.durables import owner_of
from core.errors import CoreError, NotAuthorized, UnknownMessage, UnknownSubscription
from core.messages import Message
from core.ports import Clock
from core.revocation import Revocation
from core.subscriptions import Subscription
from core.tally import holder_of
from gateway.auth import AccessDenied, VerificationPending, spent_door
from gateway.mqtt import codec, incoming, topics
from gateway.mqtt.codec import MqttConnection, packets
from gateway.mqtt.codec.reasons import ReasonCode as R
from gateway.mqtt.codec.wire import MQTT5, MQTT31
from gateway.mqtt.inflight import FIRST_STAGE, InFlight, RefusingPubRec, SessionState
from gateway.mqtt.lifetime import EXPIRY_NOTES, prepare_will, release_will, will_bytes, will_delay, will_refusal
from gateway.mqtt.outgoing import fitted, message_items, publish_v5
from gateway.mqtt.peer import Peer, connack_properties, negotiate
from gateway.mqtt.registry import OWNER_MARK, OWNER_PREFIX, QOS2_NOTES, QUOTA, Registry, qos2_note
from gateway.mqtt.settings import MqttSettings
from gateway.mqtt.subscribing import Token, on_subscribe, on_unsubscribe, resume
from gateway.session.skeleton import Dialect, Skeleton, State

__all__ = ["EXPIRY_NOTES", "OWNER_PREFIX", "QOS2_NOTES", "MqttSession", "MqttSettings", "Registry"]  # what app.py wires

_CLOSED = State.CLOSED  # an Enum member read through its class is a Python-level lookup
DENIED_LOGGED = 64  # topics whose denied publishes are logged (once each)
ERRORS = (codec.ProtocolError, CoreError)  # what handlers raise about the peer (one tuple for all)
REASON_CHARS = 200  # a Reason String's length at most: a reason names a topic, not a payload
# The v5 CONNACK code for each refusal 3.1.1 has a code for (v5 §3.2.2.2).
V5_REFUSALS = {
    packets.UNACCEPTABLE_PROTOCOL_VERSION: R.UNSUPPORTED_PROTOCOL_VERSION,
    packets.IDENTIFIER_REJECTED: R.CLIENT_IDENTIFIER_NOT_VALID,
    packets.SERVER_UNAVAILABLE: R.SERVER_UNAVAILABLE,
    packets.BAD_USERNAME_OR_PASSWORD: R.BAD_USER_NAME_OR_PASSWORD,
    packets.NOT_AUTHORIZED: R.NOT_AUTHORIZED,
}


def server_codec(settings: MqttSettings) -> MqttConnection:
    """A new connection's codec, with the limits it has until its CONNECT is
    accepted: a socket that has not logged in may send a packet of
    ``preconnect_max_packet_bytes`` holding ``preconnect_max_properties``
    (on_connect raises both once it is in)."""
    return MqttConnection(max_packet_bytes=settings.preconnect_max_packet_bytes,
                          max_properties=settings.preconnect_max_properties,
                          max_user_property_bytes=settings.preconnect_max_user_property_bytes,
                          max_topic_filters=settings.max_topic_filters)


class MqttSession:
    """One MQTT connection's protocol state; also the core's Sink for it."""

    # Slotted, and what few connections need made on first use: idle ones come by the thousand.
    __slots__ = ("broker", "clock", "settings", "registry", "conn_id", "log", "admit", "source", "_denied_logged",
                 "_retain_refused_logged", "codec", "client", "client_id", "clean_session", "session", "will", "subs",
                 "skeleton", "outbox", "peer", "window")

    def __init__(
        self,
        broker: Broker,
        clock: Clock,
        settings: MqttSettings,
        registry: Registry,
        *,
        conn_id: str,
        log: Any,
        admit: Callable[[str | None, str | None], Principal] = lambda login, passcode: ANONYMOUS_PRINCIPAL,
        source: str | None = None,
    ) -> None:
        self.broker = broker
        self.clock = clock
        self.settings = settings
        self.registry = registry
        self.conn_id = conn_id
        self.log = log
        self.admit = admit  # until CONNECT is answered: see _on_connect
        self.source = source  # the peer's host: an anonymous client's share of the broker's pools (core.tally)
        self._denied_logged: set[str] | None = None
        self._retain_refused_logged = False
        self.codec = server_codec(settings)
        self.client: Client | None = None  # set once, at CONNECT
        self.client_id = ""
        self.clean_session = True
        self.session = SessionState()
        self.will: packets.Will | None = None
        self.subs: dict[str, Token] = {}  # by topic filter; the core's tokens
        self.peer: Peer | None = None  # what a v5 CONNECT agreed; None: 3.1.1
        self.window = settings.max_inflight  # QoS 1/2 deliveries unacknowledged at most
        dialect = Dialect(
            handlers=TABLE,
            owner=self,
            reject=self._unexpected,
            errors=ERRORS,
            on_error=self._on_error,
            fail=self._timed_out,
            on_eof=self._peer_closed,
            silence="keep-alive",
            room=self._inflight_room,
        )
        self.skeleton = Skeleton(
            self.codec, clock, log, dialect, outbox_high_water_bytes=settings.outbox_high_water_bytes,
            connect_timeout_s=settings.connect_timeout_s,
        )
        self.outbox = self.skeleton.outbox  # the same object, read on every delivery

    # -- what the server asks of the protocol -------------------------------

    @property
    def closed(self) -> bool:
        return self.skeleton.state is _CLOSED

    @property
    def close_reason(self) -> str | None:
        return self.skeleton.close_reason

    def shutdown(self, reason: str) -> None:
        """The broker is stopping: no will (the client did nothing wrong)."""
        self.will = None
        self.close(reason, R.SERVER_SHUTTING_DOWN)

    def storage_failed(self, first_lsn: int, last_lsn: int, reason: str, *, stored: bool = False) -> None:
        # An ack that cannot be made durable must not be sent: close instead,
        # so the client resends (MQTT has no error packet).
        if self.outbox.drop_gated(first_lsn, last_lsn) and not self.closed:
            what = "stored on the primary only" if stored else "the store could not write this client's messages"
            self.fail(f"{what}: {reason}", None, R.IMPLEMENTATION_SPECIFIC_ERROR)

    def revoked(self, revocation: Revocation) -> None:
        """A reload took rights this connection used (core.revocation): it
        closes, v5 told with DISCONNECT 0x87 and the reason (3.1.1: the close
        says it), logged once.  A removed user's will is not published;
        another's is, checked against the new map as it is sent."""
        if self.closed:
            return
        filters = [subscription.token.filter for subscription in revocation.subscriptions]
        reason = revocation.told(filters)
        self.log.warning("access_revoked", client_id=self.client_id, **revocation.logged(filters, reason))
        if revocation.removed:
            self.will = None
        self.close(reason, R.NOT_AUTHORIZED)

    def close(self, reason: str, code: int | None = None) -> None:
        """The connection is gone (or going): publish the will if it ended
        without DISCONNECT, release what it held, keep a persistent session.
        ``code``: the server decided it, and a v5 client is told why with a
        DISCONNECT first [MQTT-4.13.2-1]."""
        # Only after CONNACK (a client): a DISCONNECT never comes first [MQTT-3.14.0-1].
        if code is not None and self.peer is not None and self.client is not None and not self.closed:
            data = self._encoded(packets.Disconnect(code, self._problem(reason)))
            if data is not None:  # (too large for the client even bare: the close alone says it)
                self.outbox.append(data)
        if not self.skeleton.close(reason) or self.client is None:
            return  # closed already, or never connected
        if self.registry.active.get(self.client_id) is self:
            del self.registry.active[self.client_id]
        will, self.will = self.will, None
        self._connection_closed(will)  # the will (now or delayed), the session kept or ended

    # -- CONNECT, and the end of the connection it began ---------------------
    #
    # The one packet that decides everything after it: the login (through the
    # same gate as STOMP's), the client id's owner and take-over, a clean or
    # kept session, and resuming what a kept session holds (its durable
    # subscriptions, its QoS 2 ids).

    def _on_connect(self, packet: packets.Connect) -> None:
        settings = self.settings
        peer = None
        if self.codec.protocol_level == MQTT5:
            peer = self.peer = negotiate(packet.properties, packet.keep_alive, settings)
            if packet.properties is not None and packet.properties.authentication_method is not None:
                # No enhanced authentication method is offered: user name and password only.
                self.refuse(packets.NOT_AUTHORIZED, "no authentication method is supported but user name and password",
                               R.BAD_AUTHENTICATION_METHOD)  # [MQTT-4.12.0-1]
                return
        principal = self._admitted(packet)
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
                self.refuse(packets.IDENTIFIER_REJECTED, "an empty client id needs clean session")  # [MQTT-3.1.3-8]
                return
            if packet.protocol_level == MQTT31:
                # 3.1 has no assigned ids: its client id is 1 to 23 characters (3.1 §3.1, "Client Identifier").
                self.refuse(packets.IDENTIFIER_REJECTED, "MQTT 3.1 needs a client id")
                return
            client_id = assigned = f"gw-{os.urandom(6).hex()}"  # [MQTT-3.1.3-6]
        refusal = self._claim_refusal(client_id, principal, not keep)
        if refusal is not None:  # checked before anything is taken over or cleaned
            self.refuse(packets.NOT_AUTHORIZED, f"user {principal.name!r} may not use client id {client_id[:80]!r}: {refusal}",
                           R.QUOTA_EXCEEDED if refusal.startswith(QUOTA) else R.NOT_AUTHORIZED)
            return
        registry = self.registry
        if peer is not None and keep and packet.will is not None and will_delay(packet.will):
            # Told now, while the client can hear it, if its will could not wait.
            refusal = will_refusal(registry.lifetimes, holder_of(principal, self.source), will_bytes(packet.will),
                                   settings, client_id)
            if refusal is not None:
                self.refuse(packets.SERVER_UNAVAILABLE, f"its delayed will cannot be kept: {refusal}", R.QUOTA_EXCEEDED)
                return
        previous = registry.active.get(client_id)
        if previous is not None:  # first: its close may keep or end what this connection then finds
            previous.close("session taken over by a new connection", R.SESSION_TAKEN_OVER)  # [MQTT-3.1.4-2]
        owner = owner_of(principal)
        registry.connected(self.broker, client_id, packet.clean_session, peer.session_expiry if keep and peer else 0,
                           owner, self.log)
        if packet.clean_session:
            registry.release(client_id)  # [MQTT-3.1.2-6]: whatever was kept goes
        if keep:
            registry.hold(client_id, owner)
        self.client_id = client_id
        self.clean_session = not keep
        self.will = packet.will
        keep_alive = packet.keep_alive if peer is None else peer.keep_alive
        self.skeleton.silence.limit_s = keep_alive * settings.keepalive_grace  # [MQTT-3.1.2-24]
        self.codec.max_packet_bytes = settings.max_packet_bytes
        self.codec.max_properties = settings.max_properties
        self.codec.max_user_property_bytes = settings.max_user_property_bytes
        if peer is not None:
            self.window = min(settings.max_inflight, peer.receive_maximum)  # [MQTT-3.3.4-9]
        client = self.client = self.broker.open_client(self, client_id=client_id, principal=principal,
                                                             source=self.source)
        registry.active[client_id] = self
        self.skeleton.connected(client)
        self._resume(packet, assigned)

    def _admitted(self, packet: packets.Connect) -> Principal | None:
        """The user the login names, or None when CONNECT was answered (refused)
        or put off (the password check runs elsewhere and handles it again)."""
        password = packet.password.decode("utf-8", "replace") if packet.password is not None else None
        try:
            principal = self.admit(packet.username, password)
        except VerificationPending as pending:
            if pending.start(self.skeleton.gate.release):
                self.skeleton.defer(packet)
            else:
                self.refuse(packets.SERVER_UNAVAILABLE, "the broker is busy checking logins")
            return None
        except AccessDenied as exc:
            self.log.warning("login_refused", login=(packet.username or "")[:80], kind=exc.kind, reason=exc.reason)
            if exc.kind == "unavailable":
                code = packets.SERVER_UNAVAILABLE
            elif exc.kind == "credentials" and packet.username is not None:
                code = packets.BAD_USERNAME_OR_PASSWORD
            else:
                code = packets.NOT_AUTHORIZED
            self.refuse(code, exc.reason)
            return None
        self.admit = spent_door  # asked once: let go of what it knew of the transport
        return principal

    def _claim_refusal(self, client_id: str, principal: Principal, clean: bool) -> str | None:
        """Why ``principal`` may not take ``client_id`` (its owner's, or over quota)."""
        registry = self.registry
        broker = self.broker
        held = [*broker.durables.of_client(OWNER_PREFIX + client_id), *broker.shared.of_client(OWNER_PREFIX + client_id)]
        owners = [kept.owner for kept in held]
        refusal = registry.claim_refusal(client_id, principal, clean, owners, broker.secured)
        if refusal is None and not clean:
            settings = self.settings
            refusal = registry.quota_refusal(client_id, owner_of(principal), settings.max_persistent_sessions_per_user,
                                             settings.max_persistent_sessions)
        return refusal

    def _resume(self, packet: packets.Connect, assigned: str | None) -> None:
        """Answer CONNACK, then pick up what the session kept: PUBRELs owed, and
        its durable subscriptions with what they collected while it was away."""
        client = self.client
        assert client is not None
        client_id = self.client_id
        owner = OWNER_PREFIX + client_id
        durables = [d for d in self.broker.durables.of_client(owner) if d.active is None]
        memberships = [m for m in self.broker.shared.of_client(owner) if m.active is None]
        saved = self.registry.states.pop(client_id, None)
        lsn = 0
        if packet.clean_session:
            for durable in durables:  # [MQTT-3.1.2-6]: a clean session starts from nothing
                lsn = client.remove_durable(owner, durable.name)
            for membership in memberships:
                lsn = max(lsn, client.drop_shared(owner, membership.name))  # type: ignore[arg-type]
            for packet_id in saved.inbound_qos2 if saved is not None else ():
                lsn = max(lsn, self.broker.store.note(QOS2_NOTES, qos2_note(client_id, packet_id), None))
            durables = []
            memberships = []
            present = False
        else:
            present = bool(durables) or bool(memberships) or saved is not None  # [MQTT-3.2.2-2]
            if saved is not None:
                self.session = saved
            if present and self.clean_session:
                # A v5 session resumed but not to be kept: its durable queues
                # are taken up (their backlog is owed) and removed at the close.
                self.clean_session = False
                lsn = self.registry.ends_with_connection(self.broker, client_id, owner_of(client.principal))
        peer = self.peer
        if peer is None:
            connack = packets.ConnAck(present, packets.ACCEPTED)
        else:
            props = packet.properties
            asked = props.session_expiry_interval or 0 if props is not None else 0
            connack = packets.ConnAck(present, packets.ACCEPTED, connack_properties(
                peer, self.settings, requested_expiry=asked, requested_keep_alive=packet.keep_alive,
                assigned_client_id=assigned))
        data = self.codec.send(connack) if peer is None else fitted(peer, self.codec.send, connack)
        if data is None:
            # Not even what the client must know fits its Maximum Packet Size: no
            # CONNACK may be sent [MQTT-3.1.2-24], so the connection ends, willless
            # (the client never learnt it was connected).
            self.will = None
            limit = peer.maximum_packet_size  # type: ignore[union-attr]  # (None: a 3.1.1 CONNACK always fits)
            self.fail(f"the CONNACK does not fit the client's Maximum Packet Size of {limit}", packet, None)
            return
        self.outbox.append(data, lsn)
        self.log.info("mqtt_connected", client_id=client_id, clean_session=packet.clean_session,
                         keep_alive=packet.keep_alive, session_present=present)
        for packet_id in self.session.released():
            self.outbox.append(self.codec.send(packets.PubRel(packet_id)))
        dropped = 0
        for durable in durables:
            dropped += durable.queue.stats.discarded
            durable.queue.stats.discarded = 0
        names = [durable.name for durable in durables] + [membership.name for membership in memberships]
        resume(self, names, self.log.info)  # type: ignore[arg-type]
        if dropped:
            self.log.warning("mqtt_session_overflow", client_id=client_id, dropped=dropped,
                                limit=self.settings.max_queued_messages)

    def _connection_closed(self, will: packets.Will | None) -> None:
        """The connection is gone (its client still open): the will, now or
        after its Will Delay Interval; then the session kept (ending after its
        Session Expiry Interval) or ended."""
        client = self.client
        assert client is not None
        peer = self.peer
        registry = self.registry
        # The session ends with this connection: a clean one, or a resumed v5 one whose interval is 0.
        ends = self.clean_session or (peer is not None and peer.session_expiry == 0)
        if will is not None:
            pending = prepare_will(self.broker, client, will)
            delay = will_delay(will) if peer is not None and not ends else 0
            refusal = None
            if delay and not isinstance(pending, str):
                refusal = will_refusal(registry.lifetimes, pending.holder, pending.nbytes, self.settings)
            if isinstance(pending, str):
                self.log.warning("mqtt_will_refused", client_id=self.client_id, topic=will.topic[:200], reason=pending)
            elif refusal is not None:  # its share filled since CONNECT: said now rather than held past the bound
                self.log.warning("mqtt_will_not_delayed", client_id=self.client_id, topic=will.topic[:200],
                                    reason=refusal)
                release_will(self.broker, self.client_id, pending, self.clock.wall_ms(), self.log, client)
            elif delay:  # [MQTT-3.1.3-9]: unless the client id connects first
                registry.lifetimes.will_at(self.client_id, self.clock.wall_ms() + delay * 1000, pending)
            else:
                release_will(self.broker, self.client_id, pending, self.clock.wall_ms(), self.log, client)
        client.close(reserve=self.session.unanswered_qos2())
        if self.clean_session:
            registry.states.pop(self.client_id, None)
            return
        if ends:
            self._end_session()  # resumed, but not to be kept past this connection
            return
        owner = owner_of(client.principal)
        self.session.suspend(owner)
        registry.states[self.client_id] = self.session
        if peer is not None:
            registry.kept(self.broker, self.client_id, peer.session_expiry, owner)

    def _end_session(self) -> None:
        """A resumed v5 session whose Session Expiry Interval is 0 ends with its
        connection: what it kept goes (its durable subscriptions, its shared
        memberships, its QoS 2 ids)."""
        self.registry.end(self.broker, self.client_id, self.session.inbound_qos2)

    # -- Sink --------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        if self.outbox.nbytes < self.settings.outbox_high_water_bytes and len(self.session.outbound) < self.window:
            return True
        self.skeleton.paused = True
        return False

    def deliver(self, subscription: Subscription, message: Message) -> bool | None:
        # The topic field is cached per address: PUBLISH is encoded from it directly.
        field = topics.delivery_field[message.address.text]
        if field is None:
            # A STOMP name MQTT cannot carry (a '+' or '#' inside a segment):
            # this subscriber cannot be told about it; settle it, do not fail.
            return True
        # The most a subscriber may get: as published over MQTT; from another
        # protocol, 2 if persistent (kept until acknowledged), else 0.
        qos = message.qos
        if qos is None:
            qos = 2 if message.persistent else 0
        sub: Token = subscription.token
        if sub.qos < qos:
            qos = sub.qos
        body = message.body or b""
        if self.peer is not None:
            return self._deliver_v5(sub, message, field, body, qos)
        if qos == 0:
            registry = self.registry  # the same message to the next subscriber: the same bytes
            if registry.last_message is not message:
                registry.last_qos0, registry.last_message = codec.publish_bytes(field, body, 0, message.retain), message
            self.outbox.append(registry.last_qos0)
            return True
        state = self.session
        dup = message.redeliveries > 0  # message.redelivered, inline; DUP [MQTT-3.3.1-1]
        packet_id = state.ids_by_message.pop(message.id, None) if dup else None
        if packet_id is None or packet_id in state.outbound:
            packet_id = state.next_packet_id()
        state.outbound[packet_id] = InFlight(sub, message.id, FIRST_STAGE[qos])  # type: ignore[arg-type]
        self.outbox.append(codec.publish_bytes(field, body, qos, message.retain, dup, packet_id))
        return None

    def _deliver_v5(self, sub: Token, message: Message, field: bytes, body: bytes, qos: int) -> bool | None:
        # Retained copies on subscribe keep RETAIN; live ones as published
        # only if the subscription asked [MQTT-3.3.1-12, -13].
        retain = message.retain or (sub.retain_as_published and message.retain_published)
        packet_id = None
        dup = False
        state = self.session
        if qos:
            dup = message.redeliveries > 0
            packet_id = state.ids_by_message.pop(message.id, None) if dup else None
            if packet_id is None or packet_id in state.outbound:
                packet_id = state.next_packet_id()
        items = sub.item
        headers = message.headers
        if headers:
            registry = self.registry  # the next subscriber of the same message: the same items
            if registry.last_v5_message is not message:
                registry.last_v5_items, registry.last_v5_message = message_items(headers, 0, 0), message
            items = registry.last_v5_items + items
        if message.expires:
            items += message_items(None, message.expires, self.clock.wall_ms())
        data = publish_v5(self.peer, field, message.address.text, items, body, qos, retain, dup, packet_id)  # type: ignore[arg-type]
        if data is None:
            self.registry.oversize_dropped += 1
            return True  # too large for the client: settled as if sent [MQTT-3.1.2-25]
        if qos:
            state.outbound[packet_id] = InFlight(sub, message.id, FIRST_STAGE[qos])  # type: ignore[arg-type,index]
        self.outbox.append(data)
        return None if qos else True

    def unblocked(self) -> None:
        self.skeleton.gate.release()

    # -- packets -----------------------------------------------------------

    def _on_publish(self, packet: packets.Publish) -> None:
        topic = packet.topic
        headers: dict[str, str] = {}
        expires = 0
        state = self.session
        if self.peer is not None and (packet.qos or packet.properties is not None or not topic):
            # (A QoS 0 PUBLISH with a topic name and no properties has nothing to check.)
            in_flight = 0
            if packet.qos:
                in_flight = self._in_flight()
                if packet.qos == 2 and packet.packet_id in state.inbound_qos2:
                    in_flight -= 1  # a resend of one already counted (v5 §4.9), not one more
            outcome = incoming.accept(self.peer, packet, in_flight, self.settings.receive_maximum)
            if isinstance(outcome, incoming.Refused):
                if outcome.disconnect:
                    self.fail(outcome.reason, packet, outcome.code)
                else:
                    self._ack(packet, 0, outcome.code, outcome.reason)
                return
            topic, headers, expiry_s = outcome
            if expiry_s:
                expires = self.clock.wall_ms() + expiry_s * 1000
        address = topics.to_address(topic)
        if isinstance(address, str):
            self.fail(f"topic {topic[:80]!r} cannot be used: {address}", packet, R.TOPIC_NAME_INVALID)
            return
        client = self.client
        assert client is not None
        qos = packet.qos
        if qos == 2 and packet.packet_id in state.inbound_qos2:
            # A resend before PUBREL: it was routed already; answer again only.
            self.outbox.append(self.codec.send(packets.PubRec(packet.packet_id)))
            return
        if qos and client.held_for_disk(address):
            # The disk alarm: no ack, reading stops, and this PUBLISH is
            # handled again once free space is back.
            self.skeleton.defer(packet)
            return
        message = self.broker.message(address, headers, packet.payload, qos > 0)  # positional: faster, per message
        message.qos = qos
        if expires:
            message.expires = expires
        if packet.retain:
            message.retain_published = True
        code, reason = 0, None
        try:
            # MQTT 5 can tell a QoS 1/2 publisher no: a retained value past the
            # bounds (or the client's share of them) refuses the whole publish,
            # 0x97, before it goes anywhere, and the client can send it again
            # without the flag.  3.1.1 and QoS 0: routed, not kept, logged, counted.
            refused = self._retain_quota(client, message) if packet.retain and qos and self.peer is not None else None
            if refused is None:
                lsn = client.send(message, None, packet.retain)
            else:
                lsn, code, reason = 0, R.QUOTA_EXCEEDED, refused
        except NotAuthorized as exc:
            # [MQTT-3.3.5-2]: 3.1.1 has no way to tell a publisher no; the
            # publish is acknowledged as usual and dropped.  v5 says so in
            # the ack (QoS 1/2).  Logged once per topic, so a device retrying
            # in a loop cannot flood the log.
            logged = self._denied_logged if self._denied_logged is not None else set()
            if topic not in logged and len(logged) < DENIED_LOGGED:
                logged.add(topic)
                self._denied_logged = logged
                self.log.warning("publish_denied", topic=topic[:200], reason=exc.reason)
            lsn = 0
            code = R.NOT_AUTHORIZED if self.peer is not None else 0
            reason = "not authorized"
        else:
            if packet.retain:
                self._retain_refused(message)
        if qos == 1 and self.peer is None:
            self.outbox.append(codec.puback_bytes(packet.packet_id), lsn)  # type: ignore[arg-type]
        elif qos:
            self._ack(packet, lsn, code, reason if code else None)

    def _ack(self, packet: packets.Publish, lsn: int, code: int, reason: str | None) -> None:
        """PUBACK or PUBREC for ``packet`` (QoS 0 has none), after ``lsn``; a v5
        one carries ``code``.  A refused PUBLISH is not held as a QoS 2 id."""
        packet_id: int = packet.packet_id  # type: ignore[assignment]
        if packet.qos == 1:
            if lsn and self.peer is not None:
                self.peer.held_acks.append(lsn)
            if code:
                self._send_fitted(packets.PubAck(packet_id, code, self._problem(reason)), lsn)
            else:  # success: the short form, the same bytes in both versions (v5 §3.4.2.1)
                self.outbox.append(codec.puback_bytes(packet_id), lsn)
            return
        if packet.qos != 2:
            return
        if not code:
            self.session.receive_qos2(packet_id)
            if not self.clean_session:  # the PUBREC promises it across a restart too
                owner = OWNER_MARK + owner_of(self.client.principal).encode()  # type: ignore[union-attr]
                lsn = max(lsn, self.broker.store.note(QOS2_NOTES, qos2_note(self.client_id, packet_id), owner))
        self._send_fitted(packets.PubRec(packet_id, code, self._problem(reason)), lsn)

    def _in_flight(self) -> int:
        """The v5 client's QoS 1/2 PUBLISHes not answered yet: PUBACKs held
        for the disk, and QoS 2 ids awaiting PUBREL."""
        held = self.peer.held_acks  # type: ignore[union-attr]
        durable = self.broker.durable_lsn
        while held and held[0] <= durable:
            held.popleft()
        return len(held) + len(self.session.inbound_qos2)

    def _on_puback(self, packet: packets.PubAck | packets.PubComp) -> None:
        """PUBACK or PUBCOMP: along the in-flight table; a duplicate, one out
        of order or one for an id not in flight changes nothing."""
        step = self.session.advance(packet.packet_id, type(packet))
        if step is not None:
            self._advanced(*step)

    def _on_pubrec(self, packet: packets.PubRec) -> None:
        if packet.reason_code >= 0x80:  # v5: refused, so the exchange is over [MQTT-4.3.3-4]
            step = self.session.advance(packet.packet_id, RefusingPubRec)
            if step is not None:
                self._advanced(*step)  # its packet id is free again
            return  # and no PUBREL
        step = self.session.advance(packet.packet_id, packets.PubRec)
        if step is not None:
            self._advanced(*step)  # from here the message is the client's
        # Answered whatever its stage: a PUBREL lost on the way is asked for again.
        self.outbox.append(self.codec.send(packets.PubRel(packet.packet_id)))

    def _on_pubrel(self, packet: packets.PubRel) -> None:
        lsn = 0
        if packet.packet_id in self.session.inbound_qos2:
            self.session.inbound_qos2.discard(packet.packet_id)  # type: ignore[union-attr]
            if not self.clean_session:
                lsn = self.broker.store.note(QOS2_NOTES, qos2_note(self.client_id, packet.packet_id), None)
        self.outbox.append(self.codec.send(packets.PubComp(packet.packet_id)), lsn)

    def _on_pingreq(self, packet: packets.PingReq) -> None:
        self.outbox.append(self.codec.send(packets.PingResp()))

    def _on_disconnect(self, packet: packets.Disconnect) -> None:
        peer = self.peer
        if peer is not None:
            expiry = packet.properties.session_expiry_interval if packet.properties is not None else None
            if expiry is not None:
                if peer.session_expiry == 0 and expiry:
                    self.fail("a DISCONNECT cannot make a session that ends with its connection persist", packet,
                              R.PROTOCOL_ERROR)  # [MQTT-3.14.2-2]
                    return
                peer.session_expiry = min(expiry, self.settings.max_session_expiry_s)
            if packet.reason_code != R.SUCCESS:
                # Only a normal disconnection (0x00) discards the will [MQTT-3.1.2-8]:
                # 0x04 asks for it, and an error code ends the connection as a failure.
                self.close(f"client disconnected with reason {packet.reason_code:#04x}")
                return
        self.will = None  # [MQTT-3.14.4-3]
        self.close("client disconnected")

    def _on_auth(self, packet: packets.Auth) -> None:
        # CONNECT with an Authentication Method is refused (0x8C), so there is
        # no exchange an AUTH could continue [MQTT-4.12.0-1].
        self.fail("AUTH without an authentication exchange", packet, R.PROTOCOL_ERROR)

    # -- helpers -----------------------------------------------------------

    def _advanced(self, entry: InFlight, acked: bool) -> None:
        """An in-flight record moved on: ack the core's message if this step
        settles it; either way the window has room again."""
        if acked:
            try:
                self.client.ack(entry.token, entry.message_id)  # type: ignore[union-attr]
            except (UnknownMessage, UnknownSubscription):
                pass  # unsubscribed meanwhile: the core already put it back
        self.skeleton.resume_deliveries()

    def _inflight_room(self) -> bool:
        return len(self.session.outbound) < self.window

    def _retain_quota(self, client: Client, message: Message) -> str | None:
        """Why ``message`` (to be retained) would not be kept, asked before it
        is published (the core counts it), once the client may write there."""
        client.authorize("write", message.address)
        client.retain_refusal = reason = self.broker.retained.refused(message, client.holder)
        return reason

    def _retain_refused(self, message: Message) -> None:
        """The broker's bounds did not let ``message`` be kept as its topic's
        retained value (the core counted it); it was still published (3.1.1
        has no way to say no) or refused (v5's 0x97): logged once per connection."""
        reason = self.client.retain_refusal if self.client is not None else None
        if reason is not None and not self._retain_refused_logged:
            self._retain_refused_logged = True
            self.log.warning("retained_refused", client_id=self.client_id, topic=topics.from_address(message.address)[:200],
                             reason=reason)

    def _on_error(self, exc: Exception, packet: Any) -> None:
        """The one mapping of what a packet (or the codec) raised onto the
        wire: a CONNACK code if the codec names one before CONNECT (v5: its
        reason code), a v5 DISCONNECT after, then close."""
        if isinstance(exc, codec.ProtocolError):
            if self.skeleton.state is State.AWAITING_CONNECT:
                v5 = self.codec.protocol_level == 5 and exc.reason_code is not None
                code = exc.reason_code if v5 else exc.return_code
                if code is not None:
                    self.outbox.append(self.codec.send(packets.ConnAck(False, code)))
            self.fail(exc.message, None, exc.reason_code if exc.reason_code is not None else R.MALFORMED_PACKET)
        else:
            assert isinstance(exc, CoreError)
            self.fail(exc.reason, packet, R.NOT_AUTHORIZED if isinstance(exc, NotAuthorized) else R.UNSPECIFIED_ERROR)

    def _unexpected(self, packet: Any) -> None:
        self.fail(f"unexpected {type(packet).__name__} packet", packet, R.PROTOCOL_ERROR)

    def _timed_out(self, reason: str) -> None:
        self.fail(reason, None, R.KEEP_ALIVE_TIMEOUT)  # (before CONNECT there is no v5 peer to tell)

    def _peer_closed(self) -> None:
        self.skeleton.process()  # what arrived complete before the EOF still counts
        if not self.closed:
            self.close("peer closed the connection" + (" mid-packet" if self.codec.mid_packet else ""))

    def refuse(self, code: int, reason: str, v5_code: int | None = None) -> None:
        """Refuse CONNECT with 3.1.1's ``code``, or on a v5 connection with
        ``v5_code`` (by default the v5 code for the same refusal)."""
        if self.peer is not None:
            reply = packets.ConnAck(False, v5_code if v5_code is not None else V5_REFUSALS[code], self._problem(reason))
        else:
            reply = packets.ConnAck(False, code)
        data = self._encoded(reply)
        if data is not None:
            self.outbox.append(data)
        self.peer = None  # no DISCONNECT after a refused CONNECT [MQTT-3.2.2-7]
        self.fail(reason, None)

    def fail(self, reason: str, packet: Any = None, code: int | None = R.UNSPECIFIED_ERROR) -> None:
        """Log once and close: 3.1.1 has no error packet, the close is the
        answer; a v5 client is told ``code`` in a DISCONNECT first."""
        self.log.warning("packet_rejected", packet=type(packet).__name__ if packet is not None else None, reason=reason)
        self.close(reason, code)

    def _encoded(self, packet: packets.ConnAck | packets.PubAck | packets.PubRec | packets.Disconnect) -> bytes | None:
        """``packet`` on the wire; to a v5 client, within its Maximum Packet
        Size (outgoing.fitted: properties shed, or None: not to be sent).
        Without properties these packets are a few bytes: not measured."""
        if self.peer is None or packet.properties is None:
            return self.codec.send(packet)
        return fitted(self.peer, self.codec.send, packet)

    def _send_fitted(self, packet: packets.PubAck | packets.PubRec, lsn: int) -> None:
        data = self._encoded(packet)
        if data is not None:  # (a client that takes no 5-byte packet gets no ack)
            self.outbox.append(data, lsn)

    def _problem(self, reason: str | None) -> packets.Properties | None:
        """A Reason String for a v5 reply, if the client wants them [MQTT-3.1.2-29]."""
        peer = self.peer
        if reason is None or peer is None or not peer.problem_information:
            return None
        return packets.Properties(reason_string=reason[:REASON_CHARS])


# The transition table, one for every session: plain functions of (session,
# packet), called with the dialect's owner, so a session holds no table of
# bound methods.  CONNECT first and only once [MQTT-3.1.0-1, -2].
TABLE: dict[State, dict[type, Callable[[MqttSession, Any], None]]] = {
    State.AWAITING_CONNECT: {packets.Connect: MqttSession._on_connect},
    State.CONNECTED: {
        packets.Publish: MqttSession._on_publish,
        packets.PubAck: MqttSession._on_puback,
        packets.PubRec: MqttSession._on_pubrec,
        packets.PubRel: MqttSession._on_pubrel,
        packets.PubComp: MqttSession._on_puback,
        packets.Subscribe: on_subscribe,
        packets.Unsubscribe: on_unsubscribe,
        packets.PingReq: MqttSession._on_pingreq,
        packets.Disconnect: MqttSession._on_disconnect,
        packets.Auth: MqttSession._on_auth,
    },
    State.CLOSED: {},
}
