"""Per-holder shares of the broker-wide pools (core.tally's Shares): who a
holder is (a user; anonymous clients by source address), the accounting of
items and bytes, and the pools that use it through the core's door: shared
subscription groups and retained messages.  The delayed wills' share is the
MQTT side's (tests/unit/mqtt/test_lifetime.py)."""

from __future__ import annotations

import pytest

from core.authorization import ANONYMOUS_PRINCIPAL, Principal
from core.broker import Broker, BrokerSettings
from core.errors import InvalidDestination, LimitExceeded
from core.tally import ANONYMOUS, UNKNOWN_HOLDER, USER, Shares, Tally, describe, holder_of, holder_of_owner
from core.subscriptions import AckMode
from tests.support.core_fakes import FakeClock, RecordingSink, RecordingStore, address

T = address("/topic/jobs.>")
BOB = Principal("bob")


def make(**settings: object) -> Broker:
    return Broker(FakeClock(), BrokerSettings(**settings), node="t", store=RecordingStore())  # type: ignore[arg-type]


# -- the accounting --------------------------------------------------------------


def test_a_holder_is_the_user_or_the_anonymous_clients_of_one_address() -> None:
    assert holder_of(BOB, "127.0.0.1") == holder_of(BOB, "10.0.0.9") == (USER, "bob")
    assert holder_of(ANONYMOUS_PRINCIPAL, "127.0.0.1") == (ANONYMOUS, "127.0.0.1")
    assert holder_of(ANONYMOUS_PRINCIPAL, "127.0.0.1") != holder_of(ANONYMOUS_PRINCIPAL, "127.0.0.2")
    # No user name can pass for an address, whatever it contains.
    assert holder_of(Principal("anonymous@127.0.0.1"), None) != holder_of(ANONYMOUS_PRINCIPAL, "127.0.0.1")
    assert holder_of_owner("bob") == (USER, "bob")
    assert holder_of_owner("") == holder_of_owner(None) == UNKNOWN_HOLDER
    assert describe((USER, "bob")) == "user 'bob'"
    assert describe((ANONYMOUS, "127.0.0.2")) == "anonymous clients from 127.0.0.2"


def test_tally_counts_amounts_and_forgets_a_key_at_zero() -> None:
    tally: Tally[str] = Tally()
    assert tally.add("a", 5) == 5 and tally.remove("a", 2) == 3
    assert tally.remove("a", 3) == 0 and len(tally) == 0
    assert tally.add("b", 0) == 0 and len(tally) == 0  # nothing held: no key
    assert tally.remove("c") == 0 and len(tally) == 0


def test_shares_refuse_past_a_holders_items_or_bytes_and_the_totals() -> None:
    shares = Shares("widgets")
    bob, ann = (USER, "bob"), (ANONYMOUS, "127.0.0.1")
    shares.take(bob, 60)
    shares.take(bob, 30)
    assert shares.refusal(bob, 2, 0) == "too many widgets for user 'bob' (limit 2)"
    assert shares.refusal(bob, 3, 100, nbytes=20) == "widgets of user 'bob' would pass 100 bytes (limit)"
    assert shares.refusal(bob, 3, 100, nbytes=10) is None
    assert shares.refusal(bob, 2, 100, items=0, nbytes=5) is None  # a replacement takes no item
    assert shares.refusal(bob, 2, 90, items=0, nbytes=-10) is None  # nor does a smaller one take bytes
    assert shares.refusal(ann, 2, 100, nbytes=100) is None  # another holder's share is its own
    assert shares.refusal(UNKNOWN_HOLDER, 1, 1, nbytes=10) is None  # restored state has no share
    assert shares.total_refusal(2) == "too many widgets on the broker (limit 2)"
    assert shares.total_refusal(3, 100, nbytes=11) is not None and shares.total_refusal(3, 101, nbytes=11) is None
    assert shares.total_refusal(0, 0, nbytes=10**9) is None  # 0: no limit
    shares.give_back(bob, 60)
    shares.give_back(bob, 30)
    assert (len(shares.items), len(shares.bytes), shares.total_items, shares.total_bytes) == (0, 0, 0, 0)


# -- shared subscription groups ---------------------------------------------------


def join(broker: Broker, group: str, *, principal: Principal = ANONYMOUS_PRINCIPAL, source: str = "127.0.0.1"):
    client = broker.open_client(RecordingSink(), principal=principal, source=source)
    client.subscribe("m", T, AckMode.AUTO, 10, shared=group)
    return client


def test_shared_groups_a_holder_makes_are_bounded_and_come_back_when_the_groups_go() -> None:
    broker = make(max_shared_groups_per_user=2)
    first = join(broker, "a")
    join(broker, "b")
    with pytest.raises(LimitExceeded, match=r"too many shared subscription groups for anonymous clients from 127\.0\.0\.1 \(limit 2\)"):
        join(broker, "c")
    join(broker, "a")  # joining one made takes nothing
    join(broker, "c", source="127.0.0.2")
    join(broker, "c", principal=BOB)  # 127.0.0.2's
    join(broker, "d", principal=BOB)
    join(broker, "e", principal=BOB)
    with pytest.raises(LimitExceeded, match="user 'bob'"):
        join(broker, "f", principal=BOB)
    first.close()  # "a" still has a member
    with pytest.raises(LimitExceeded):
        join(broker, "f")
    assert broker.shared.made.items[(ANONYMOUS, "127.0.0.1")] == 2


def test_a_group_that_goes_gives_its_makers_share_back() -> None:
    broker = make(max_shared_groups_per_user=1)
    join(broker, "a").close()
    assert len(broker.shared) == 0 and len(broker.shared.made.items) == 0
    join(broker, "b")


def test_the_broker_wide_bound_still_holds_past_every_share() -> None:
    broker = make(max_shared_groups=2, max_shared_groups_per_user=5)
    join(broker, "a")
    join(broker, "b", source="127.0.0.2")
    with pytest.raises(LimitExceeded, match="on the broker"):
        join(broker, "c", source="127.0.0.3")


def test_a_group_name_past_the_limit_is_refused_before_anything_is_made() -> None:
    broker = make(max_shared_group_name_chars=8)
    with pytest.raises(InvalidDestination, match="max_shared_group_name_chars"):
        join(broker, "g" * 9)
    assert len(broker.shared) == 0 and len(broker.shared.made.items) == 0
    join(broker, "g" * 8)


@pytest.mark.parametrize("name, value", [("max_shared_groups_per_user", -1), ("max_retained_messages_per_user", -1),
                                         ("max_retained_bytes_per_user", -1), ("max_shared_group_name_chars", 0)])
def test_the_new_settings_are_checked(name: str, value: int) -> None:
    with pytest.raises(ValueError, match=name):
        BrokerSettings(**{name: value})  # type: ignore[arg-type]


# -- retained messages ---------------------------------------------------------------


def retain(broker: Broker, topic: str, body: bytes, *, principal: Principal = ANONYMOUS_PRINCIPAL,
           source: str = "127.0.0.1") -> str | None:
    """Publish a retained value; why it was not kept, or None."""
    client = broker.open_client(RecordingSink(), principal=principal, source=source)
    client.send(broker.message(address(f"/topic/{topic}"), {}, body), None, True)
    return client.retain_refusal


def test_a_holders_retained_share_in_messages_and_bytes() -> None:
    broker = make(max_retained_messages_per_user=2, max_retained_bytes_per_user=10)
    assert retain(broker, "a", b"12345") is None
    assert retain(broker, "b", b"1234") is None
    assert retain(broker, "c", b"1") == "too many retained messages for anonymous clients from 127.0.0.1 (limit 2)"
    assert retain(broker, "a", b"123456") is None  # its own, one byte more: 10
    assert retain(broker, "a", b"1234567") == (
        "retained messages of anonymous clients from 127.0.0.1 would pass 10 bytes (max_retained_bytes_per_user)")
    assert retain(broker, "c", b"1", source="127.0.0.2") is None
    assert retain(broker, "d", b"1", principal=BOB) is None
    assert sorted(m.address.text for m in broker.retained) == ["/topic/a", "/topic/b", "/topic/c", "/topic/d"]
    assert broker.stats.retained_refused == 2
    assert retain(broker, "b", b"") is None  # clearing gives the share back
    assert retain(broker, "e", b"1") is None


def test_taking_over_another_holders_retained_topic_counts_against_the_new_one() -> None:
    broker = make(max_retained_messages_per_user=1)
    assert retain(broker, "a", b"x", principal=BOB) is None
    assert retain(broker, "b", b"y") is None
    assert retain(broker, "a", b"z") is not None  # it would be a second one of 127.0.0.1's
    assert retain(broker, "b", b"", principal=BOB) is None  # anyone allowed to write may clear
    assert retain(broker, "a", b"z") is None
    assert broker.retained.shares.items[(USER, "bob")] == 0
    assert broker.retained.get(address("/topic/a")).body == b"z"  # type: ignore[union-attr]


def test_restored_retained_values_are_no_ones_share() -> None:
    broker = make(max_retained_messages_per_user=1)
    broker.restore({}, {}, [broker.message(address(f"/topic/r{i}"), {}, b"v") for i in range(3)])
    assert len(broker.retained) == 3
    assert retain(broker, "a", b"x") is None


def test_asking_first_counts_a_refusal_and_never_refuses_a_clear() -> None:
    """MQTT 5's path: the bounds asked before the publish (which is then refused whole)."""
    broker = make(max_retained_messages_per_user=1)
    assert retain(broker, "a", b"x") is None
    client = broker.open_client(RecordingSink(), source="127.0.0.1")
    message = broker.message(address("/topic/b"), {}, b"y")
    assert broker.retained.refused(message, client.holder) is not None
    assert broker.stats.retained_refused == 1
    assert broker.retained.refused(broker.message(address("/topic/b"), {}, b""), client.holder) is None
