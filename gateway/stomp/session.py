"""STOMP semantics: frames in, core calls out; core deliveries in, frames out.

Synchronous and socket-free.  The session's :class:`Skeleton` takes the
server's bytes and deadlines and hands each frame to this session's handler
table; what remains here is what STOMP says: the handlers, the heart-beat
negotiation and how a MESSAGE is encoded.  Every error a client causes goes
through :meth:`StompSession._fail`, the one place that puts an ERROR frame on
the wire and logs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from core import names
from core.authorization import ANONYMOUS_PRINCIPAL, Principal
from core.broker import Broker
from core.clients import Client
from core.durables import RESERVED_PREFIXES
from core.errors import CoreError, InvalidDestination, UnknownMessage, UnknownSubscription
from core.messages import DEFAULT_PRIORITY, MAX_PRIORITY, Message
from core.ports import Clock
from core.revocation import Revocation
from core.subscriptions import AckMode, Subscription
from gateway.auth import AccessDenied, VerificationPending
from gateway.session.skeleton import Dialect, Skeleton, State
from gateway.stomp import codec, delivery, frames
from gateway.stomp.delivery import SubscriptionState
from gateway.stomp.headers import (
    ACK_MODES, SEND_DROPPED_HEADERS, SEND_OWN_HEADERS, FrameRejected, durable_owner, int_header, int_value, require,
    selector,
)

SERVER_NAME = "gateway/0.1.0"


@dataclasses.dataclass(frozen=True)
class StompSettings:
    max_frame_bytes: int = codec.MAX_FRAME_BYTES
    max_headers: int = codec.MAX_HEADERS
    max_header_bytes: int = codec.MAX_HEADER_BYTES
    # Until CONNECT succeeds a peer is unknown: it gets much tighter limits.
    preconnect_max_frame_bytes: int = 64 * 1024
    preconnect_max_headers: int = 32
    preconnect_max_header_bytes: int = 8 * 1024
    connect_timeout_s: float = 10.0
    # What this server offers in CONNECTED heart-beat: the fastest it will send,
    # the fastest it wants to hear from the client (ms; 0 = never).
    heartbeat_send_ms: int = 1000
    heartbeat_receive_ms: int = 1000
    # A client silent for longer than the agreed interval times this is dropped.
    heartbeat_grace: float = 2.0
    outbox_high_water_bytes: int = 1024 * 1024


class StompSession:
    """One STOMP connection's protocol state; also the core's :class:`Sink` for it."""

    def __init__(
        self,
        broker: Broker,
        clock: Clock,
        settings: StompSettings,
        *,
        conn_id: str,
        log: Any,
        admit: Callable[[str | None, str | None], Principal] = lambda login, passcode: ANONYMOUS_PRINCIPAL,
        source: str | None = None,
    ) -> None:
        self.broker = broker
        self.clock = clock
        self.settings = settings
        self.conn_id = conn_id
        self.log = log
        self.admit = admit
        self.source = source  # the peer's host: an anonymous client's share of the broker's pools (core.tally)
        self.codec = codec.StompConnection(
            codec.Role.SERVER,
            max_frame_bytes=settings.preconnect_max_frame_bytes,
            max_headers=settings.preconnect_max_headers,
            max_header_bytes=settings.preconnect_max_header_bytes,
        )
        self.client: Client | None = None  # set once, at CONNECT
        self.version = "1.0"
        self._subs: dict[str, SubscriptionState] = {}
        self._subs_by_number: dict[str, SubscriptionState] = {}
        self._sub_numbers = 0
        # The transition table: the frames each state accepts (STOMP 1.2
        # §Connecting: CONNECT or STOMP first, and only once).
        connect: dict[type, Callable[..., None]] = {frames.Connect: self._on_connect, frames.Stomp: self._on_connect}
        connected: dict[type, Callable[..., None]] = {
            frames.Send: self._on_send,
            frames.Subscribe: self._on_subscribe,
            frames.Unsubscribe: self._on_unsubscribe,
            frames.Ack: self._on_ack,
            frames.Nack: self._on_nack,
            frames.Begin: self._on_begin,
            frames.Commit: self._on_commit,
            frames.Abort: self._on_abort,
            frames.Disconnect: self._on_disconnect,
        }
        dialect = Dialect(
            handlers={State.AWAITING_CONNECT: connect, State.CONNECTED: connected, State.CLOSED: {}},
            reject=self._reject_out_of_state,
            errors=(codec.RemoteProtocolError, FrameRejected, CoreError),
            on_error=self._on_error,
            fail=lambda reason: self._fail(reason, None),
            on_eof=self._peer_closed,
            silence="heart-beat",
            while_held=frozenset({frames.Disconnect}),
        )
        self.skeleton = Skeleton(
            self.codec, clock, log, dialect, outbox_high_water_bytes=settings.outbox_high_water_bytes,
            connect_timeout_s=settings.connect_timeout_s, heartbeat=codec.StompConnection.heartbeat(),
        )
        self.outbox = self.skeleton.outbox  # the same object, read on every delivery

    # -- what the server asks of the protocol -------------------------------

    @property
    def closed(self) -> bool:
        return self.skeleton.state is State.CLOSED

    @property
    def close_reason(self) -> str | None:
        return self.skeleton.close_reason

    def shutdown(self, reason: str) -> None:
        """The broker is stopping: tell the client, then close."""
        if not self.closed:
            self._fail(reason, None)

    def storage_failed(self, first_lsn: int, last_lsn: int, reason: str, *, stored: bool = False) -> None:
        """The store could not write these LSNs (``stored``: an HA primary wrote
        them, its backups did not confirm them): a receipt waiting on one is
        withdrawn, and the client is told with an ERROR instead, which names
        them: the first as its receipt-id (STOMP allows one), all in the body,
        so a producer with many SENDs in flight knows which failed."""
        withdrawn = self.outbox.drop_gated(first_lsn, last_lsn)
        if withdrawn and not self.closed:
            receipts = [r for r in withdrawn if r is not None]
            fate = "stored on the primary only (may yet be delivered, or lost in a failover)" if stored else "not stored"
            body = "".join(f"receipt {r} withdrawn: {fate}\n" for r in receipts).encode()
            more = f" (receipts {', '.join(receipts[:5])}{', ...' if len(receipts) > 5 else ''})" if len(receipts) > 1 else ""
            what = "stored on the primary only" if stored else "the store could not write this connection's messages"
            self._fail(f"{what}: {reason}{more}", None, receipt=receipts[0] if receipts else None, body=body)

    def revoked(self, revocation: Revocation) -> None:
        """A reload took rights this connection used (core.revocation): an ERROR
        naming them (each ended subscription in its body), logged, and the close."""
        if not self.closed:
            ended = "".join(f"subscription {s.token.id} to {s.address.text} ended\n" for s in revocation.subscriptions)
            self.outbox.append(self.codec.send(frames.Error({"message": revocation.reason}, ended.encode())))
            self.log.warning("access_revoked", **revocation.logged(revocation.destinations))
            self.close(revocation.reason)

    def close(self, reason: str) -> None:
        """The connection is gone (or going): release everything it held."""
        if self.skeleton.close(reason) and self.client is not None:
            self.client.close()

    def _peer_closed(self) -> None:
        self.close("peer closed the connection" + (" mid-frame" if self.codec.mid_frame else ""))

    # -- Sink --------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        if self.outbox.nbytes < self.settings.outbox_high_water_bytes:
            return True
        self.skeleton.paused = True
        return False

    def unblocked(self) -> None:
        self.skeleton.gate.release()

    def deliver(self, subscription: Subscription, message: Message) -> None:
        state: SubscriptionState = subscription.token
        wire = message.wire
        if wire is None or wire[0] != self.version:
            wire = message.wire = delivery.shared(message, self.version, self.codec.escape)
        _, shared, body = wire
        head = state.prefix
        if state.ack_prefix is not None:
            head += f"ack:{state.ack_prefix}{self.codec.escape(message.id)}\n".encode()
        if body is None:  # a small body, joined to the shared headers: one chunk
            data = head + shared
            self.outbox.extend((data,), len(data))
        else:
            self.outbox.extend((head, shared, body, b"\x00"), len(head) + len(shared) + len(body) + 1)

    # -- frame handlers ----------------------------------------------------

    def _on_connect(self, frame: frames.Frame) -> None:
        headers = frame.headers
        version = codec.negotiate_version(headers.get("accept-version"))
        if version is None:
            raise FrameRejected(
                "supported protocol versions are " + ",".join(codec.SUPPORTED_VERSIONS),
                version=",".join(codec.SUPPORTED_VERSIONS),
            )
        try:
            principal = self.admit(headers.get("login"), headers.get("passcode"))
        except VerificationPending as pending:
            if not pending.start(self.skeleton.gate.release):
                raise FrameRejected("the broker is busy checking logins; try again") from None
            self.skeleton.defer(frame)
            return
        except AccessDenied as exc:
            self.log.warning("login_refused", login=(headers.get("login") or "")[:80], kind=exc.kind, reason=exc.reason)
            raise FrameRejected(exc.reason) from None
        client_id = headers.get("client-id")
        if client_id is not None and client_id.startswith(RESERVED_PREFIXES):
            # Those name MQTT sessions and users' durable subscriptions.
            raise FrameRejected(f"client-id {client_id[:80]!r}: the prefixes {', '.join(RESERVED_PREFIXES)} are reserved")
        client_beat = headers.get("heart-beat", "0,0")
        try:
            cx, cy = (int(part) for part in client_beat.split(","))
            if cx < 0 or cy < 0:
                raise ValueError
        except ValueError:
            raise FrameRejected(f"invalid heart-beat header {client_beat[:40]!r}") from None
        sx, sy = self.settings.heartbeat_send_ms, self.settings.heartbeat_receive_ms
        # STOMP 1.2 §Heart-beating: each direction runs at the slower of what
        # one side can do and the other wants, or not at all if either says 0.
        send_ms = max(sx, cy) if sx and cy else 0
        receive_ms = max(cx, sy) if cx and sy else 0
        self.skeleton.beat.interval_s = send_ms / 1000
        self.skeleton.silence.limit_s = receive_ms * self.settings.heartbeat_grace / 1000

        self.version = version
        self.codec.set_version(version)
        self.codec.max_frame_bytes = self.settings.max_frame_bytes
        self.codec.max_headers = self.settings.max_headers
        self.codec.max_header_bytes = self.settings.max_header_bytes
        self.client = self.broker.open_client(self, client_id=headers.get("client-id"), principal=principal, source=self.source)
        self.skeleton.connected(self.client)
        reply = {"version": version, "session": self.conn_id, "server": SERVER_NAME, "heart-beat": f"{sx},{sy}"}
        self.outbox.append(self.codec.send(frames.Connected(reply)))
        self.log.info(
            "stomp_connected",
            version=version,
            client_id=headers.get("client-id"),
            user=principal.name,
            heartbeat=f"{send_ms},{receive_ms}",
        )

    def _on_send(self, frame: frames.Frame) -> None:
        headers = frame.headers
        # Kept before the headers are popped below, so an ERROR still echoes it.
        receipt = frame.receipt = headers.get("receipt")
        destination = headers.get("destination")
        if destination is None:
            raise FrameRejected("SEND frame requires a 'destination' header")
        address = names.parse(destination)
        if isinstance(address, str):
            raise InvalidDestination(f"invalid destination {destination[:80]!r}: {address}")
        if headers.keys() <= SEND_DROPPED_HEADERS:
            # The common SEND (destination, content-length, maybe a receipt):
            # no value to read and no application header to keep (hot path).
            message = self.broker.message(address, {}, frame.body)
            transaction = None
        else:
            if headers.get("persistent") == "true" and self.client.held_for_disk(address):  # type: ignore[union-attr]
                # The disk alarm: not stored, not receipted; reading stops, and
                # this frame is handled again once free space is back.
                self.skeleton.defer(frame)
                return
            message, transaction = self._message(address, headers, frame.body)
        lsn = self.client.send(message, transaction)  # type: ignore[union-attr]
        if receipt is not None:
            self._receipt(receipt, lsn)

    def _message(self, address: names.Address, headers: dict[str, str], body: bytes) -> tuple[Message, str | None]:
        """The message a SEND with these headers makes, and its transaction."""
        persistent = False
        priority = DEFAULT_PRIORITY
        expires = 0
        transaction = None
        # Take out what the transport and the broker own; what remains is the
        # application's headers.
        for name in SEND_OWN_HEADERS.intersection(headers):
            value = headers.pop(name)
            if name == "persistent":
                persistent = value == "true"
            elif name == "priority":
                priority = int_value(name, value, DEFAULT_PRIORITY)
                if not 0 <= priority <= MAX_PRIORITY:
                    raise FrameRejected(f"priority must be 0 to {MAX_PRIORITY}")
            elif name == "expires":
                expires = int_value(name, value, 0)
            elif name == "expiration":  # RabbitMQ: milliseconds to live
                ttl = int_value(name, value, 0)
                if ttl < 0:
                    raise FrameRejected("expiration must not be negative")
                expires = self.clock.wall_ms() + ttl
            elif name == "transaction":
                transaction = value
        reply_to = headers.get("reply-to")
        if reply_to is not None and reply_to.startswith("/temp-"):
            reply_address = names.parse(reply_to)
            if not isinstance(reply_address, str):
                # The responder gets the private name, which reaches this
                # connection's own queue whoever else uses the same name.
                headers["reply-to"] = self.client.temporary(reply_address).text  # type: ignore[union-attr]
        message = self.broker.message(address, headers, body, persistent=persistent, priority=priority, expires=expires)
        return message, transaction

    def _on_subscribe(self, frame: frames.Frame) -> None:
        destination = require(frame, "destination")
        address = names.parse(destination)
        if isinstance(address, str):
            raise InvalidDestination(f"invalid destination {destination[:80]!r}: {address}")
        # STOMP 1.0 made the id optional; the destination then names the subscription.
        sub_id = frame.headers.get("id") or (destination if self.version == "1.0" else require(frame, "id"))
        if sub_id in self._subs:
            raise FrameRejected(f"subscription id {sub_id!r} is already in use on this connection")
        mode_name = frame.headers.get("ack", "auto")
        mode = ACK_MODES.get(mode_name)
        if mode is None:
            raise FrameRejected(f"unknown ack mode {mode_name[:40]!r}; use auto, client or client-individual")
        # ActiveMQ's names, and RabbitMQ's beside them.
        prefetch = int_header(frame, "activemq.prefetchSize", int_header(frame, "prefetch-count", 0))
        priority = int_header(frame, "activemq.priority", int_header(frame, "x-priority", 0))
        exclusive = frame.headers.get("activemq.exclusive") == "true"
        if prefetch < 0:
            raise FrameRejected("activemq.prefetchSize must not be negative")
        self._sub_numbers += 1
        number = str(self._sub_numbers)
        prefix = delivery.prefix(sub_id, self.codec.escape)
        ack_prefix = number + "/" if (mode is not AckMode.AUTO and self.version == "1.2") else None
        state = SubscriptionState(sub_id, self._sub_numbers, prefix, ack_prefix)
        self._subs[sub_id] = state
        self._subs_by_number[number] = state
        try:
            state.core = self.client.subscribe(  # type: ignore[union-attr]
                state, address, mode, prefetch, durable=durable_owner(frame, sub_id, self.client),  # type: ignore[arg-type]
                selector=selector(frame), priority=priority, exclusive=exclusive, start=False,
                # ActiveMQ's noLocal (a queue ignores it there); a shared group (core.shared) by name.
                no_local=frame.headers.get("activemq.noLocal") == "true" and not address.is_queue,
                shared=frame.headers.get("shared-subscription-name") or None,
            )
        except CoreError:
            del self._subs[sub_id]
            del self._subs_by_number[number]
            raise
        # The RECEIPT says the subscription is in place, so it goes before the
        # backlog it releases; a durable one's waits in the outbox until the
        # subscription is on disk, holding those messages behind it.
        self._receipt_if_asked(frame, self.client.last_lsn)  # type: ignore[union-attr]
        self.client.start(state.core)  # type: ignore[union-attr]

    def _on_unsubscribe(self, frame: frames.Frame) -> None:
        sub_id = frame.headers.get("id")
        if sub_id is None and self.version == "1.0":
            sub_id = frame.headers.get("destination")
        if sub_id is None:
            raise FrameRejected("UNSUBSCRIBE frame requires an 'id' header")
        headers = frame.headers
        name = headers.get("activemq.subscriptionName") or headers.get("durable-subscription-name")
        state = self._subs.pop(sub_id, None)
        if state is None:
            if name is not None and self.client is not None and self.client.client_id:
                # Removing an offline durable subscription needs no live one.
                lsn = self.client.remove_durable(self.client.client_id, name)
                self._receipt_if_asked(frame, lsn)
                return
            raise UnknownSubscription(f"no subscription {sub_id!r} on this connection")
        del self._subs_by_number[str(state.number)]
        remove = name is not None or "true" in (headers.get("durable"), headers.get("persistent"))
        lsn = self.client.unsubscribe(state, remove_durable=remove)  # type: ignore[union-attr]
        self._receipt_if_asked(frame, lsn)

    def _on_ack(self, frame: frames.Frame) -> None:
        state, message_id = self._acked_message(frame)
        lsn = self.client.ack(state, message_id, frame.headers.get("transaction"))  # type: ignore[union-attr]
        self._receipt_if_asked(frame, lsn)

    def _on_nack(self, frame: frames.Frame) -> None:
        state, message_id = self._acked_message(frame)
        lsn = self.client.nack(state, message_id, frame.headers.get("transaction"))  # type: ignore[union-attr]
        self._receipt_if_asked(frame, lsn)

    def _acked_message(self, frame: frames.Frame) -> tuple[SubscriptionState, str]:
        """Which subscription and message an ACK or NACK names, in any version's form."""
        headers = frame.headers
        if self.version == "1.2":
            ack_id = require(frame, "id")
            number, _, message_id = ack_id.partition("/")
            state = self._subs_by_number.get(number)
            if state is None or not message_id:
                raise UnknownMessage(f"no message awaiting acknowledgement with ack id {ack_id[:80]!r}")
            return state, message_id
        message_id = require(frame, "message-id")
        sub_id = headers.get("subscription")
        if sub_id is None:
            if self.version != "1.0":
                raise FrameRejected(f"{frame.command} frame requires a 'subscription' header")
            # 1.0 has no subscription header on ACK: find who holds the message.
            for state in self._subs.values():
                if state.core is not None and message_id in state.core.unacked:
                    return state, message_id
            raise UnknownMessage(f"message {message_id[:80]!r} is not awaiting acknowledgement")
        found = self._subs.get(sub_id)
        if found is None:
            raise UnknownSubscription(f"no subscription {sub_id!r} on this connection")
        return found, message_id

    def _on_begin(self, frame: frames.Frame) -> None:
        self.client.begin(require(frame, "transaction"))  # type: ignore[union-attr]
        self._receipt_if_asked(frame)

    def _on_commit(self, frame: frames.Frame) -> None:
        transaction = require(frame, "transaction")
        stored = self.client.stored_send(transaction)  # type: ignore[union-attr]
        if stored is not None and self.client.held_for_disk(stored):  # type: ignore[union-attr]
            # Sends taken before the disk alarm, committed during it: held
            # like a persistent SEND, and committed once space is back.
            self.skeleton.defer(frame)
            return
        key = frame.headers.get("idempotency-key")
        client = self.client
        assert client is not None  # CONNECTED: the only state with COMMIT in its table
        extra: dict[str, str] = {}
        if key is None:
            lsn = client.commit(transaction)
        else:
            lsn, duplicate = client.commit_once(transaction, key)
            if duplicate:
                extra["duplicate"] = "true"
        if client.blocked_on:
            # The commit filled a queue: say so, since reading stops now (only
            # a DISCONNECT is still handled) and the client may wait long.
            extra["held-by"] = ", ".join(
                f"{queue.address.text} (high-water mark {queue.high_water} messages)" for queue in client.blocked_on
            )
        self._receipt_if_asked(frame, lsn, extra or None)

    def _on_abort(self, frame: frames.Frame) -> None:
        self.client.abort(require(frame, "transaction"))  # type: ignore[union-attr]
        self._receipt_if_asked(frame)

    def _on_disconnect(self, frame: frames.Frame) -> None:
        self._receipt_if_asked(frame)
        self.close("client sent DISCONNECT")

    # -- replies -----------------------------------------------------------

    def _receipt_if_asked(self, frame: frames.Frame, lsn: int = 0, extra: dict[str, str] | None = None) -> None:
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            self._receipt(receipt, lsn, extra)

    def _receipt(self, receipt_id: str, lsn: int, extra: dict[str, str] | None = None) -> None:
        if extra is None:
            data = self.codec.receipt(receipt_id)
        else:
            data = self.codec.send(frames.Receipt({"receipt-id": receipt_id, **extra}))
        self.outbox.append(data, lsn, receipt_id)

    def _on_error(self, exc: Exception, frame: frames.Frame | None) -> None:
        """The one mapping of what a frame (or the codec) raised onto an ERROR."""
        if isinstance(exc, codec.RemoteProtocolError):
            self._fail(exc.message, None, exc.headers)
        elif isinstance(exc, FrameRejected):
            self._fail(exc.reason, frame, exc.headers, frame.receipt if frame is not None else None)
        else:
            assert isinstance(exc, CoreError)
            self._fail(exc.reason, frame, None, frame.receipt if frame is not None else None)

    def _reject_out_of_state(self, frame: frames.Frame) -> None:
        if self.skeleton.state is State.AWAITING_CONNECT:
            self._fail(f"expected CONNECT or STOMP, not {frame.command}", frame)
        else:
            self._fail(f"unexpected {frame.command} frame: the connection is already established", frame)

    def _fail(
        self,
        reason: str,
        frame: frames.Frame | None,
        headers: dict[str, str] | None = None,
        receipt: str | None = None,
        body: bytes = b"",
    ) -> None:
        """Send one ERROR frame, log it once, and close this connection."""
        reply = {"message": reason}
        if headers:
            reply.update(headers)
            reply["message"] = reason
        if receipt is None and frame is not None:
            receipt = frame.headers.get("receipt")
        if receipt is not None:
            reply["receipt-id"] = receipt
        if frame is not None:
            body = f"The rejected frame was {frame.command}.\n".encode()
        self.outbox.append(self.codec.send(frames.Error(reply, body)))
        self.log.warning("frame_rejected", frame=frame.command if frame is not None else None, reason=reason)
        self.close(reason)
