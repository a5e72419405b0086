"""When a primary cut off from its backups steps down, and how long it stands aside (gateway/ha/isolation.py)."""

from __future__ import annotations

from gateway.ha import election
from gateway.ha.election import NodeRecord, Role
from gateway.ha.isolation import Isolation, electable_without, stand_aside_s, standing_aside


def node(node_id: str, role: Role = Role.BACKUP) -> NodeRecord:
    return NodeRecord(node_id=node_id, advertise=f"{node_id}:7000", epoch=1, lsn=5, role=role)


def test_too_few_backups_linked_is_due_only_after_the_whole_wait_without_a_break() -> None:
    isolation = Isolation(sync_replicas=1, after_s=4.0)
    assert not isolation.linked(1, 0.0)
    assert not isolation.linked(0, 10.0)  # the count fell short here
    assert not isolation.linked(0, 13.9)
    assert isolation.linked(0, 14.0)
    assert not isolation.linked(1, 14.5)  # a backup linked again: the wait starts over
    assert not isolation.linked(0, 15.0)
    assert not isolation.linked(0, 18.9)
    assert isolation.linked(0, 19.0)


def test_it_counts_against_sync_replicas_not_against_one() -> None:
    isolation = Isolation(sync_replicas=2, after_s=1.0)
    assert not isolation.linked(1, 0.0)
    assert isolation.linked(1, 1.0)  # one of two: no batch can be confirmed
    assert not isolation.linked(2, 1.5)


def test_a_primary_that_confirms_alone_is_never_isolated() -> None:
    isolation = Isolation(sync_replicas=0, after_s=0.0)
    assert not isolation.linked(0, 0.0)
    assert not isolation.linked(0, 1000.0)


def test_the_group_can_elect_without_it_only_with_a_quorum_of_others_that_may_lead() -> None:
    needed = election.quorum(3, 1)
    assert needed == 2
    me = node("gw-0", Role.PRIMARY)
    assert electable_without([me, node("gw-1"), node("gw-2")], "gw-0", needed)
    # One backup dead (its record gone with its session): no election could do without it.
    assert not electable_without([me, node("gw-1")], "gw-0", needed)
    # A backup still copying a snapshot, or standing aside, may not lead: it does not count.
    assert not electable_without([me, node("gw-1"), node("gw-2", Role.SYNCING)], "gw-0", needed)
    assert not electable_without([me, node("gw-1"), node("gw-2", Role.STANDING_ASIDE)], "gw-0", needed)
    # Its own record never counts for the others.
    assert not electable_without([node("gw-0"), node("gw-1")], "gw-0", needed)


def test_a_node_stands_aside_until_its_deadline_or_until_it_caught_up() -> None:
    until = 100.0 + stand_aside_s(4.0)
    assert stand_aside_s(4.0) == 8.0
    assert standing_aside(until, 100.0)
    assert standing_aside(until, 107.9)
    assert not standing_aside(until, 108.0)
    assert not standing_aside(None, 100.0)  # caught up with a new primary: the runtime clears it


def test_a_standing_aside_record_round_trips_and_neither_leads_nor_counts_toward_a_quorum() -> None:
    aside = NodeRecord("gw-0", "gw-0:7000", 3, 999, Role.STANDING_ASIDE, vacancy=3)
    assert NodeRecord.from_json(aside.to_json()) == aside
    others = [NodeRecord("gw-1", "gw-1:7000", 3, 90, Role.BACKUP, vacancy=3)]
    # The most advanced record, final for the vacancy, and still it neither wins nor makes a quorum of two.
    assert election.candidate([aside, *others]) == "gw-1"
    assert election.decide([aside, *others], 3, 2) is None
    assert election.decide([aside, *others, NodeRecord("gw-2", "gw-2:7000", 3, 95, Role.BACKUP, vacancy=3)], 3, 2) == "gw-2"
