"""Client transactions: sends and acks held back until COMMIT."""

from __future__ import annotations

from core.messages import Message
from core.names import Address
from core.subscriptions import Subscription


class Transaction:
    """What a transaction will do on commit.

    Acked and nacked messages leave the subscription's unacked set as soon as
    the ACK/NACK arrives, so they stop holding prefetch credit (a consumer with
    prefetch 1 can take several messages in one transaction, as in ActiveMQ),
    but they are settled only here: acked on commit, put back on abort.
    """

    __slots__ = ("id", "sends", "acks", "nacks", "size", "bytes")

    def __init__(self, id: str) -> None:
        self.id = id
        self.sends: list[tuple[Address, Message]] = []
        self.acks: list[tuple[Subscription, list[Message]]] = []
        self.nacks: list[tuple[Subscription, list[Message]]] = []
        self.size = 0  # frames: sends, acks and nacks
        self.bytes = 0  # sent bodies and headers

    def settled_back(self) -> list[tuple[Subscription, list[Message]]]:
        """Everything acked or nacked in this transaction, for redelivery on abort."""
        return self.acks + self.nacks
