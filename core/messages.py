"""The message as the core holds it, whichever protocol brought it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.names import Address
from core.storage import MessageStore, StoredMessage

DEFAULT_PRIORITY = 4
# Headers only a topic archive's copy of an MQTT-published message carries.
ARCHIVE_QOS = "mqtt-qos"
ARCHIVE_RETAIN = "mqtt-retain"
MAX_PRIORITY = 9
_new_record = tuple.__new__


class Message:
    """One published message.

    Shared, not copied, between every subscription a topic fans it out to; a
    redelivery makes a copy (:meth:`redelivery`) so its count is its own.
    ``wire`` is a cache a protocol session may fill with the message's encoded
    form, so fan-out to N subscribers encodes the common part once.

    ``location`` is where the store keeps a persistent message (-1: nowhere).
    A queue over its memory budget holds a :meth:`stub` instead: the same
    message with ``headers`` and ``body`` left on disk (None) until dispatch
    loads them back through the store.
    Plain ``__slots__`` class, not a frozen dataclass: one is built per message.
    """

    __slots__ = (
        "id",
        "address",
        "headers",
        "body",
        "persistent",
        "priority",
        "expires",
        "timestamp",
        "redeliveries",
        "wire",
        "location",
        "qos",
        "retain",
        "retain_published",
        "origin",
    )

    def __init__(
        self,
        id: str,
        address: Address,
        headers: dict[str, str] | None,
        body: bytes | None,
        # Not keyword-only: the broker passes these positionally, which CPython
        # binds faster than keywords, once per message.
        persistent: bool = False,
        priority: int = DEFAULT_PRIORITY,
        expires: int = 0,
        timestamp: int = 0,
        redeliveries: int = 0,
        location: int = -1,
        qos: int | None = None,
    ) -> None:
        self.id = id
        self.address = address
        self.headers = headers
        self.body = body
        self.persistent = persistent
        self.priority = priority
        self.expires = expires
        self.timestamp = timestamp
        self.redeliveries = redeliveries
        self.wire: Any = None
        self.location = location
        # MQTT's quality of service as published; None for other protocols,
        # where persistence stands in for it (2 if persistent, else 0).
        self.qos = qos
        # Set only on the copy a new subscription gets from the retained
        # store ([MQTT-3.3.1-8]); live deliveries never carry it.
        self.retain = False
        # The RETAIN flag as published (MQTT), for MQTT 5 subscriptions with
        # Retain As Published [MQTT-3.3.1-13].  Not stored.
        self.retain_published = False
        # Who published it: the publishing client's core.nolocal.Origin (set
        # by Client.send), for No Local subscriptions.  None: the broker's own
        # (a dead letter, an administrator's send) or recovered from the
        # store, which does not keep it, so it goes to every subscriber.
        self.origin: Any = None

    @property
    def redelivered(self) -> bool:
        return self.redeliveries > 0

    def redelivery(self) -> Message:
        """A copy to put back in a queue, with one more delivery counted."""
        again = Message(
            self.id,
            self.address,
            self.headers,
            self.body,
            persistent=self.persistent,
            priority=self.priority,
            expires=self.expires,
            timestamp=self.timestamp,
            redeliveries=self.redeliveries + 1,
            location=self.location,
            qos=self.qos,
        )
        again.origin = self.origin
        return again

    def stub(self) -> Message:
        """A copy without headers and body, to hold while they stay on disk.
        A copy, not a change: a topic shares this message with other queues."""
        stub = Message(
            self.id,
            self.address,
            None,
            None,
            persistent=self.persistent,
            priority=self.priority,
            expires=self.expires,
            timestamp=self.timestamp,
            redeliveries=self.redeliveries,
            location=self.location,
            qos=self.qos,
        )
        stub.origin = self.origin
        return stub

    def retained_copy(self) -> Message:
        """What a new subscription gets from the retained store: flagged, and
        never acked in any stored queue (it is not one of its messages)."""
        copy = Message(
            self.id, self.address, self.headers, self.body,
            persistent=self.persistent, priority=self.priority, expires=self.expires,
            timestamp=self.timestamp, qos=self.qos,
        )
        copy.retain = True
        copy.origin = self.origin  # a No Local subscription does not get its own retained value back
        return copy

    def record(self) -> StoredMessage:
        """What the store keeps of this message (see core.storage)."""
        # tuple.__new__, as StoredMessage._make does: the NamedTuple's own
        # __new__ is a Python function, and this runs for every stored message.
        return _new_record(StoredMessage, (
            self.id, self.address.text, self.headers, self.body, self.priority, self.expires, self.timestamp,
            self.redeliveries, -1,
        ))

    def archive_record(self, record: StoredMessage | None = None) -> StoredMessage:
        """What a topic archive keeps: the stored record, plus, for a message
        published over MQTT, its QoS and RETAIN flag as ``mqtt-qos`` and
        ``mqtt-retain`` headers, so an archive read shows them.  Only the
        archived copy has them: no subscriber receives them as headers."""
        kept = record or self.record()
        if self.qos is None:
            return kept
        headers = dict(self.headers or {})
        headers[ARCHIVE_QOS] = str(self.qos)
        if self.retain_published:
            headers[ARCHIVE_RETAIN] = "true"
        return kept._replace(headers=headers)

    def load(self, store: MessageStore) -> bool:
        """Fill in a stub's headers and body from ``store``.  False when its
        record is unreadable: the store has reported and counted it, and the
        caller drops the message."""
        record = store.load(self.location, self.address.text)
        if record is None:
            return False
        self.headers = record.headers
        self.body = record.body
        return True

    @property
    def stored(self) -> bool:
        return self.location >= 0

    def __repr__(self) -> str:
        return f"Message({self.id!r}, {self.address.text!r}, redeliveries={self.redeliveries})"


def store_transaction(
    store: MessageStore,
    adds: Sequence[tuple[Message, list[str]]],
    acks: Sequence[tuple[str, Message]],
    *,
    archived: Sequence[tuple[str, Message]] = (),
    commit_key: str | None = None,
) -> int:
    """One :meth:`MessageStore.transaction` of the core's messages: stored
    messages with their queue keys, acks by queue key, archived copies by
    topic name; the stored ones learn their location.  Returns the LSN."""
    lsn, locations = store.transaction(
        [(message.record(), keys) for message, keys in adds],
        [(key, message.id) for key, message in acks],
        archived=[(topic, message.archive_record()) for topic, message in archived],
        commit_key=commit_key,
    )
    for (message, _), location in zip(adds, locations):
        message.location = location
    return lsn
