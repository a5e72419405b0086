"""A client's subscriptions to state that is not its own: a durable
subscription (core.durables) it resumes or makes, a shared subscription
group (core.shared) it joins, and letting go of them.  The checks live here
(who may resume or remove which durable state, one active consumer per
durable subscription or persistent membership); the state's own rules live
with the state."""

from __future__ import annotations

from typing import Any, Protocol

from core.authorization import Principal
from core.destinations import AckMode
from core.durables import DurableSubscription, Durables, claim_refusal, durable_key, owner_of
from core.errors import DuplicateSubscription, InvalidDestination, InvalidRequest, NotAuthorized, UnknownSubscription
from core.names import Address, Kind
from core.nolocal import Origin, with_no_local
from core.ports import Sink
from core.shared import Membership, SharedGroups, member_key
from core.subscriptions import Subscription
from core.tally import Holder


class DurableState(Protocol):
    """What attaching reads of a client's broker (a core.broker.Broker, which
    imports this module through core.clients): the durable subscriptions,
    the shared groups, and whether users exist."""

    durables: Durables
    shared: SharedGroups
    secured: bool


class Attaching(Protocol):
    """What of a :class:`core.clients.Client` (which imports this module)
    attaching uses."""

    # Read only here (a property): a client's broker is a wider protocol of
    # its own, and a writable protocol member would have to match it exactly.
    @property
    def broker(self) -> DurableState: ...

    sink: Sink
    principal: Principal
    holder: Holder
    subscriptions: dict[Any, Subscription]
    last_lsn: int


def subscribe_durable(
    client: Attaching,
    token: Any,
    address: Address,
    ack_mode: AckMode,
    window: int,
    owner: tuple[str, str],
    selector: Any = None,
    no_local: Origin | None = None,
) -> Subscription:
    """Resume or make the durable subscription ``owner`` = (client id,
    name); with ``no_local``, its queue leaves out what that client id
    publishes from now on, while away too (and no longer, resumed without)."""
    client_id, name = owner
    if address.kind is not Kind.TOPIC:
        raise InvalidDestination("durable subscriptions are for /topic/ destinations")
    existing = client.broker.durables.get(durable_key(client_id, name))
    check_durable_owner(client, existing, client_id, name)
    if existing is not None and existing.active is not None:
        raise DuplicateSubscription(f"durable subscription {name!r} of client {client_id!r} is already active")
    durable, client.last_lsn = client.broker.durables.subscribe(client_id, name, address, selector, owner_of(client.principal))
    durable.queue.selector = with_no_local(durable.queue.selector, no_local)
    subscription = Subscription(token, address, durable.queue, client.sink, ack_mode, window, private=False, owner=client)
    subscription.durable = durable
    durable.active = subscription
    client.subscriptions[token] = subscription
    durable.queue.add_consumer(subscription)  # what waited while away goes out on start
    return subscription


def remove_durable(client: Attaching, client_id: str, name: str) -> int:
    """Remove the offline durable subscription ``name`` of ``client_id``."""
    durable: DurableSubscription | None = client.broker.durables.get(durable_key(client_id, name))
    check_durable_owner(client, durable, client_id, name)
    if durable is None:
        raise UnknownSubscription(f"no durable subscription {name!r} for client {client_id!r}")
    if durable.active is not None:
        raise InvalidRequest(f"durable subscription {name!r} is in use by another connection")
    return client.broker.durables.drop(durable)


def check_durable_owner(client: Attaching, state: Any, client_id: str, name: str) -> None:
    """Refuse (:class:`NotAuthorized`) resuming, replacing or removing
    durable ``state`` (a durable subscription or a persistent membership)
    another principal made, or any durable state this client may not hold
    (core.durables.claim_refusal).  ``state`` None: there is none yet, so
    the client's own would be made."""
    owner = state.owner if state is not None else owner_of(client.principal)
    reason = claim_refusal(owner, client.principal, client.broker.secured)
    if reason is not None:
        raise NotAuthorized(f"durable subscription {name!r} of client {client_id!r}: {reason}")


def subscribe_shared(
    client: Attaching,
    token: Any,
    address: Address,
    ack_mode: AckMode,
    window: int,
    group: str,
    persistent: tuple[str, str] | None,
    selector: Any = None,
) -> Subscription:
    """Join shared subscription group ``group`` on ``address`` (made if
    new); ``persistent`` = (client id, name): a membership that outlives the
    connection, resumed if kept, and the group durable while it has one."""
    if address.kind is not Kind.TOPIC:
        raise InvalidDestination("shared subscriptions are for /topic/ destinations")
    groups = client.broker.shared
    if persistent is not None:
        kept = groups.memberships.get(member_key(*persistent))
        check_durable_owner(client, kept, *persistent)
        if kept is not None and kept.active is not None:
            raise DuplicateSubscription(f"shared subscription {persistent[1]!r} of client {persistent[0]!r} is already active")
    membership, client.last_lsn = groups.join(group, address, selector, owner_of(client.principal), persistent,
                                              client.holder)
    queue = membership.group.queue
    subscription = Subscription(token, address, queue, client.sink, ack_mode, window, private=False, owner=client)
    subscription.shared = membership
    membership.active = subscription
    client.subscriptions[token] = subscription
    queue.add_consumer(subscription)  # a member joining takes its share of what waits, on start
    return subscription


def drop_shared(client: Attaching, client_id: str, name: str) -> int:
    """End the offline persistent membership ``name`` of ``client_id``; its
    group goes with it if it was the last and no member is attached.
    Returns the LSN of the removal."""
    membership: Membership | None = client.broker.shared.memberships.get(member_key(client_id, name))
    check_durable_owner(client, membership, client_id, name)
    if membership is None:
        raise UnknownSubscription(f"no shared subscription {name!r} for client {client_id!r}")
    if membership.active is not None:
        raise InvalidRequest(f"shared subscription {name!r} is in use by a connection")
    return client.broker.shared.drop_member(membership)
