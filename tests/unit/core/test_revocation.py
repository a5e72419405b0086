"""A reload's re-check of clients already connected (core.revocation):
what a new map or user list no longer grants stops flowing at once."""

from __future__ import annotations

import pytest

from core.authorization import Authorizer, Principal, parse_entries
from core.broker import Client
from core.errors import NotAuthorized
from core.revocation import Recheck, recheck
from core.subscriptions import AckMode
from tests.support.core_fakes import RecordingSink, World, address

PLANT = address("/topic/plant.>")
ORDERS = address("/queue/orders")
ALICE = Principal("alice", frozenset({"readers"}))
BOB = Principal("bob", frozenset({"readers"}))


def authorizer(*entries: dict[str, object]) -> Authorizer:
    return Authorizer(parse_entries(list(entries)))


GRANTED = authorizer(
    {"destination": "/topic/plant.>", "read": ["readers"]},
    {"destination": "/queue/orders", "read": ["readers"], "admin": ["readers"]},
    {"destination": "/topic/>", "write": ["*"]},
    {"destination": "/queue/>", "write": ["*"], "admin": ["*"]},
)
REVOKED = authorizer(
    {"destination": "/topic/>", "write": ["*"]},
    {"destination": "/queue/>", "write": ["*"], "admin": ["*"]},
)


def same(client: Client) -> Principal:
    return client.principal


def reload(world: World, authorizer: Authorizer | None, principal_of=same, *clients: Client) -> Recheck:
    """What the app does on a reload: the new map, then the re-check of the open clients."""
    world.broker.authorizer = authorizer
    return recheck([world.producer, *clients], principal_of)


def connect(world: World, principal: Principal, *subscriptions: tuple[str, object, AckMode]) -> tuple[Client, RecordingSink]:
    sink = RecordingSink()
    client = world.broker.open_client(sink, principal=principal)
    for token, where, mode in subscriptions:
        client.subscribe(token, where, mode)
    return client, sink


def test_a_revoked_topic_subscription_gets_nothing_more_and_its_client_is_told_and_closed(world):
    world.broker.authorizer = GRANTED
    alice, sink = connect(world, ALICE, ("plant", PLANT, AckMode.AUTO))
    world.send("before", address("/topic/plant.1"))
    assert sink.bodies == [b"before"]

    done = reload(world, REVOKED, same, alice)

    assert [r.client for r in done.revocations] == [alice] and done.ended == 1
    (revocation,) = sink.revocations
    assert revocation.destinations == ["/topic/plant.>"] and not revocation.removed
    assert revocation.reason == "user 'alice' may not read '/topic/plant.>' any more: the authorization map was reloaded"
    assert alice.closed and world.broker.stats.clients == 1  # the producer only
    world.send("after", address("/topic/plant.1"))
    assert sink.bodies == [b"before"]


def test_a_revoked_queue_subscriptions_unacked_messages_go_to_a_consumer_still_allowed(world):
    """Alice (revoked) and Bob (whose user is removed) held messages unacked;
    Carol may still read: all of them come to her, none to the other two,
    although each close puts messages back while the other is still open."""
    world.broker.authorizer = GRANTED
    alice, alice_sink = connect(world, ALICE, ("q", ORDERS, AckMode.CLIENT_INDIVIDUAL))
    bob, bob_sink = connect(world, BOB, ("q", ORDERS, AckMode.CLIENT_INDIVIDUAL))
    carol_principal = Principal("carol", frozenset({"auditors"}))
    for body in ("1", "2", "3", "4"):
        world.send(body, ORDERS)
    assert len(alice_sink.bodies) + len(bob_sink.bodies) == 4
    held = {"alice": list(alice_sink.bodies), "bob": list(bob_sink.bodies)}
    still = authorizer({"destination": "/queue/orders", "read": ["auditors"], "admin": ["auditors"]})
    carol, carol_sink = connect(world, carol_principal)

    done = reload(world, Authorizer(still.entries), lambda c: None if c.principal.name == "bob" else c.principal, alice, bob, carol)

    assert {r.user: r.removed for r in done.revocations} == {"alice": False, "bob": True}
    assert bob_sink.revocations[0].reason == "user 'bob' was removed by a configuration reload"
    carol.subscribe("q", ORDERS, AckMode.AUTO)
    assert sorted(carol_sink.bodies) == [b"1", b"2", b"3", b"4"]
    assert alice_sink.bodies == held["alice"] and bob_sink.bodies == held["bob"]  # nothing more reached them
    assert all(m.redelivered for m in carol_sink.messages)


def test_groups_as_listed_now_decide_and_a_client_still_allowed_is_untouched(world):
    world.broker.authorizer = GRANTED
    alice, alice_sink = connect(world, ALICE, ("plant", PLANT, AckMode.AUTO))
    bob, bob_sink = connect(world, BOB, ("plant", PLANT, AckMode.AUTO))

    # Same map; alice is no longer in "readers".
    done = reload(world, Authorizer(GRANTED.entries), lambda c: Principal("alice") if c.principal.name == "alice" else c.principal, alice, bob)

    assert [r.user for r in done.revocations] == ["alice"] and alice.closed
    assert not bob.closed and bob_sink.revocations == []
    assert done.clients == 3 and done.subscriptions == 2
    world.send("still", address("/topic/plant.2"))
    assert bob_sink.bodies == [b"still"] and alice_sink.bodies == []


def test_a_revoked_durable_subscription_is_kept_and_collects_but_its_resume_is_refused(world):
    world.broker.authorizer = GRANTED
    sink = RecordingSink()
    alice = world.broker.open_client(sink, client_id="app", principal=ALICE)
    alice.subscribe("d", PLANT, AckMode.AUTO, durable=("app", "news"))

    reload(world, REVOKED, same, alice)

    assert alice.closed
    (durable,) = world.broker.durables.values()
    assert durable.active is None  # kept, not deleted by the revocation
    again = world.broker.open_client(RecordingSink(), client_id="app", principal=ALICE)
    with pytest.raises(NotAuthorized, match="may not read '/topic/plant.>'"):
        again.subscribe("d", PLANT, AckMode.AUTO, durable=("app", "news"))


def test_no_map_and_no_removal_revokes_nothing_and_temporaries_are_not_checked(world):
    world.broker.authorizer = GRANTED
    alice, sink = connect(world, ALICE, ("reply", address("/temp-queue/replies"), AckMode.AUTO))
    assert reload(world, REVOKED, same, alice).revocations == ()  # a temporary is its owner's
    assert reload(world, None, same, alice).revocations == () and not alice.closed


def test_a_revoked_shared_group_member_leaves_its_share_to_the_members_still_allowed(world):
    world.broker.authorizer = authorizer({"destination": "/topic/plant.>", "read": ["readers", "auditors"]},
                                         {"destination": "/topic/>", "write": ["*"]})
    alice, alice_sink = connect(world, ALICE)
    alice.subscribe("g", PLANT, AckMode.CLIENT_INDIVIDUAL, shared="workers")
    carol, carol_sink = connect(world, Principal("carol", frozenset({"auditors"})))
    carol.subscribe("g", PLANT, AckMode.CLIENT_INDIVIDUAL, shared="workers")
    for body in ("1", "2", "3", "4"):
        world.send(body, address("/topic/plant.1"))
    held = list(alice_sink.bodies)
    assert held and len(held) < 4  # the group shares them out
    still = authorizer({"destination": "/topic/plant.>", "read": ["auditors"]}, {"destination": "/topic/>", "write": ["*"]})

    done = reload(world, still, same, alice, carol)

    assert [r.user for r in done.revocations] == ["alice"]
    for message in list(carol_sink.messages):  # carol settles hers; alice's come to her too
        carol.ack("g", message.id)
    assert sorted(carol_sink.bodies) == [b"1", b"2", b"3", b"4"] and alice_sink.bodies == held
