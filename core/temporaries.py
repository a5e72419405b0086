"""Temporary destinations, private to the connection that names them.

Each connection's ``/temp-queue/x`` is a queue of its own, as in ActiveMQ and
RabbitMQ, so any number of instances of an application may use one fixed
reply name.  The broker gives it a private name, ``/temp-queue/x.~17-a3f9c2``
(client number and a per-run tag, so a reply-to kept over a restart reaches
nobody rather than a stranger), that a STOMP reply-to is rewritten to: anyone
may send to that name (a reply), only its owner reads it, and it vanishes
with the owner.  Temporaries take no share of ``max_destinations`` (one
client could otherwise use it all up) but are capped per connection by
``max_temporaries_per_client``.
"""

from __future__ import annotations

from typing import Protocol

from core import names
from core.errors import InvalidDestination, LimitExceeded, NotAuthorized
from core.names import Address
from core.registry import QueueRegistry


class Owner(Protocol):
    """A connection that owns temporary destinations (a core.clients.Client)."""

    number: int
    temporaries: dict[Address, Address]  # the temporary names it used -> its private destinations


class Temporaries:
    """The broker's private temporary destinations and their owners."""

    def __init__(self, registry: QueueRegistry, tag: str) -> None:
        self.registry = registry
        self.owners: dict[Address, Owner] = {}
        self._tag = tag  # this run's, from the broker's Entropy

    def claim(self, name: Address, client: Owner) -> Address:
        """A new private destination for ``client``'s temporary ``name``."""
        limit = self.registry.settings.max_temporaries_per_client
        if len(client.temporaries) >= limit:
            raise LimitExceeded(f"too many temporary destinations on this connection (limit {limit})")
        private = names.parse(f"{name.text}.{names.PRIVATE_MARK}{client.number}-{self._tag}")
        if isinstance(private, str):
            raise InvalidDestination(f"temporary destination name too long: {private}")
        self.owners[private] = client
        client.temporaries[name] = private
        if private.is_queue:
            self.registry.create(private, owner=client)
        return private

    def check_owner(self, private: Address, client: Owner) -> None:
        if self.owners.get(private) is not client:
            raise NotAuthorized(f"temporary destination {private.text!r} belongs to another connection")

    def release(self, private: Address) -> None:
        """The owner left: its destination goes, with what waited there."""
        self.owners.pop(private, None)
        queue = self.registry.drop(private)
        if queue is not None:
            queue.stats.discarded += len(queue.pending.clear())
            self.registry.stats.messages_discarded += queue.stats.discarded
            queue.relieve()
