"""Test doubles for the core's ports: a Sink that records, a Clock that is told the time,
a Store that records; and World, a broker with a producer client for the core's unit tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core import names
from core.broker import Broker, BrokerSettings, Client
from core.messages import Message
from core.names import Address
from core.storage import StoredMessage
from core.subscriptions import AckMode, Subscription


class RecordingSink:
    """Records ``(subscription.token, message)`` per delivery.  Flip ``accepting``
    to play a connection whose outbox is over its high-water mark."""

    def __init__(self, *, accepting: bool = True, log: list[tuple[RecordingSink, Any, Message]] | None = None) -> None:
        self.accepting = accepting
        self.deliveries: list[tuple[Any, Message]] = []
        self.log = log  # optionally shared between sinks, to keep the global order
        self.unblocks = 0
        self.revocations: list[Any] = []

    def unblocked(self) -> None:
        self.unblocks += 1

    def revoked(self, revocation: Any) -> None:
        """Records the revocation; ending the client is left to the core's fallback."""
        self.revocations.append(revocation)

    def deliver(self, subscription: Subscription, message: Message) -> None:
        self.deliveries.append((subscription.token, message))
        if self.log is not None:
            self.log.append((self, subscription.token, message))

    @property
    def messages(self) -> list[Message]:
        return [message for _, message in self.deliveries]

    @property
    def ids(self) -> list[str]:
        return [message.id for _, message in self.deliveries]

    @property
    def bodies(self) -> list[bytes]:
        return [message.body for _, message in self.deliveries]


class FakeClock:
    def __init__(self, now: float = 1000.0, wall_ms: int = 1_700_000_000_000) -> None:
        self.now = now
        self.wall = wall_ms

    def monotonic(self) -> float:
        return self.now

    def wall_ms(self) -> int:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall += int(seconds * 1000)


def address(text: str) -> Address:
    parsed = names.parse(text)
    assert isinstance(parsed, Address), parsed
    return parsed


class RecordingStore:
    """A core.storage.MessageStore that records every call and hands out rising LSNs;
    ``bodies`` plays the disk for paged-out messages."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.lsn = 0
        self.durable_lsn = 0
        self.bodies: dict[int, tuple[dict[str, str], bytes]] = {}
        self.loads = 0
        self.damaged: set[int] = set()  # locations whose record fails to read
        self.archived_headers: list[dict[str, str] | None] = []  # of each archive_message, in order

    def _next(self, *call: Any) -> int:
        self.calls.append(call)
        self.lsn += 1
        return self.lsn

    def _keep(self, message: StoredMessage) -> int:
        location = len(self.bodies)
        self.bodies[location] = (dict(message.headers or {}), message.body or b"")
        return location

    def add_message(self, message: StoredMessage, keys: Sequence[str]) -> tuple[int, int]:
        location = self._keep(message)
        return self._next("add", message.id, tuple(keys)), location

    def ack(self, key: str, message_id: str) -> int:
        return self._next("ack", key, message_id)

    def transaction(
        self,
        adds: Sequence[tuple[StoredMessage, Sequence[str]]],
        acks: Sequence[tuple[str, str]],
        *,
        archived: Sequence[tuple[str, StoredMessage]] = (),
        commit_key: str | None = None,
    ) -> tuple[int, list[int]]:
        locations = [self._keep(message) for message, _ in adds]
        call: tuple[Any, ...] = ("tx", tuple((m.id, tuple(k)) for m, k in adds), tuple(acks))
        if archived or commit_key is not None:
            call += (tuple((topic, m.body) for topic, m in archived), commit_key)
        return self._next(*call), locations

    def archive_message(self, topic: str, message: StoredMessage) -> int:
        self.archived_headers.append(message.headers)
        return self._next("archive", topic, message.body)

    def forget_commit_key(self, key: str) -> int:
        return self._next("forget", key)

    def add_subscription(self, key: str, pattern: str, selector: str | None = None, owner: str | None = None) -> int:
        return self._next("sub", key, pattern) if selector is None else self._next("sub", key, pattern, selector)

    def remove_subscription(self, key: str) -> int:
        return self._next("unsub", key)

    def retain(self, topic: str, message: StoredMessage | None, qos: int | None = None) -> int:
        return self._next("retain", topic, None if message is None else message.body)

    def note(self, namespace: str, key: str, value: bytes | None) -> int:
        return self._next("note", namespace, key, value)

    def load(self, location: int, destination: str) -> StoredMessage | None:
        self.loads += 1
        if location in self.damaged:
            return None
        headers, body = self.bodies[location]
        return StoredMessage("", destination, headers, body, 0, 0, 0, 0, location)

    def kinds(self) -> list[str]:
        return [call[0] for call in self.calls]


Q = address("/queue/q")
AUTO, CLIENT, INDIVIDUAL = AckMode.AUTO, AckMode.CLIENT, AckMode.CLIENT_INDIVIDUAL


class World:
    """A broker with a producer client, and helpers to open consumers."""

    def __init__(self, **settings: Any) -> None:
        self.clock = FakeClock()
        self.broker = Broker(self.clock, BrokerSettings(**settings), node="test")
        self.producer_sink = RecordingSink()
        self.producer = self.broker.open_client(self.producer_sink)

    def consumer(
        self,
        token: Any = "s",
        where: Address = Q,
        mode: AckMode = AUTO,
        prefetch: int | None = None,
        *,
        accepting: bool = True,
    ) -> tuple[Client, RecordingSink]:
        sink = RecordingSink(accepting=accepting)
        client = self.broker.open_client(sink)
        client.subscribe(token, where, mode, prefetch)
        return client, sink

    def send(
        self,
        body: bytes | str,
        where: Address = Q,
        *,
        priority: int = 4,
        transaction: str | None = None,
        client: Client | None = None,
    ) -> Message:
        if isinstance(body, str):
            body = body.encode()
        message = self.broker.message(where, {"k": "v"}, body, priority=priority)
        (client or self.producer).send(message, transaction)
        return message
