"""STOMP semantics: frames in, core calls out; core deliveries in, frames out.

Synchronous and socket-free.  The server feeds bytes to :meth:`receive_data`,
drains :attr:`outbox`, and drives timers through :meth:`next_deadline` and
:meth:`on_deadline`.  Every error a client causes goes through :meth:`_fail`,
the one place that puts an ERROR frame on the wire and logs it.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Callable
from typing import Any

from core import names
from core.authorization import ANONYMOUS_PRINCIPAL, Principal
from core.broker import Broker
from core.clients import Client
from core.durables import RESERVED_PREFIXES, USER_PREFIX
from core.errors import CoreError, InvalidDestination, UnknownMessage, UnknownSubscription
from core.messages import DEFAULT_PRIORITY, MAX_PRIORITY, Message
from core.ports import Clock
from core.selectors import Selector, SelectorError, compile_selector
from core.subscriptions import AckMode, Subscription
from gateway.auth import AccessDenied, VerificationPending
from gateway.liveness import Liveness
from gateway.outbox import Outbox
from gateway.stomp import codec, frames

SERVER_NAME = "gateway/0.1.0"
ACK_MODES = {mode.value: mode for mode in AckMode}
# Headers a SEND carries that are not the application's: the transport's own,
# the ones mapped onto message fields, and the ones the broker sets on MESSAGE
# (a producer's values for those are dropped).
_SEND_OWN_HEADERS = frozenset(
    {
        "destination", "receipt", "transaction", "content-length",
        "persistent", "priority", "expires", "expiration",
        "message-id", "subscription", "ack", "redelivered", "timestamp", "x-delivery-count",
    }
)


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


class State(enum.Enum):
    AWAITING_CONNECT = "awaiting-connect"
    CONNECTED = "connected"
    CLOSED = "closed"


# Frames accepted in each state: anything else is a protocol error.
_ALLOWED: dict[State, frozenset[type[frames.Frame]]] = {
    State.AWAITING_CONNECT: frozenset({frames.Connect, frames.Stomp}),
    State.CONNECTED: frozenset(
        {
            frames.Send,
            frames.Subscribe,
            frames.Unsubscribe,
            frames.Ack,
            frames.Nack,
            frames.Begin,
            frames.Commit,
            frames.Abort,
            frames.Disconnect,
        }
    ),
    State.CLOSED: frozenset(),
}


class FrameRejected(Exception):
    """A well-formed frame the session refuses; ``reason`` goes in the ERROR."""

    def __init__(self, reason: str, **headers: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.headers = headers


class _SubscriptionState:
    """What the session keeps per STOMP subscription: the id and the
    pre-encoded start of each MESSAGE frame for it."""

    __slots__ = ("id", "number", "prefix", "ack_prefix", "core")

    def __init__(self, sub_id: str, number: int, prefix: bytes, ack_prefix: str | None) -> None:
        self.id = sub_id
        self.number = number
        self.prefix = prefix
        self.ack_prefix = ack_prefix
        self.core: Subscription | None = None


def _selector(frame: frames.Frame) -> Selector | None:
    """The SUBSCRIBE's JMS selector, compiled once; an invalid one is refused
    with where it failed."""
    text = frame.headers.get("selector")
    if text is None or not text.strip():
        return None
    try:
        return compile_selector(text)
    except SelectorError as exc:
        raise FrameRejected(f"invalid selector at character {exc.position}: {exc.reason}") from None


def _require(frame: frames.Frame, name: str) -> str:
    value = frame.headers.get(name)
    if value is None:
        raise FrameRejected(f"{frame.command} frame requires a '{name}' header")
    return value


def _int_header(frame: frames.Frame, name: str, default: int) -> int:
    return _int_value(name, frame.headers.get(name), default)


def _int_value(name: str, value: str | None, default: int) -> int:
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise FrameRejected(f"header '{name}' must be an integer, not {value[:40]!r}") from None


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
    ) -> None:
        self.broker = broker
        self.clock = clock
        self.settings = settings
        self.conn_id = conn_id
        self.log = log
        self.admit = admit
        self.codec = codec.StompConnection(
            codec.Role.SERVER,
            max_frame_bytes=settings.preconnect_max_frame_bytes,
            max_headers=settings.preconnect_max_headers,
            max_header_bytes=settings.preconnect_max_header_bytes,
        )
        self.outbox = Outbox(settings.outbox_high_water_bytes)
        self.state = State.AWAITING_CONNECT
        self.client: Client | None = None
        self.version = "1.0"
        self.close_reason: str | None = None
        self._subs: dict[str, _SubscriptionState] = {}
        self._subs_by_number: dict[str, _SubscriptionState] = {}
        self._sub_numbers = 0
        self.live = Liveness(clock, settings.connect_timeout_s)
        self._last_write = self.live.opened_at
        self._send_interval_s = 0.0
        self._paused = False
        self._handlers: dict[type[frames.Frame], Callable[[frames.Frame], None]] = {
            frames.Connect: self._on_connect,
            frames.Stomp: self._on_connect,
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

    # -- the server's side -------------------------------------------------

    @property
    def closed(self) -> bool:
        """No more input will be processed; flush the outbox and close."""
        return self.state is State.CLOSED

    def receive_data(self, data: bytes) -> None:
        if self.state is State.CLOSED:
            return
        self.live.heard()
        if not data:
            self.codec.receive_data(b"")
            self.close("peer closed the connection" + (" mid-frame" if self.codec.mid_frame else ""))
            return
        self.codec.receive_data(data)
        self._process()

    @property
    def wants_input(self) -> bool:
        """False while reading more would only buffer: the outbox is not being
        read, or the core is holding this producer back."""
        return not self.live.blocked and not self.outbox.full

    def resume_input(self) -> None:
        """Handle the frames that arrived before producing was held back (or
        while a CONNECT's password was being checked, or a SEND waited out the
        disk alarm: that frame first)."""
        if self.state is not State.CLOSED and not self.live.blocked:
            if self.live.deferred is not None:
                self._process(self.live.take_deferred())
            elif self.codec.buffered_bytes:
                self._process()

    def _process(self, replay: frames.Frame | None = None) -> None:
        handlers = self._handlers
        frame: frames.Frame | None = None
        receipt: str | None = None
        events = self.codec.events() if replay is None else itertools.chain((replay,), self.codec.events())
        try:
            for frame in events:
                # Captured first: a handler may pop it, and an ERROR must still echo it.
                receipt = frame.headers.get("receipt")
                frame.receipt = receipt
                kind = type(frame)
                if kind not in _ALLOWED[self.state]:
                    self._reject_out_of_state(frame)
                    return
                handlers[kind](frame)
                if self.state is State.CLOSED:
                    return
                if self.live.hold_if_blocked(self.client):
                    return
        except codec.RemoteProtocolError as exc:
            self._fail(exc.message, None, exc.headers)
        except FrameRejected as exc:
            self._fail(exc.reason, frame, exc.headers, receipt)
        except CoreError as exc:
            self._fail(exc.reason, frame, None, receipt)

    def next_deadline(self) -> float | None:
        if self.state is State.CLOSED:
            return None
        connected = self.state is State.CONNECTED
        deadlines = self.live.deadlines(connected, self.client)
        if connected and self._send_interval_s:
            deadlines.append(self._last_write + self._send_interval_s)
        return min(deadlines) if deadlines else None

    def on_deadline(self, now: float) -> None:
        if self.state is State.CLOSED:
            return
        connected = self.state is State.CONNECTED
        reason = self.live.expired(now, connected, self.client, self.wants_input, self.log)
        if reason is not None:
            self._fail(("heart-beat " if connected else "") + reason, None)
            return
        if not connected:
            return
        if self._send_interval_s and now >= self._last_write + self._send_interval_s:
            # Output already waiting will do as a heart-beat once written.
            if not self.outbox:
                self.outbox.append(codec.StompConnection.heartbeat())
            self._last_write = now

    def on_drained(self) -> None:
        """The writer put outbox bytes on the wire."""
        self._last_write = self.clock.monotonic()
        if self._paused and self.outbox.nbytes < self.settings.outbox_high_water_bytes // 2:
            self._paused = False
            if self.client is not None:
                self.client.resume()

    def shutdown(self, reason: str) -> None:
        """The broker is stopping: tell the client, then close."""
        if self.state is not State.CLOSED:
            self._fail(reason, None)

    def storage_failed(self, first_lsn: int, last_lsn: int, reason: str) -> None:
        """The store could not write these LSNs: a receipt waiting on one is
        withdrawn, and the client is told with an ERROR instead, which names
        them: the first as its receipt-id (STOMP allows one), all in the body,
        so a producer with many SENDs in flight knows which failed."""
        withdrawn = self.outbox.drop_gated(first_lsn, last_lsn)
        if withdrawn and self.state is not State.CLOSED:
            receipts = [r for r in withdrawn if r is not None]
            body = "".join(f"receipt {r} withdrawn: not stored\n" for r in receipts).encode()
            more = f" (receipts {', '.join(receipts[:5])}{', ...' if len(receipts) > 5 else ''})" if len(receipts) > 1 else ""
            self._fail(f"the store could not write this connection's messages: {reason}{more}", None,
                       receipt=receipts[0] if receipts else None, body=body)

    def close(self, reason: str) -> None:
        """The connection is gone (or going): release everything it held."""
        if self.close_reason is None:
            self.close_reason = reason
        self.state = State.CLOSED
        if self.client is not None:
            self.client.close()

    # -- Sink --------------------------------------------------------------

    @property
    def accepting(self) -> bool:
        if self.outbox.nbytes < self.settings.outbox_high_water_bytes:
            return True
        self._paused = True
        return False

    def unblocked(self) -> None:
        self.live.release()

    def deliver(self, subscription: Subscription, message: Message) -> None:
        state: _SubscriptionState = subscription.token
        wire = message.wire
        if wire is None or wire[0] != self.version:
            wire = message.wire = (self.version, self._encode_common(message))
        common = wire[1]
        body = message.body
        if state.ack_prefix is None:
            self.outbox.extend((state.prefix, common, body, b"\x00"), len(state.prefix) + len(common) + len(body) + 1)
        else:
            ack = f"ack:{state.ack_prefix}{self.codec.escape(message.id)}\n".encode()
            self.outbox.extend(
                (state.prefix, ack, common, body, b"\x00"),
                len(state.prefix) + len(ack) + len(common) + len(body) + 1,
            )

    def _encode_common(self, message: Message) -> bytes:
        """Every MESSAGE header that does not depend on the subscription, once per message."""
        esc = self.codec.escape
        address = message.address
        # A temporary destination's owner (its only reader) sees the name it used.
        destination = names.owner_name(address) if address.is_temporary else address.text
        lines = [
            f"message-id:{esc(message.id)}",
            f"destination:{esc(destination)}",
            f"timestamp:{message.timestamp}",
            f"expires:{message.expires}",
            f"priority:{message.priority}",
        ]
        if message.persistent:
            lines.append("persistent:true")
        if message.redeliveries:
            lines.append("redelivered:true")
            lines.append(f"x-delivery-count:{message.redeliveries}")
        else:
            lines.append("redelivered:false")
        for key, value in message.headers.items():
            lines.append(f"{esc(key)}:{esc(value)}")
        lines.append(f"content-length:{len(message.body)}\n\n")
        return "\n".join(lines).encode()

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
            if not pending.start(self.live.release):
                raise FrameRejected("the broker is busy checking logins; try again") from None
            self.live.defer(frame)
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
        self._send_interval_s = send_ms / 1000
        self.live.silence_s = receive_ms * self.settings.heartbeat_grace / 1000

        self.version = version
        self.codec.set_version(version)
        self.codec.max_frame_bytes = self.settings.max_frame_bytes
        self.codec.max_headers = self.settings.max_headers
        self.codec.max_header_bytes = self.settings.max_header_bytes
        self.client = self.broker.open_client(self, client_id=headers.get("client-id"), principal=principal)
        self.state = State.CONNECTED
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
        destination = headers.get("destination")
        if destination is None:
            raise FrameRejected("SEND frame requires a 'destination' header")
        address = names.parse(destination)
        if isinstance(address, str):
            raise InvalidDestination(f"invalid destination {destination[:80]!r}: {address}")
        if headers.get("persistent") == "true" and self.client.held_for_disk(address):  # type: ignore[union-attr]
            # The disk alarm: not stored, not receipted; reading stops, and
            # this frame is handled again once free space is back.
            self.live.defer(frame)
            return
        persistent = False
        priority = DEFAULT_PRIORITY
        expires = 0
        transaction = None
        # Take out what the transport and the broker own; what remains is the
        # application's headers.  One set intersection finds them (hot path).
        for name in headers.keys() & _SEND_OWN_HEADERS:
            value = headers.pop(name)
            if name == "persistent":
                persistent = value == "true"
            elif name == "priority":
                priority = _int_value(name, value, DEFAULT_PRIORITY)
                if not 0 <= priority <= MAX_PRIORITY:
                    raise FrameRejected(f"priority must be 0 to {MAX_PRIORITY}")
            elif name == "expires":
                expires = _int_value(name, value, 0)
            elif name == "expiration":  # RabbitMQ: milliseconds to live
                ttl = _int_value(name, value, 0)
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
        message = self.broker.message(
            address, headers, frame.body, persistent=persistent, priority=priority, expires=expires
        )
        lsn = self.client.send(message, transaction)  # type: ignore[union-attr]
        receipt = frame.receipt
        if receipt is not None:
            self._receipt(receipt, lsn)

    def _on_subscribe(self, frame: frames.Frame) -> None:
        destination = _require(frame, "destination")
        address = names.parse(destination)
        if isinstance(address, str):
            raise InvalidDestination(f"invalid destination {destination[:80]!r}: {address}")
        # STOMP 1.0 made the id optional; the destination then names the subscription.
        sub_id = frame.headers.get("id") or (destination if self.version == "1.0" else _require(frame, "id"))
        if sub_id in self._subs:
            raise FrameRejected(f"subscription id {sub_id!r} is already in use on this connection")
        mode_name = frame.headers.get("ack", "auto")
        mode = ACK_MODES.get(mode_name)
        if mode is None:
            raise FrameRejected(f"unknown ack mode {mode_name[:40]!r}; use auto, client or client-individual")
        # ActiveMQ's names, and RabbitMQ's beside them.
        prefetch = _int_header(frame, "activemq.prefetchSize", _int_header(frame, "prefetch-count", 0))
        priority = _int_header(frame, "activemq.priority", _int_header(frame, "x-priority", 0))
        exclusive = frame.headers.get("activemq.exclusive") == "true"
        if prefetch < 0:
            raise FrameRejected("activemq.prefetchSize must not be negative")
        self._sub_numbers += 1
        number = str(self._sub_numbers)
        prefix = f"MESSAGE\nsubscription:{self.codec.escape(sub_id)}\n".encode()
        ack_prefix = number + "/" if (mode is not AckMode.AUTO and self.version == "1.2") else None
        state = _SubscriptionState(sub_id, self._sub_numbers, prefix, ack_prefix)
        self._subs[sub_id] = state
        self._subs_by_number[number] = state
        try:
            state.core = self.client.subscribe(  # type: ignore[union-attr]
                state, address, mode, prefetch, durable=self._durable_owner(frame, sub_id),
                selector=_selector(frame), priority=priority, exclusive=exclusive, start=False,
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

    def _durable_owner(self, frame: frames.Frame, sub_id: str) -> tuple[str, str] | None:
        """(client id, name) if the SUBSCRIBE asks for a durable subscription,
        in any of the three dialects users migrate from."""
        headers = frame.headers
        name = headers.get("activemq.subscriptionName") or headers.get("durable-subscription-name")
        if name is not None:  # ActiveMQ, Artemis: named within the connection's client-id
            client_id = self.client.client_id if self.client is not None else None
            if not client_id:
                raise FrameRejected("a durable subscription needs a client-id header on CONNECT")
            return client_id, name
        if "true" in (headers.get("durable"), headers.get("persistent")) and headers.get("auto-delete") != "true":
            # RabbitMQ: the subscription id names it, within the client-id if
            # there is one, else within the user's own scope, so one user's
            # id:sub-0 is not another's.  (Anonymous: the old broker-wide
            # scope, for an open broker; a secured one refuses it.)
            assert self.client is not None
            principal = self.client.principal
            scope = "" if principal is ANONYMOUS_PRINCIPAL else USER_PREFIX + principal.name
            return self.client.client_id or scope, sub_id
        return None

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

    def _acked_message(self, frame: frames.Frame) -> tuple[_SubscriptionState, str]:
        """Which subscription and message an ACK or NACK names, in any version's form."""
        headers = frame.headers
        if self.version == "1.2":
            ack_id = _require(frame, "id")
            number, _, message_id = ack_id.partition("/")
            state = self._subs_by_number.get(number)
            if state is None or not message_id:
                raise UnknownMessage(f"no message awaiting acknowledgement with ack id {ack_id[:80]!r}")
            return state, message_id
        message_id = _require(frame, "message-id")
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
        self.client.begin(_require(frame, "transaction"))  # type: ignore[union-attr]
        self._receipt_if_asked(frame)

    def _on_commit(self, frame: frames.Frame) -> None:
        transaction = _require(frame, "transaction")
        stored = self.client.stored_send(transaction)  # type: ignore[union-attr]
        if stored is not None and self.client.held_for_disk(stored):  # type: ignore[union-attr]
            # Sends taken before the disk alarm, committed during it: held
            # like a persistent SEND, and committed once space is back.
            self.live.defer(frame)
            return
        key = frame.headers.get("idempotency-key")
        if key is None:
            self._receipt_if_asked(frame, self.client.commit(transaction))  # type: ignore[union-attr]
            return
        lsn, duplicate = self.client.commit_once(transaction, key)  # type: ignore[union-attr]
        self._receipt_if_asked(frame, lsn, {"duplicate": "true"} if duplicate else None)

    def _on_abort(self, frame: frames.Frame) -> None:
        self.client.abort(_require(frame, "transaction"))  # type: ignore[union-attr]
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
        headers = {"receipt-id": receipt_id} if extra is None else {"receipt-id": receipt_id, **extra}
        self.outbox.append(self.codec.send(frames.Receipt(headers)), lsn, receipt_id)

    def _reject_out_of_state(self, frame: frames.Frame) -> None:
        if self.state is State.AWAITING_CONNECT:
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
