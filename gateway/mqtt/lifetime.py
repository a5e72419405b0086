"""How long an MQTT 5 session and its will outlive the connection.

A v5 session with a Session Expiry Interval n > 0 is kept n seconds after its
connection ends (0xFFFFFFFF: for ever), then it ends [MQTT-3.1.2-23]; a
reconnect under its client id before then resumes it and calls the end off.
A will with a Will Delay Interval is published that long after the
connection ended, or when the session ends if that is sooner, and not at
all if the client id connects again first [MQTT-3.1.3-9].

:class:`Lifetimes` keeps those deadlines (wall clock, ms since the epoch) in
one heap, so the broker's timer task sleeps until the earliest and is woken
when an earlier one is added.  A session's end is also noted in the store
(``EXPIRY_NOTES``), so it holds across a restart: ``in:<s>:<owner>`` while
the connection is open (a crash ends it: the session ends s seconds after
the restart), ``at:<ms>:<owner>`` once it closed.  A pending will is not
noted: a will is a last word, lost with the process like any message held
only in memory.  Sans-IO: the caller passes the time and does the ending.

A pending will is held in memory between its connection's end and its
publication, so the wills pending are a pool: each holder (a user; anonymous
clients: per source address, core.tally) has a share of them, in wills and
bytes (:func:`will_bytes`), and the broker a bound on all.  A v5 CONNECT whose
delayed will the holder's share has no room for is refused (CONNACK 0x97);
one that found room but whose connection ends when the share has filled
meanwhile has its will published at once, not held: a will is the client's
last word, and it is said early rather than not at all.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from core.broker import Broker
from core.clients import Client
from core.errors import CoreError
from core.messages import Message
from core.tally import UNKNOWN_HOLDER, Holder, Shares
from gateway.mqtt import metadata, topics
from gateway.mqtt.codec import packets
from gateway.mqtt.settings import MqttSettings

EXPIRY_NOTES = "mqtt-expiry"  # the store's namespace: client id -> when its kept session ends
NEVER = 0xFFFFFFFF  # a Session Expiry Interval that never ends the session (v5 §3.1.2.11.2)
OPEN, CLOSED = "in", "at"  # a note's kinds: seconds after its connection ends, or a deadline
END, WILL = 0, 1  # what a heap entry is due for
COMPACT_SLACK = 64  # stale heap entries tolerated beyond the live ones before a rebuild


class PendingWill:
    """A will authorized when its connection closed, published later without
    the client: its message (origin set, for No Local), whether it is to be
    retained, and its Message Expiry Interval, counted from publication."""

    __slots__ = ("message", "retain", "expiry_s", "topic", "holder", "nbytes")

    def __init__(self, message: Message, retain: bool, expiry_s: int, topic: str, holder: Holder = UNKNOWN_HOLDER,
                 nbytes: int = 0) -> None:
        self.message = message
        self.retain = retain
        self.expiry_s = expiry_s
        self.topic = topic
        self.holder = holder  # whose share of the pending wills it takes while delayed
        self.nbytes = nbytes  # what it counts for there (will_bytes)


def will_bytes(will: packets.Will) -> int:
    """What a will counts for in the delayed wills' bytes: its payload,
    topic and the properties it keeps (they become the message's headers),
    each as long as on the wire."""
    size = len(will.payload) + len(will.topic.encode())
    props = will.properties
    if props is not None:
        for text in (props.content_type, props.response_topic):
            size += len(text.encode()) if text is not None else 0
        size += len(props.correlation_data or b"")
        size += sum(len(name.encode()) + len(value.encode()) for name, value in props.user_properties)
    return size


def will_refusal(lifetimes: Lifetimes, holder: Holder, nbytes: int, settings: MqttSettings,
                 client_id: str | None = None) -> str | None:
    """Why one more pending will of ``nbytes`` from ``holder`` may not be
    held (its share, or the broker's bound), or None; ``client_id``'s own
    pending will, which a new one would call off, makes room."""
    own, all_ = (1, nbytes), (1, nbytes)  # (wills, bytes) more for the holder, for the broker
    pending = lifetimes.wills.get(client_id) if client_id is not None else None
    if pending is not None:
        all_ = (0, nbytes - pending[1].nbytes)
        if pending[1].holder == holder:
            own = all_
    shares = lifetimes.will_shares
    reason = shares.refusal(holder, settings.max_delayed_wills_per_user, settings.max_delayed_will_bytes_per_user,
                            items=own[0], nbytes=own[1], bytes_setting="max_delayed_will_bytes_per_user")
    if reason is None:
        reason = shares.total_refusal(settings.max_delayed_wills, settings.max_delayed_will_bytes, items=all_[0],
                                      nbytes=all_[1], bytes_setting="max_delayed_will_bytes")
    return reason


def prepare_will(broker: Broker, client: Client, will: packets.Will) -> PendingWill | str:
    """``will`` as a message ``client`` may publish (authorized now, while
    the client is known), or why it cannot be."""
    address = topics.to_address(will.topic)
    if isinstance(address, str):
        return address
    props = will.properties
    headers = metadata.to_headers(props) if props is not None else {}
    if isinstance(headers, str):
        return headers
    try:
        client.authorize("write", address)  # as any publish, the retained value included
        message = broker.message(address, headers, will.payload, will.qos > 0)
    except CoreError as exc:
        return exc.reason
    message.qos = will.qos
    message.origin = client.origin
    if will.retain:
        message.retain_published = True
    expiry = props.message_expiry_interval if props is not None else None
    return PendingWill(message, will.retain, expiry or 0, will.topic, client.holder, will_bytes(will))


def publish_will(broker: Broker, will: PendingWill, now_ms: int, producer: Client | None = None) -> int:
    """Publish ``will`` now (``producer``: the client, if it is still
    there to be held or told of a refused retained value); may raise the
    core's refusal (CoreError).  Returns the LSN that makes it durable."""
    if will.expiry_s:
        will.message.expires = now_ms + will.expiry_s * 1000
    return broker.publish(will.message, producer, retain=will.retain, holder=will.holder)


def release_will(broker: Broker, client_id: str, will: PendingWill, now_ms: int, log: Any,
                 producer: Client | None = None, *, delayed: bool = False) -> None:
    """Publish ``will`` now and log it, or why the core refused it: at a
    connection's end (``producer``: its client, told of a retained value it
    could not keep) or when its delay or its session ran out (``delayed``)."""
    if producer is not None:
        producer.retain_refusal = None
    try:
        publish_will(broker, will, now_ms, producer)
    except CoreError as exc:
        log.warning("mqtt_will_refused", client_id=client_id, topic=will.topic[:200], reason=exc.reason)
        return
    if producer is not None and producer.retain_refusal is not None:  # routed, not kept: counted by the core, said here
        log.warning("retained_refused", client_id=client_id, topic=will.topic[:200], reason=producer.retain_refusal)
    if delayed:
        log.info("mqtt_will_published", client_id=client_id, topic=will.topic[:200], delayed=True)
    else:
        log.info("mqtt_will_published", client_id=client_id, topic=will.topic[:200])


def will_delay(will: packets.Will) -> int:
    """The will's Will Delay Interval in seconds (0: none)."""
    props = will.properties
    return props.will_delay_interval or 0 if props is not None else 0


def expiry_note(kind: str, value: int, owner: str | None) -> bytes:
    return f"{kind}:{value}:".encode() + (owner or "").encode()


def read_note(value: bytes, now_ms: int) -> tuple[int, str] | None:
    """(deadline, owner) of an ``EXPIRY_NOTES`` value read at start-up
    (``now_ms``), or None if it is not one."""
    kind, _, rest = value.decode("utf-8", "replace").partition(":")
    number, colon, owner = rest.partition(":")
    if not colon or not number.isdigit() or kind not in (OPEN, CLOSED):
        return None
    due = now_ms + int(number) * 1000 if kind == OPEN else int(number)
    return due, owner  # "" is anonymous's (core.durables.ANONYMOUS_OWNER)


def _nothing() -> None:
    return None


class Lifetimes:
    """The deadlines of kept sessions' ends (``ends``) and of pending wills
    (``wills``) by client id, at most one of each per client id: bounded by
    the kept sessions (max_persistent_sessions) and the connections closed
    within a will delay, and the wills in their holders' shares
    (``will_shares``, see :func:`will_refusal`).  ``noted``: the client ids
    with an ``EXPIRY_NOTES`` entry in the store (so one without is not
    deleted on every connect)."""

    def __init__(self) -> None:
        self.ends: dict[str, int] = {}
        self.wills: dict[str, tuple[int, PendingWill]] = {}
        self.will_shares = Shares("delayed wills")
        self.noted: set[str] = set()
        self._heap: list[tuple[int, int, str]] = []  # (due, END or WILL, client id); stale entries skipped
        self.on_earlier: Callable[[], None] = _nothing  # the timer's wake-up, set by whoever runs it

    def __len__(self) -> int:
        """Entries held, called off ones included (bounded: see _push)."""
        return len(self._heap)

    def end_at(self, client_id: str, due_ms: int) -> None:
        """``client_id``'s kept session ends at ``due_ms``."""
        self.ends[client_id] = due_ms
        self._push(due_ms, END, client_id)

    def will_at(self, client_id: str, due_ms: int, will: PendingWill) -> None:
        """Publish ``will`` at ``due_ms`` unless ``client_id`` connects first."""
        self._forget_will(client_id)
        self.wills[client_id] = (due_ms, will)
        self.will_shares.take(will.holder, will.nbytes)
        self._push(due_ms, WILL, client_id)

    def resume(self, client_id: str) -> PendingWill | None:
        """``client_id`` connected again: its session's end is called off;
        returns its pending will, called off too (the caller publishes it if
        the new connection ends the session: Clean Start)."""
        self.ends.pop(client_id, None)
        return self._forget_will(client_id)

    def _forget_will(self, client_id: str) -> PendingWill | None:
        """``client_id``'s pending will, no longer pending (out of its share)."""
        pending = self.wills.pop(client_id, None)
        if pending is None:
            return None
        will = pending[1]
        self.will_shares.give_back(will.holder, will.nbytes)
        return will

    def next_due(self) -> int | None:
        """The earliest deadline (ms since the epoch), if any."""
        heap = self._heap
        while heap and not self._live(heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def pop_due(self, now_ms: int) -> list[tuple[str, bool, PendingWill | None]]:
        """What is due by ``now_ms``, removed: (client id, whether its session
        ends, the will to publish now).  A session's end takes its pending
        will with it, whatever that will's delay [MQTT-3.1.3-9]."""
        due = []
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            entry = heapq.heappop(heap)
            if not self._live(entry):
                continue
            client_id = entry[2]
            if entry[1] == END:
                del self.ends[client_id]
                due.append((client_id, True, self._forget_will(client_id)))
            else:
                due.append((client_id, False, self._forget_will(client_id)))
        return due

    def _live(self, entry: tuple[int, int, str]) -> bool:
        due, kind, client_id = entry
        if kind == END:
            return self.ends.get(client_id) == due
        pending = self.wills.get(client_id)
        return pending is not None and pending[0] == due

    def _push(self, due_ms: int, kind: int, client_id: str) -> None:
        heap = self._heap
        earliest = heap[0][0] if heap else None
        if len(heap) > 2 * (len(self.ends) + len(self.wills)) + COMPACT_SLACK:  # bounded: drop what was called off
            heap[:] = [entry for entry in heap if self._live(entry)]
            heapq.heapify(heap)
        heapq.heappush(heap, (due_ms, kind, client_id))
        if earliest is None or due_ms < earliest:
            self.on_earlier()
