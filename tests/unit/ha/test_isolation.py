"""When a primary cut off from its backups steps down, and how long it stands aside (gateway/ha/isolation.py)."""

from __future__ import annotations

from gateway.ha import election
from gateway.ha.election import NodeRecord, Role
from gateway.ha.isolation import Isolation, cut_off_by, stand_aside_s, standing_aside, wait_s


def node(node_id: str, role: Role = Role.BACKUP, unlinked: int | None = 7) -> NodeRecord:
    return NodeRecord(node_id=node_id, advertise=f"{node_id}:7000", epoch=1, lsn=5, role=role, unlinked=unlinked)


def test_it_steps_down_only_once_cut_off_for_the_whole_wait_without_a_break() -> None:
    isolation = Isolation(sync_replicas=1, after_s=6.0)  # times as data, not a clock
    assert not isolation.observe(False, 0.0)
    assert not isolation.observe(True, 10.0)  # cut off from here
    assert not isolation.observe(True, 15.9)
    assert isolation.observe(True, 16.0)
    assert not isolation.observe(False, 16.5)  # a backup linked again, or the others went: the wait starts over
    assert not isolation.observe(True, 17.0)
    assert not isolation.observe(True, 22.9)
    assert isolation.observe(True, 23.0)


def test_a_frozen_backup_that_wakes_and_joins_zookeeper_before_it_links_is_ridden_out() -> None:
    # Frozen: its link drops (short) but it cannot say it is unlinked; awake,
    # its session gone, it joins again saying so, and links again a moment later.
    isolation = Isolation(sync_replicas=1, after_s=wait_s(3.0))
    timeline = [(2.0, False), (4.0, False), (5.2, True), (5.9, True)]
    assert [isolation.observe(cut_off, now) for now, cut_off in timeline] == [False] * len(timeline)
    assert not isolation.short(1)  # linked again


def test_it_counts_against_sync_replicas_not_against_one() -> None:
    isolation = Isolation(sync_replicas=2, after_s=1.0)
    assert isolation.short(1) and not isolation.short(2)


def test_a_primary_that_confirms_alone_is_never_short() -> None:
    assert not Isolation(sync_replicas=0, after_s=0.0).short(0)


def test_it_is_cut_off_only_when_a_quorum_of_live_nodes_that_may_lead_say_they_have_no_link_to_it() -> None:
    needed = election.quorum(3, 1)
    assert needed == 2
    me = node("gw-0", Role.PRIMARY, unlinked=None)
    assert cut_off_by([me, node("gw-1"), node("gw-2")], "gw-0", 7, needed)
    # A backup dead or frozen says nothing: its record, until its session
    # expires, is the one it had while linked.
    assert not cut_off_by([me, node("gw-1"), node("gw-2", unlinked=None)], "gw-0", 7, needed)
    # Unlinked from an older primary, not from this one.
    assert not cut_off_by([me, node("gw-1"), node("gw-2", unlinked=6)], "gw-0", 7, needed)
    # One backup gone altogether.
    assert not cut_off_by([me, node("gw-1")], "gw-0", 7, needed)
    # A backup still copying a snapshot, or standing aside, may not lead: it does not count.
    assert not cut_off_by([me, node("gw-1"), node("gw-2", Role.SYNCING)], "gw-0", 7, needed)
    assert not cut_off_by([me, node("gw-1"), node("gw-2", Role.STANDING_ASIDE)], "gw-0", 7, needed)
    # Its own record never counts.
    assert not cut_off_by([node("gw-0"), node("gw-1")], "gw-0", 7, needed)


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
