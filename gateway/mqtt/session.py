"""MQTT 3.1.1 semantics over the same core STOMP uses: packets in, core calls
out; core deliveries in, packets out.

An MQTT subscription is a core subscription to a topic pattern: ack mode AUTO
when granted QoS 0, CLIENT_INDIVIDUAL otherwise (PUBACK / PUBREC is the ack).
A persistent session (clean session 0) subscribes durably, so what is
published while the client is away waits in a durable subscription's queue,
on disk for QoS >= 1, exactly as for a STOMP durable subscriber.  PUBACK and
PUBREC wait in the outbox for the store's LSN, like a STOMP RECEIPT.

Synchronous and socket-free.  The session's :class:`Skeleton` takes the
server's bytes and deadlines and hands each packet to this session's handler
table; what remains here is what MQTT says: the handlers, the will, clean and
persistent sessions, and how a PUBLISH is delivered (its in-flight record and
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
from core.names import Address
from core.ports import Clock
from core.subscriptions import AckMode, Subscription
from gateway.auth import AccessDenied, VerificationPending, spent_door
from gateway.mqtt import codec, packets, topics
from gateway.mqtt.inflight import FIRST_STAGE, InFlight, SessionState
from gateway.mqtt.registry import OWNER_MARK, OWNER_PREFIX, QOS2_NOTES, Registry, qos2_note
from gateway.mqtt.settings import MqttSettings
from gateway.session.skeleton import Dialect, Skeleton, State

__all__ = ["OWNER_PREFIX", "QOS2_NOTES", "MqttSession", "MqttSettings", "Registry"]  # what app.py wires

_CLOSED = State.CLOSED  # an Enum member read through its class is a Python-level lookup
DENIED_LOGGED = 64  # topics whose denied publishes are logged (once each)
ERRORS = (codec.ProtocolError, CoreError)  # what handlers raise about the peer (one tuple for all)


class _Sub:
    """The session's token for one core subscription."""

    __slots__ = ("filter", "qos")

    def __init__(self, topic_filter: str, qos: int) -> None:
        self.filter = topic_filter
        self.qos = qos


class MqttSession:
    """One MQTT connection's protocol state; also the core's Sink for it."""

    # Slotted, and what few connections need made on first use: idle ones come by the thousand.
    __slots__ = ("broker", "clock", "settings", "registry", "conn_id", "log", "admit", "_denied_logged",
                 "_retain_refused_logged", "codec", "client", "client_id", "clean_session", "session", "will", "_subs",
                 "skeleton", "outbox")

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
    ) -> None:
        self.broker = broker
        self.clock = clock
        self.settings = settings
        self.registry = registry
        self.conn_id = conn_id
        self.log = log
        self.admit = admit  # until CONNECT is answered: see _on_connect
        self._denied_logged: set[str] | None = None
        self._retain_refused_logged = False
        self.codec = codec.MqttConnection(codec.Role.SERVER, max_packet_bytes=settings.preconnect_max_packet_bytes)
        self.client: Client | None = None  # set once, at CONNECT
        self.client_id = ""
        self.clean_session = True
        self.session = SessionState()
        self.will: packets.Will | None = None
        self._subs: dict[str, _Sub] = {}  # by topic filter; the core's tokens
        dialect = Dialect(
            handlers=TABLE,
            owner=self,
            reject=self._unexpected,
            errors=ERRORS,
            on_error=self._on_error,
            fail=self._fail,
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
        self.close(reason)

    def storage_failed(self, first_lsn: int, last_lsn: int, reason: str, *, stored: bool = False) -> None:
        # An ack that cannot be made durable must not be sent: close instead,
        # so the client resends (MQTT has no error packet).
        if self.outbox.drop_gated(first_lsn, last_lsn) and not self.closed:
            what = "stored on the primary only" if stored else "the store could not write this client's messages"
            self._fail(f"{what}: {reason}", None)

    def close(self, reason: str) -> None:
        """The connection is gone (or going): publish the will if it ended
        without DISCONNECT, release what it held, keep a persistent session."""
        if not self.skeleton.close(reason) or self.client is None:
            return  # closed already, or never connected
        if self.registry.active.get(self.client_id) is self:
            del self.registry.active[self.client_id]
        will, self.will = self.will, None
        if will is not None:
            self._publish_will(will)
        self.client.close()
        if self.clean_session:
            self.registry.states.pop(self.client_id, None)
            return
        self.session.suspend(owner_of(self.client.principal))
        self.registry.states[self.client_id] = self.session

    # -- Sink --------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        if self.outbox.nbytes < self.settings.outbox_high_water_bytes and len(self.session.outbound) < self.settings.max_inflight:
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
        sub: _Sub = subscription.token
        if sub.qos < qos:
            qos = sub.qos
        body = message.body or b""
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

    def unblocked(self) -> None:
        self.skeleton.gate.release()

    # -- packets -----------------------------------------------------------

    def _on_connect(self, packet: packets.Connect) -> None:
        if packet.protocol_level == 5:  # the codec speaks MQTT 5, this session not yet: 0x84, v5's refusal
            self._refuse(0x84, "MQTT 5 is not served yet")
            return
        password = packet.password.decode("utf-8", "replace") if packet.password is not None else None
        try:
            principal = self.admit(packet.username, password)
        except VerificationPending as pending:
            if pending.start(self.skeleton.gate.release):
                self.skeleton.defer(packet)
            else:
                self._refuse(packets.SERVER_UNAVAILABLE, "the broker is busy checking logins")
            return
        except AccessDenied as exc:
            self.log.warning("login_refused", login=(packet.username or "")[:80], kind=exc.kind, reason=exc.reason)
            if exc.kind == "unavailable":
                code = packets.SERVER_UNAVAILABLE
            elif exc.kind == "credentials" and packet.username is not None:
                code = packets.BAD_USERNAME_OR_PASSWORD
            else:
                code = packets.NOT_AUTHORIZED
            self._refuse(code, exc.reason)
            return
        self.admit = spent_door  # asked once: let go of what it knew of the transport
        client_id = packet.client_id
        if not client_id:
            if not packet.clean_session:
                self._refuse(packets.IDENTIFIER_REJECTED, "an empty client id needs clean session")  # [MQTT-3.1.3-8]
                return
            client_id = f"gw-{os.urandom(6).hex()}"  # [MQTT-3.1.3-6]
        owners = [d.owner for d in self.broker.durables.of_client(OWNER_PREFIX + client_id)]
        refusal = self.registry.claim_refusal(client_id, principal, packet.clean_session, owners, self.broker.secured)
        if refusal is None and not packet.clean_session:
            refusal = self.registry.quota_refusal(client_id, owner_of(principal), self.settings.max_persistent_sessions_per_user,
                                                  self.settings.max_persistent_sessions)
        if refusal is not None:  # checked before anything is taken over or cleaned
            self._refuse(packets.NOT_AUTHORIZED, f"user {principal.name!r} may not use client id {client_id[:80]!r}: {refusal}")
            return
        if packet.clean_session:
            self.registry.release(client_id)  # [MQTT-3.1.2-6]: whatever was kept goes
        else:
            self.registry.hold(client_id, owner_of(principal))
        previous = self.registry.active.get(client_id)
        if previous is not None:
            previous.close("session taken over by a new connection")  # [MQTT-3.1.4-2]
        self.client_id = client_id
        self.clean_session = packet.clean_session
        self.will = packet.will
        self.skeleton.silence.limit_s = packet.keep_alive * self.settings.keepalive_grace  # [MQTT-3.1.2-24]
        self.codec.max_packet_bytes = self.settings.max_packet_bytes
        self.client = self.broker.open_client(self, client_id=client_id, principal=principal)
        self.registry.active[client_id] = self
        self.skeleton.connected(self.client)
        owner = OWNER_PREFIX + client_id
        durables = [d for d in self.broker.durables.of_client(owner) if d.active is None]
        saved = self.registry.states.pop(client_id, None)
        lsn = 0
        if packet.clean_session:
            for durable in durables:  # [MQTT-3.1.2-6]: a clean session starts from nothing
                lsn = self.client.remove_durable(owner, durable.name)
            for packet_id in saved.inbound_qos2 if saved is not None else ():
                lsn = max(lsn, self.broker.store.note(QOS2_NOTES, qos2_note(client_id, packet_id), None))
            durables = []
            present = False
        else:
            present = bool(durables) or saved is not None  # [MQTT-3.2.2-2]
            if saved is not None:
                self.session = saved
        self.outbox.append(self.codec.send(packets.ConnAck(present, packets.ACCEPTED)), lsn)
        self.log.info("mqtt_connected", client_id=client_id, clean_session=packet.clean_session,
                      keep_alive=packet.keep_alive, session_present=present)
        for packet_id in self.session.released():
            self.outbox.append(self.codec.send(packets.PubRel(packet_id)))
        dropped = 0
        for durable in durables:
            qos_text, _, topic_filter = durable.name.partition(":")
            dropped += durable.queue.stats.discarded
            durable.queue.stats.discarded = 0
            refusal = self._subscribe(topic_filter, int(qos_text) if qos_text in ("0", "1", "2") else 1)
            if isinstance(refusal, str):
                self.log.info("mqtt_subscribe_refused", filter=topic_filter[:200], reason=refusal)
        if dropped:
            self.log.warning("mqtt_session_overflow", client_id=client_id, dropped=dropped,
                             limit=self.settings.max_queued_messages)

    def _on_publish(self, packet: packets.Publish) -> None:
        address = topics.to_address(packet.topic)
        if isinstance(address, str):
            self._fail(f"topic {packet.topic[:80]!r} cannot be used: {address}", packet)
            return
        client = self.client
        assert client is not None
        state = self.session
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
        message = self.broker.message(address, {}, packet.payload, qos > 0)  # positional: faster, per message
        message.qos = qos
        try:
            lsn = client.send(message, None, packet.retain)
        except NotAuthorized as exc:
            # [MQTT-3.3.5-2]: 3.1.1 has no way to tell a publisher no; the
            # publish is acknowledged as usual and dropped.  Logged once per
            # topic, so a device retrying in a loop cannot flood the log.
            logged = self._denied_logged if self._denied_logged is not None else set()
            if packet.topic not in logged and len(logged) < DENIED_LOGGED:
                logged.add(packet.topic)
                self._denied_logged = logged
                self.log.warning("publish_denied", topic=packet.topic[:200], reason=exc.reason)
            lsn = 0
        else:
            if packet.retain:
                self._retain_refused(message)
        if qos == 1:
            self.outbox.append(codec.puback_bytes(packet.packet_id), lsn)  # type: ignore[arg-type]
        elif qos == 2:
            state.receive_qos2(packet.packet_id)
            if not self.clean_session:  # the PUBREC promises it across a restart too
                owner = OWNER_MARK + owner_of(client.principal).encode()
                lsn = max(lsn, self.broker.store.note(QOS2_NOTES, qos2_note(self.client_id, packet.packet_id), owner))
            self.outbox.append(self.codec.send(packets.PubRec(packet.packet_id)), lsn)

    def _on_puback(self, packet: packets.PubAck | packets.PubComp) -> None:
        """PUBACK or PUBCOMP: along the in-flight table; a duplicate, one out
        of order or one for an id not in flight changes nothing."""
        step = self.session.advance(packet.packet_id, type(packet))
        if step is not None:
            self._advanced(*step)

    def _on_pubrec(self, packet: packets.PubRec) -> None:
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

    def _on_subscribe(self, packet: packets.Subscribe) -> None:
        codes = []
        lsn = 0
        # By filter: one repeated in the packet replaces itself [MQTT-3.8.4-3]
        # and gets the retained messages once, not once per repetition.
        subscribed: dict[str, tuple[Subscription, Address]] = {}
        refused: list[tuple[str, str]] = []
        for topic_filter, qos in packet.topics:
            reason = codec.validate_topic_filter(topic_filter)
            pattern = topics.to_pattern(topic_filter) if reason is None else reason
            subscription = self._subscribe(topic_filter, qos, start=False) if not isinstance(pattern, str) else pattern
            if isinstance(subscription, str):
                refused.append((topic_filter, subscription))
                codes.append(packets.SUBACK_FAILURE)  # that filter alone fails
                subscribed.pop(topic_filter, None)
                continue
            assert not isinstance(pattern, str)
            lsn = max(lsn, self.client.last_lsn)  # type: ignore[union-attr]
            codes.append(qos)
            subscribed[topic_filter] = (subscription, pattern)
        if refused:  # one line per packet, however many filters it refused
            self.log.info("mqtt_subscribe_refused", filter=refused[0][0][:200], reason=refused[0][1],
                          refused=len(refused), filters=len(codes))
        self.outbox.append(self.codec.send(packets.SubAck(packet.packet_id, codes)), lsn)
        for subscription, _ in subscribed.values():  # after the SUBACK [MQTT-3.3.1-6]
            # A durable one's backlog, then the retained values its filter matches.
            self.client.start(subscription, retained=True)  # type: ignore[union-attr]

    def _subscribe(self, topic_filter: str, qos: int, *, start: bool = True) -> Subscription | str:
        """The new subscription, or why the core refused it."""
        client = self.client
        assert client is not None
        pattern = topics.to_pattern(topic_filter)
        assert not isinstance(pattern, str)
        existing = self._subs.pop(topic_filter, None)
        if existing is not None:  # [MQTT-3.8.4-3]: a new subscription replaces it
            client.unsubscribe(existing, remove_durable=existing.qos != qos)
        mode = AckMode.AUTO if qos == 0 else AckMode.CLIENT_INDIVIDUAL
        durable = None if self.clean_session else (OWNER_PREFIX + self.client_id, f"{qos}:{topic_filter}")
        token = _Sub(topic_filter, qos)
        try:
            subscription = client.subscribe(
                token, pattern, mode, self.settings.max_inflight, durable=durable, start=start
            )
        except CoreError as exc:
            return exc.reason
        self._subs[topic_filter] = token
        if durable is not None:
            subscription.queue.configure(limit=self.settings.max_queued_messages)
        return subscription

    def _on_unsubscribe(self, packet: packets.Unsubscribe) -> None:
        client = self.client
        assert client is not None
        lsn = 0
        for topic_filter in packet.topics:
            token = self._subs.pop(topic_filter, None)
            if token is not None:
                lsn = max(lsn, client.unsubscribe(token, remove_durable=True))
        self.outbox.append(self.codec.send(packets.UnsubAck(packet.packet_id)), lsn)

    def _on_pingreq(self, packet: packets.PingReq) -> None:
        self.outbox.append(self.codec.send(packets.PingResp()))

    def _on_disconnect(self, packet: packets.Disconnect) -> None:
        self.will = None  # [MQTT-3.14.4-3]
        self.close("client disconnected")

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
        return len(self.session.outbound) < self.settings.max_inflight

    def _publish_will(self, will: packets.Will) -> None:
        address = topics.to_address(will.topic)
        if isinstance(address, str) or self.client is None:
            return
        message = self.broker.message(address, {}, will.payload, persistent=will.qos > 0)
        message.qos = will.qos
        try:
            self.client.send(message, retain=will.retain)  # authorized like any publish, retained value included
        except CoreError as exc:
            self.log.warning("mqtt_will_refused", client_id=self.client_id, topic=will.topic[:200], reason=exc.reason)
            return
        if will.retain:
            self._retain_refused(message)
        self.log.info("mqtt_will_published", client_id=self.client_id, topic=will.topic[:200])

    def _retain_refused(self, message: Message) -> None:
        """The broker's bounds did not let ``message`` be kept as its topic's
        retained value (the core counted it); it was still published: 3.1.1
        has no way to say no, so the refusal is logged (once per connection)."""
        reason = self.client.retain_refusal if self.client is not None else None
        if reason is not None and not self._retain_refused_logged:
            self._retain_refused_logged = True
            self.log.warning("retained_refused", client_id=self.client_id, topic=topics.from_address(message.address)[:200],
                             reason=reason)

    def _on_error(self, exc: Exception, packet: Any) -> None:
        """The one mapping of what a packet (or the codec) raised onto the
        wire: a CONNACK code if the codec names one before CONNECT, then close."""
        if isinstance(exc, codec.ProtocolError):
            code = exc.reason_code if self.codec.protocol_level == 5 else exc.return_code
            if code is not None and self.skeleton.state is State.AWAITING_CONNECT:
                self.outbox.append(self.codec.send(packets.ConnAck(False, code)))
            self._fail(exc.message, None)
        else:
            assert isinstance(exc, CoreError)
            self._fail(exc.reason, packet)

    def _unexpected(self, packet: Any) -> None:
        self._fail(f"unexpected {type(packet).__name__} packet", packet)

    def _peer_closed(self) -> None:
        self.skeleton.process()  # what arrived complete before the EOF still counts
        if not self.closed:
            self.close("peer closed the connection" + (" mid-packet" if self.codec.mid_packet else ""))

    def _refuse(self, code: int, reason: str) -> None:
        self.outbox.append(self.codec.send(packets.ConnAck(False, code)))
        self._fail(reason, None)

    def _fail(self, reason: str, packet: Any = None) -> None:
        """Log once and close: MQTT 3.1.1 has no error packet, the close is the answer."""
        self.log.warning("packet_rejected", packet=type(packet).__name__ if packet is not None else None, reason=reason)
        self.close(reason)


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
        packets.Subscribe: MqttSession._on_subscribe,
        packets.Unsubscribe: MqttSession._on_unsubscribe,
        packets.PingReq: MqttSession._on_pingreq,
        packets.Disconnect: MqttSession._on_disconnect,
    },
    State.CLOSED: {},
}
