"""Test doubles for the core's ports: a Sink that records, a Clock that is told the time."""

from __future__ import annotations

from typing import Any

from core import names
from core.messages import Message
from core.names import Address
from core.subscriptions import Subscription


class RecordingSink:
    """Records ``(subscription.token, message)`` per delivery.  Flip ``accepting``
    to play a connection whose outbox is over its high-water mark."""

    def __init__(self, *, accepting: bool = True, log: list[tuple[RecordingSink, Any, Message]] | None = None) -> None:
        self.accepting = accepting
        self.deliveries: list[tuple[Any, Message]] = []
        self.log = log  # optionally shared between sinks, to keep the global order
        self.unblocks = 0

    def unblocked(self) -> None:
        self.unblocks += 1

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
