"""SUBSCRIBE and UNSUBSCRIBE, 3.1.1 and 5: each filter a core subscription.

A filter's subscription options byte (v5 §3.8.3.1; for 3.1.1 it is the QoS
alone) says its QoS, No Local, Retain As Published and Retain Handling; a v5
SUBSCRIBE may also carry a Subscription Identifier.  ``$share/{group}/{filter}``
joins the core's shared subscription group of that name (core.shared): each
message goes to one member.  A persistent session subscribes durably; the
durable subscription's name keeps what the session must know again when it
resumes, even after a restart: ``"{qos}:{filter}"`` as ever, or with v5
options ``"{qos},{options},{identifier}:{filter}"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from core.clients import Client
from core.errors import CoreError, InvalidDestination, InvalidRequest, LimitExceeded, NotAuthorized
from core.subscriptions import AckMode, Subscription
from gateway.mqtt import topics
from gateway.mqtt.codec import packets
from gateway.mqtt.codec import MqttConnection, validate_topic_filter
from gateway.mqtt.codec.properties import subscription_identifier_item
from gateway.mqtt.codec.reasons import ReasonCode as R
from gateway.mqtt.registry import OWNER_PREFIX
from gateway.mqtt.settings import MqttSettings
from gateway.session.outbox import Outbox

SHARE_PREFIX = "$share/"
RETAIN_ON_SUBSCRIBE, RETAIN_IF_NEW, RETAIN_NEVER = 0, 1, 2  # Retain Handling (v5 §3.8.3.1)
RETAIN_HANDLING_BITS = 0x30


class Token:
    """The session's token for one core subscription: what a delivery needs
    of the filter that matched."""

    __slots__ = ("filter", "options", "qos", "retain_as_published", "identifier", "item", "name")

    def __init__(self, topic_filter: str, options: int, identifier: int = 0, name: str = "") -> None:
        self.filter = topic_filter
        self.options = options  # the subscription options byte (3.1.1: the QoS)
        self.qos = options & 3
        self.retain_as_published = bool(options & packets.RETAIN_AS_PUBLISHED)
        self.identifier = identifier  # the v5 Subscription Identifier, 0 for none
        # Its property item, made once: every v5 delivery carries it [MQTT-3.3.4-3].
        self.item = subscription_identifier_item(identifier) if identifier else b""
        self.name = name  # the durable subscription's name, "" when not durable


class Subscribing(Protocol):
    """What SUBSCRIBE reads and sets of its session (gateway.mqtt.session)."""

    settings: MqttSettings
    codec: MqttConnection
    outbox: Outbox
    client: Client | None
    client_id: str
    clean_session: bool
    subs: dict[str, Token]
    log: Any
    peer: object | None

    def fail(self, reason: str, packet: Any = None, code: int | None = None) -> None: ...


def durable_name(qos: int, options: int, identifier: int, topic_filter: str) -> str:
    # Retain Handling is not kept: it acts once, at the SUBSCRIBE, so a client
    # resubscribing with 1 instead of 0 keeps its durable queue and backlog.
    options &= ~RETAIN_HANDLING_BITS
    if options == qos and not identifier:
        return f"{qos}:{topic_filter}"
    return f"{qos},{options},{identifier}:{topic_filter}"


def parse_durable_name(name: str) -> tuple[str, int, int]:
    """(filter, options, identifier) of a durable subscription's name; an
    unknown head reads as QoS 1 (what every persistent filter could hold)."""
    head, _, topic_filter = name.partition(":")
    parts = head.split(",")
    if len(parts) == 3 and all(part.isdigit() for part in parts):
        return topic_filter, int(parts[1]), int(parts[2])
    return topic_filter, int(head) if head in ("0", "1", "2") else 1, 0


def shared_parts(topic_filter: str) -> tuple[str | None, str] | str:
    """(group, filter) of a ``$share/`` filter, (None, filter) of any other,
    or why it is not valid [MQTT-4.8.2-1], [MQTT-4.8.2-2]."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None, topic_filter
    group, slash, rest = topic_filter[len(SHARE_PREFIX) :].partition("/")
    if not group or not slash or "+" in group or "#" in group:
        return "a shared subscription needs $share/{group}/{filter}, the group without + or #"
    return group, rest


def on_subscribe(session: Subscribing, packet: packets.Subscribe) -> None:
    v5 = session.peer is not None
    props = packet.properties
    identifier = props.subscription_identifiers[0] if props is not None and props.subscription_identifiers else 0
    codes = []
    lsn = 0
    # By filter: one repeated in the packet replaces itself [MQTT-3.8.4-3]
    # and gets the retained messages once, not once per repetition.
    started: dict[str, tuple[Subscription, bool]] = {}
    refused: list[tuple[str, str]] = []
    client = session.client
    assert client is not None
    for topic_filter, options in packet.topics:
        qos = options & 3
        parts = shared_parts(topic_filter)
        reason = parts if isinstance(parts, str) else validate_topic_filter(parts[1])
        if reason is None and not isinstance(parts, str) and parts[0] is not None and options & packets.NO_LOCAL:
            session.fail("No Local on a shared subscription", packet, R.PROTOCOL_ERROR)  # [MQTT-3.8.3-4]
            return
        existed = topic_filter in session.subs
        outcome: Subscription | tuple[int, str]
        if reason is not None:
            outcome = (R.TOPIC_FILTER_INVALID, reason)
        else:
            outcome = subscribe(session, topic_filter, options, identifier, start=False)
        if isinstance(outcome, tuple):
            refused.append((topic_filter, outcome[1]))
            codes.append(outcome[0] if v5 else packets.SUBACK_FAILURE)  # that filter alone fails
            started.pop(topic_filter, None)
            continue
        lsn = max(lsn, client.last_lsn)
        codes.append(qos)
        handling = (options >> 4) & 3
        retained = handling == RETAIN_ON_SUBSCRIBE or (handling == RETAIN_IF_NEW and not existed)
        started[topic_filter] = (outcome, retained and parts[0] is None)  # type: ignore[index]
    if refused:  # one line per packet, however many filters it refused
        session.log.info("mqtt_subscribe_refused", filter=refused[0][0][:200], reason=refused[0][1],
                         refused=len(refused), filters=len(codes))
    session.outbox.append(session.codec.send(packets.SubAck(packet.packet_id, codes)), lsn)
    for subscription, retained in started.values():  # after the SUBACK [MQTT-3.3.1-6]
        # A durable one's backlog, then the retained values its filter matches
        # (never for a shared one: v5 §4.8.2).
        client.start(subscription, retained=retained)


def subscribe(session: Subscribing, topic_filter: str, options: int, identifier: int = 0, *,
              start: bool = True) -> Subscription | tuple[int, str]:
    """The new subscription, or (v5 reason code, why) the core refused it."""
    client = session.client
    assert client is not None
    parts = shared_parts(topic_filter)
    assert not isinstance(parts, str)
    group, plain = parts
    pattern = topics.to_pattern(plain)
    if isinstance(pattern, str):
        # A valid MQTT filter the core cannot name (over names.MAX_NAME_CHARS
        # once mapped): refused for this filter alone [MQTT-3.8.4-1].
        return R.TOPIC_FILTER_INVALID, f"topic filter cannot be used: {pattern}"
    qos = options & 3
    name = "" if session.clean_session else durable_name(qos, options, identifier, topic_filter)
    existing = session.subs.get(topic_filter)
    if existing is not None:
        # [MQTT-3.8.4-3]: a new subscription replaces it, and no message may
        # be lost or sent twice for that.  The same one again (what a client
        # that keeps its session sends on every connect) keeps the core
        # subscription: what it has in flight stays in flight, under the same
        # packet ids.  Otherwise its unacknowledged messages go back to its
        # queue (kept, for a durable one) and come again as redeliveries.
        if existing.name == name and not (existing.options ^ options) & ~RETAIN_HANDLING_BITS:
            existing.options = options
            existing.identifier = identifier
            existing.item = subscription_identifier_item(identifier) if identifier else b""
            return client.subscription(existing)
        del session.subs[topic_filter]
        client.unsubscribe(existing, remove_durable=existing.name != name)
    mode = AckMode.AUTO if qos == 0 else AckMode.CLIENT_INDIVIDUAL
    token = Token(topic_filter, options, identifier, name)
    durable = (OWNER_PREFIX + session.client_id, name) if name else None
    try:
        subscription = client.subscribe(token, pattern, mode, session.settings.max_inflight, durable=durable,
                                        start=start, no_local=bool(options & packets.NO_LOCAL), shared=group)
    except NotAuthorized as exc:
        return R.NOT_AUTHORIZED, exc.reason
    except LimitExceeded as exc:
        return R.QUOTA_EXCEEDED, exc.reason
    except InvalidDestination as exc:  # (a $share group name too long, say)
        return R.TOPIC_FILTER_INVALID, exc.reason
    except InvalidRequest as exc:
        return R.IMPLEMENTATION_SPECIFIC_ERROR, exc.reason
    except CoreError as exc:
        return R.UNSPECIFIED_ERROR, exc.reason
    session.subs[topic_filter] = token
    if durable is not None:
        subscription.queue.configure(limit=session.settings.max_queued_messages)
    return subscription


def on_unsubscribe(session: Subscribing, packet: packets.Unsubscribe) -> None:
    client = session.client
    assert client is not None
    lsn = 0
    codes = []
    v5 = session.peer is not None
    if "" in packet.topics:  # no filter at all, not one that matches nothing [MQTT-4.7.3-1]
        session.fail("empty topic filter in UNSUBSCRIBE", packet, R.PROTOCOL_ERROR)  # before any is removed
        return
    for topic_filter in packet.topics:
        token = session.subs.pop(topic_filter, None)
        if token is not None:
            lsn = max(lsn, client.unsubscribe(token, remove_durable=True))
            codes.append(R.SUCCESS)
        elif validate_topic_filter(topic_filter) is not None:
            codes.append(R.TOPIC_FILTER_INVALID)  # ('a/#/b' cannot have been subscribed: say why)
        else:
            codes.append(R.NO_SUBSCRIPTION_EXISTED)
    reply = packets.UnsubAck(packet.packet_id, reason_codes=codes if v5 else [])
    session.outbox.append(session.codec.send(reply), lsn)


def resume(session: Subscribing, names: list[str], log: Callable[..., None]) -> None:
    """Subscribe again to what a kept session's durable subscriptions name."""
    for name in names:
        topic_filter, options, identifier = parse_durable_name(name)
        outcome = subscribe(session, topic_filter, options, identifier)
        if isinstance(outcome, tuple):
            log("mqtt_subscribe_refused", filter=topic_filter[:200], reason=outcome[1])

