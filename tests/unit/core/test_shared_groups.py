"""Shared subscription groups through the core API: one queue per group
(name and pattern), each message to one member, fair by window, what a
leaving member held redelivered to another, the group's life, durability,
authorization and limits."""

from __future__ import annotations

import pytest

from core.authorization import AclEntry, Authorizer, Principal
from core.broker import Broker, BrokerSettings
from core.errors import DuplicateSubscription, InvalidDestination, LimitExceeded, NotAuthorized, UnknownSubscription
from core.shared import group_key, member_key, split_key
from core.subscriptions import AckMode
from tests.support.core_fakes import FakeClock, RecordingSink, RecordingStore, address

T = address("/topic/jobs.>")
JOB = address("/topic/jobs.render")
AUTO = AckMode.AUTO
INDIVIDUAL = AckMode.CLIENT_INDIVIDUAL


def make(authorizer: Authorizer | None = None, **settings: object) -> tuple[Broker, RecordingStore]:
    store = RecordingStore()
    broker = Broker(FakeClock(), BrokerSettings(**settings), node="t", store=store, authorizer=authorizer)  # type: ignore[arg-type]
    return broker, store


def member(broker: Broker, token: str = "m", mode: AckMode = INDIVIDUAL, prefetch: int = 10, *, group: str = "g",
           pattern=T, client_id: str | None = None, durable: tuple[str, str] | None = None):
    sink = RecordingSink()
    client = broker.open_client(sink, client_id=client_id)
    client.subscribe(token, pattern, mode, prefetch, shared=group, durable=durable)
    return client, sink


def publish(broker: Broker, n: int, where=JOB, persistent: bool = False) -> list[str]:
    producer = broker.open_client(RecordingSink())
    ids = []
    for i in range(n):
        message = broker.message(where, {}, str(i).encode(), persistent=persistent)
        producer.send(message)
        ids.append(message.id)
    producer.close()
    return ids


def test_each_message_goes_to_exactly_one_member_round_robin() -> None:
    broker, _ = make()
    members = [member(broker, client_id=f"c{i}") for i in range(3)]
    plain_sink = RecordingSink()
    plain = broker.open_client(plain_sink)
    plain.subscribe("all", T, AUTO)  # an ordinary subscriber of the same topic gets everything
    ids = publish(broker, 9)
    got = [sink.ids for _, sink in members]
    assert sorted(sum(got, [])) == sorted(ids)
    assert [len(g) for g in got] == [3, 3, 3]
    assert plain_sink.ids == ids
    assert len(broker.shared) == 1 and len(broker.shared[group_key("g", T)].queue.consumers) == 3


def test_a_member_at_its_window_gets_nothing_until_it_acks() -> None:
    broker, _ = make()
    slow, slow_sink = member(broker, "slow", prefetch=1)
    fast, fast_sink = member(broker, "fast", mode=AUTO)
    publish(broker, 5)
    assert len(slow_sink.ids) == 1 and len(fast_sink.ids) == 4
    publish(broker, 2)
    assert len(slow_sink.ids) == 1  # still at its window
    slow.ack("slow", slow_sink.ids[0])
    publish(broker, 2)
    assert len(slow_sink.ids) == 2 and len(fast_sink.ids) == 7


def test_what_a_leaving_member_held_is_redelivered_to_another_marked_redelivered() -> None:
    broker, _ = make()
    leaving, leaving_sink = member(broker, "a", prefetch=2)
    staying, staying_sink = member(broker, "b", prefetch=1)
    publish(broker, 4)  # a: 2 unacked, b: 1 unacked, 1 waits in the group's queue
    held = list(leaving_sink.ids)
    assert len(held) == 2 and broker.shared[group_key("g", T)].queue.depth == 1
    leaving.unsubscribe("a")
    staying.ack("b", staying_sink.ids[0])
    staying.ack("b", staying_sink.ids[1])
    staying.ack("b", staying_sink.ids[2])
    assert staying_sink.ids[1:3] == held and all(m.redelivered for m in staying_sink.messages[1:3])
    assert len(staying_sink.ids) == 4 and not staying_sink.messages[3].redelivered


def test_closing_a_member_with_unacked_messages_redelivers_them_too() -> None:
    broker, _ = make()
    leaving, leaving_sink = member(broker, "a")
    staying, staying_sink = member(broker, "b", mode=AUTO)
    publish(broker, 2)
    leaving.close()
    assert set(staying_sink.ids) == {m.id for m in leaving_sink.messages} | {m.id for m in staying_sink.messages[:1]}


def test_the_last_member_leaving_a_non_durable_group_removes_it_and_its_messages() -> None:
    broker, store = make()
    first, _ = member(broker, "a", prefetch=1)
    second, _ = member(broker, "b", prefetch=1)
    publish(broker, 5, persistent=True)
    first.close()
    assert len(broker.shared) == 1
    second.unsubscribe("b")
    assert len(broker.shared) == 0 and broker.all_queues() == []
    assert store.calls == []  # a non-durable group's messages are not stored
    newcomer, sink = member(broker, "c")
    assert sink.ids == []  # a new group, empty


def test_same_name_on_other_filters_are_other_groups_and_never_a_durables_key() -> None:
    broker, _ = make()
    a, a_sink = member(broker, "a", pattern=address("/topic/a"))
    b, b_sink = member(broker, "b", pattern=address("/topic/b"))
    publish(broker, 1, where=address("/topic/a"))
    publish(broker, 1, where=address("/topic/b"))
    assert len(a_sink.ids) == 1 and len(b_sink.ids) == 1 and len(broker.shared) == 2
    key = group_key("x:1", address("/topic/y"))
    assert split_key(key, "shared:") == ("x:1", "/topic/y") and not key.startswith("durable:")
    assert group_key("x", address("/topic/1:y")) != group_key("x:1", address("/topic/y"))


def test_a_durable_group_collects_while_no_member_is_connected() -> None:
    broker, store = make()
    client, _ = member(broker, "a", client_id="c1", durable=("c1", "jobs"))
    gkey = group_key("g", T)
    assert ("sub", gkey, T.text) in store.calls and ("sub", member_key("c1", "jobs"), gkey) in store.calls
    client.close()
    assert gkey in broker.shared
    ids = publish(broker, 3, persistent=True)
    assert [c for c in store.calls if c[0] == "add"] == [("add", i, (gkey,)) for i in ids]
    back, back_sink = member(broker, "a", client_id="c1", durable=("c1", "jobs"))
    assert back_sink.ids == ids and [m.client_id for m in broker.shared.of_client("c1")] == ["c1"]
    other, other_sink = member(broker, "b", client_id="c2")  # a clean member joins the durable group
    back.unsubscribe("a", remove_durable=True)  # the last persistent member leaves for good
    assert gkey in broker.shared  # a member is still attached
    other.close()
    assert gkey not in broker.shared and store.calls[-1] == ("unsub", gkey)


def test_a_group_made_by_a_clean_member_becomes_durable_with_its_first_persistent_member() -> None:
    broker, store = make()
    clean, _ = member(broker, "a", client_id="c1")
    persistent, _ = member(broker, "b", client_id="c2", durable=("c2", "n"))
    clean.close()
    persistent.close()
    assert group_key("g", T) in broker.shared
    assert broker.shared[group_key("g", T)].durable


def test_an_offline_membership_can_be_dropped_and_is_checked_like_a_durable() -> None:
    broker, store = make()
    client, _ = member(broker, "a", client_id="c1", durable=("c1", "n"))
    with pytest.raises(DuplicateSubscription):
        member(broker, "a", client_id="c1", durable=("c1", "n"))
    client.close()
    remover = broker.open_client(RecordingSink(), client_id="c1")
    with pytest.raises(UnknownSubscription):
        remover.drop_shared("c1", "other")
    remover.drop_shared("c1", "n")
    assert broker.shared == {} and broker.shared.memberships == {}
    assert store.calls[-2:] == [("unsub", member_key("c1", "n")), ("unsub", group_key("g", T))]


def test_another_users_persistent_membership_cannot_be_taken() -> None:
    broker, _ = make()
    broker.secured = True
    alice = broker.open_client(RecordingSink(), client_id="c1", principal=Principal("alice"))
    alice.subscribe("a", T, INDIVIDUAL, shared="g", durable=("c1", "n"))
    alice.close()
    mallory = broker.open_client(RecordingSink(), client_id="c1", principal=Principal("mallory"))
    with pytest.raises(NotAuthorized):
        mallory.subscribe("a", T, INDIVIDUAL, shared="g", durable=("c1", "n"))
    with pytest.raises(NotAuthorized):
        mallory.drop_shared("c1", "n")


def test_each_member_is_authorized_to_read_the_pattern() -> None:
    acl = Authorizer([AclEntry(address("/topic/jobs.>"), {"read": frozenset({"user:reader"})})])
    broker, _ = make(acl)
    reader = broker.open_client(RecordingSink(), principal=Principal("reader"))
    reader.subscribe("a", T, AUTO, shared="g")
    stranger = broker.open_client(RecordingSink(), principal=Principal("stranger"))
    with pytest.raises(NotAuthorized):
        stranger.subscribe("a", T, AUTO, shared="g")
    assert len(broker.shared[group_key("g", T)].queue.consumers) == 1


def test_mixed_ack_modes_each_members_own() -> None:
    broker, _ = make()
    auto, auto_sink = member(broker, "a", mode=AUTO)
    acking, acking_sink = member(broker, "b", mode=INDIVIDUAL, prefetch=1)
    publish(broker, 4)
    assert len(acking_sink.ids) == 1 and len(auto_sink.ids) == 3
    assert auto.subscription("a").unacked == {} and len(acking.subscription("b").unacked) == 1


def test_limits_on_groups_and_on_what_a_group_holds() -> None:
    broker, _ = make(max_shared_groups=1, max_shared_group_messages=3)
    client, sink = member(broker, "a", client_id="c1", durable=("c1", "n"))
    with pytest.raises(LimitExceeded):
        member(broker, "b", group="other")
    client.close()
    publish(broker, 5)
    queue = broker.shared[group_key("g", T)].queue
    assert queue.depth == 3 and queue.stats.discarded == 2


def test_shared_subscriptions_are_for_topics_and_get_no_retained_values() -> None:
    broker, _ = make()
    client = broker.open_client(RecordingSink())
    with pytest.raises(InvalidDestination):
        client.subscribe("q", address("/queue/work"), AUTO, shared="g")
    client.send(broker.message(JOB, {}, b"kept"), retain=True)
    sink = RecordingSink()
    joining = broker.open_client(sink)
    subscription = joining.subscribe("s", T, AUTO, shared="g", start=False)
    joining.start(subscription, retained=True)  # MQTT 5 §4.8.2: none for a shared subscription
    assert sink.ids == []


def test_groups_show_with_the_queues_and_in_the_statistics() -> None:
    broker, _ = make()
    member(broker, "a", prefetch=1)
    publish(broker, 3)
    queue = broker.shared[group_key("g", T)].queue
    assert queue in broker.all_queues() and queue.owner is broker.shared[group_key("g", T)]
    assert broker.statistics()["shared_subscriptions"] == {group_key("g", T): (2, 1)}


def test_a_delayed_redelivery_in_a_group_that_was_once_empty_still_comes_back() -> None:
    broker, _ = make(redelivery_delay_ms=100)
    first, _ = member(broker, "a", client_id="c1", durable=("c1", "n"))
    first.close()
    publish(broker, 1)
    broker.release_redeliveries(0)  # a tick of the broker's timer while nobody is attached
    back, sink = member(broker, "a", client_id="c1", durable=("c1", "n"))
    back.nack("a", sink.ids[0])
    due = broker.next_redelivery_ms()
    assert due is not None and broker.release_redeliveries(due) == 1
    assert len(sink.ids) == 2 and sink.messages[1].redelivered


def test_a_delayed_redelivery_of_a_durable_subscription_once_away_still_comes_back() -> None:
    broker, _ = make(redelivery_delay_ms=100)  # the same for a durable subscription's queue
    sink = RecordingSink()
    client = broker.open_client(sink, client_id="c1")
    client.subscribe("d", T, INDIVIDUAL, durable=("c1", "n"))
    client.unsubscribe("d")
    broker.release_redeliveries(0)
    client.subscribe("d", T, INDIVIDUAL, durable=("c1", "n"))
    publish(broker, 1)
    client.nack("d", sink.ids[0])
    due = broker.next_redelivery_ms()
    assert due is not None and broker.release_redeliveries(due) == 1 and len(sink.ids) == 2


def test_a_reserved_message_waits_for_its_persistent_member_and_is_handed_to_it_first() -> None:
    broker, _ = make()
    away, away_sink = member(broker, client_id="c1", durable=("c1", "w"), prefetch=2)
    ids = publish(broker, 2)
    assert away_sink.ids == ids
    away.close(reserve={ids[0]})  # the first is its alone (an MQTT 5 QoS 2 PUBLISH not yet PUBREC'd)
    other, other_sink = member(broker, client_id="c2")
    assert other_sink.ids == [ids[1]]  # the other one goes on to another member
    later = publish(broker, 1)
    assert other_sink.ids == [ids[1], *later]
    back, back_sink = member(broker, client_id="c1", durable=("c1", "w"))
    assert back_sink.ids == [ids[0]] and back_sink.messages[0].redelivered
    assert [m.id for m in back.subscriptions["m"].unacked.values()] == [ids[0]]


def test_a_reserved_message_goes_to_nobody_when_its_membership_ends() -> None:
    broker, _ = make()
    away, _ = member(broker, client_id="c1", durable=("c1", "w"))
    ids = publish(broker, 1)
    other, other_sink = member(broker, client_id="c2")
    away.close(reserve=set(ids))
    queue = broker.shared[group_key("g", T)].queue
    dropper = broker.open_client(RecordingSink(), client_id="c1")
    dropper.drop_shared("c1", "w")
    publish(broker, 1)
    assert len(other_sink.ids) == 1 and other_sink.ids[0] not in ids
    assert queue.stats.discarded == 1


def test_a_member_whose_session_ends_with_it_leaves_its_reserved_messages_to_nobody() -> None:
    broker, _ = make()
    clean, clean_sink = member(broker, client_id="c1")  # not persistent
    other, other_sink = member(broker, client_id="c2")
    ids = publish(broker, 2)
    mine = clean_sink.ids[0]
    clean.close(reserve={mine})
    publish(broker, 1)
    assert mine not in other_sink.ids and len(other_sink.ids) == 2
    assert broker.shared[group_key("g", T)].queue.stats.discarded == 1
