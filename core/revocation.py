"""What a reload takes from clients already connected.

The authorization map decides a SUBSCRIBE once; a subscription then
delivers until it ends.  So when a reload replaces the map or the users
(the app calls :func:`recheck`), every open client is checked again: its
user, if still listed, with its groups as they are now, and each of its
subscriptions against the new map (``read``, on the destination or pattern
it subscribed to, as at SUBSCRIBE).  A client whose user is no longer listed,
or that holds a subscription no longer granted, is revoked: deliveries to
it stop at once, then its session says so in its protocol and ends the
connection (core.ports.Sink.revoked).  Ending the connection releases what
it held as any close does: unacknowledged queue messages go back to their
queue for the other consumers, a durable subscription or kept MQTT session
stays (and collects) but its next resume is decided by the new map.

Mosquitto asks its ACL on every delivery; checking every open subscription
once per reload gives the same result for what follows the reload without a
lookup per message.  Temporary destinations are outside the map (their
owner's), so they are not checked.  A user whose password changed keeps its
connections: it was who it said it was, and its rights are what the map and
its groups say, both checked here."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from core.authorization import ANONYMOUS, Principal
from core.clients import Client
from core.subscriptions import AckMode, Subscription

# Destinations a revocation names in its reason (the rest are counted).
NAMED = 3
LOGGED, NAME_CHARS = 20, 200  # what a session's log line names of them


@dataclasses.dataclass(frozen=True, slots=True)
class Revocation:
    """Rights a reload took from one open client: ``removed`` (its user is
    no longer listed, or it is anonymous and anonymous access is off; every
    subscription ends with it), or the ``subscriptions`` it may no longer read."""

    client: Client
    user: str
    subscriptions: tuple[Subscription, ...]
    removed: bool = False

    @property
    def destinations(self) -> list[str]:
        return [subscription.address.text for subscription in self.subscriptions]

    @property
    def reason(self) -> str:
        """What the client is told, in the words of a refused SUBSCRIBE."""
        return self.told(self.destinations)

    def told(self, names: list[str]) -> str:
        """:attr:`reason` with the subscriptions called ``names`` (a
        protocol's own spelling of them: MQTT's topic filters)."""
        if self.removed:
            if self.user == ANONYMOUS:
                return "anonymous access was turned off by a configuration reload"
            return f"user {self.user!r} was removed by a configuration reload"
        named = ", ".join(repr(text) for text in names[:NAMED])
        more = len(names) - NAMED
        return (f"user {self.user!r} may not read {named}{f' (and {more} more)' if more > 0 else ''} any more: "
                f"the authorization map was reloaded")

    def logged(self, names: list[str], reason: str | None = None) -> dict[str, object]:
        """The fields of the session's log line: who, what ended (the first
        ``LOGGED`` of ``names``, each cut to ``NAME_CHARS``) and why."""
        return {"user": self.user, "removed": self.removed, "reason": reason or self.reason,
                "subscriptions": [name[:NAME_CHARS] for name in names[:LOGGED]], "ended": len(names)}


@dataclasses.dataclass(frozen=True, slots=True)
class Recheck:
    """What one reload's check found: how many clients and subscriptions it
    looked at, and what it revoked (each revoked client is closed)."""

    clients: int
    subscriptions: int
    revocations: tuple[Revocation, ...]

    @property
    def ended(self) -> int:
        """Subscriptions ended (all of a removed user's)."""
        return sum(len(revocation.subscriptions) for revocation in self.revocations)


def recheck(clients: Iterable[Client], principal_of: Callable[[Client], Principal | None]) -> Recheck:
    """Check open ``clients`` against the map their broker holds now (a
    reload's: a new object, so no decision a client remembers for its old
    principal is used again); ``principal_of(client)``: its user as listed
    now (its groups may have changed), or None if it may no longer connect
    (removed; anonymous, and anonymous access is off for its address).
    Revoked clients are told (their sink) and closed."""
    open_clients = [client for client in clients if not client.closed]
    subscriptions = 0
    revocations = []
    for client in open_clients:
        subscriptions += len(client.subscriptions)
        principal = principal_of(client)
        if principal is None:
            revocations.append(Revocation(client, client.principal.name, tuple(client.subscriptions.values()), True))
            continue
        client.principal = principal
        authorizer = client.broker.authorizer
        refused = tuple(
            subscription for subscription in client.subscriptions.values()
            if authorizer is not None and not subscription.address.is_temporary  # temporaries are their owner's
            and not authorizer.allows(principal, "read", subscription.address)
        )
        if refused:
            revocations.append(Revocation(client, principal.name, refused))
    # First no revoked client takes another delivery, so what one of them puts
    # back as it closes is not handed to another that is being revoked: each
    # subscription's credit window closes (Subscription.has_room is false).
    for revocation in revocations:
        for subscription in revocation.client.subscriptions.values():
            subscription.ack_mode, subscription.prefetch = AckMode.CLIENT_INDIVIDUAL, 0
    for revocation in revocations:
        client = revocation.client
        try:
            client.sink.revoked(revocation)
        finally:
            client.close()  # the session did (idempotent); whatever it did, nothing more reaches it
    return Recheck(len(open_clients), subscriptions, tuple(revocations))
