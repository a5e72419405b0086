"""The pure HA decisions: records to and from ZooKeeper's bytes, the candidate, epochs."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.ha import election
from gateway.ha.election import NodeRecord, PrimaryRecord, RecordError, Role, Verdict


def node(node_id: str, epoch: int, lsn: int, role: Role = Role.BACKUP) -> NodeRecord:
    return NodeRecord(node_id=node_id, advertise=f"{node_id}:7000", epoch=epoch, lsn=lsn, role=role)


node_ids = st.from_regex(election.NODE_ID_PATTERN, fullmatch=True)
counters = st.integers(0, election.MAX_COUNTER)
records = st.builds(
    NodeRecord, node_id=node_ids, advertise=st.sampled_from(["10.0.0.1:7000", "[::1]:1", "gw-0.gw.ns.svc:65535"]),
    epoch=st.integers(0, 5), lsn=st.integers(0, 50), role=st.sampled_from(Role),
    vacancy=st.none() | st.integers(0, 5), unlinked=st.none() | st.integers(0, 5),
)


def unique_by_id(items: list[NodeRecord]) -> list[NodeRecord]:
    """As ZooKeeper holds them: one record per node id (its znode name)."""
    return list({r.node_id: r for r in items}.values())


# -- records ----------------------------------------------------------------------


@given(records)
def test_a_node_record_round_trips(record: NodeRecord) -> None:
    assert NodeRecord.from_json(record.to_json()) == record


@given(node_ids, counters, st.sampled_from(["h:1", "[fe80::1]:7000"]))
def test_a_primary_record_round_trips(node_id: str, epoch: int, advertise: str) -> None:
    record = PrimaryRecord(node_id=node_id, epoch=epoch, advertise=advertise)
    assert PrimaryRecord.from_json(record.to_json()) == record


def test_the_record_is_the_json_the_design_names() -> None:
    data = json.loads(node("gw-1", 3, 42, Role.SYNCING).to_json())
    assert data == {"node_id": "gw-1", "advertise": "gw-1:7000", "epoch": 3, "lsn": 42, "role": "syncing"}


def test_a_settled_record_says_which_vacancy_it_is_final_for() -> None:
    record = dataclasses.replace(node("gw-1", 3, 42), vacancy=3)
    assert json.loads(record.to_json())["vacancy"] == 3
    assert NodeRecord.from_json(record.to_json()) == record
    with pytest.raises(RecordError, match="vacancy"):
        NodeRecord.from_json(b'{"node_id":"a","advertise":"a:1","epoch":1,"lsn":2,"role":"backup","vacancy":-1}')


def test_unknown_keys_are_ignored_so_a_newer_node_may_say_more() -> None:
    data = b'{"node_id":"a","advertise":"a:1","epoch":1,"lsn":2,"role":"backup","owns":["/queue/x"]}'
    assert NodeRecord.from_json(data) == NodeRecord("a", "a:1", 1, 2, Role.BACKUP)


@pytest.mark.parametrize("data", [
    b"", b"{not json", b"\xff\xfe", b"[]", b"null", b"{}",
    b'{"node_id":"a","advertise":"a:1","epoch":1,"lsn":2}',  # no role
    b'{"node_id":"a","advertise":"a:1","epoch":1,"lsn":2,"role":"king"}',
    b'{"node_id":"a","advertise":"a:1","epoch":true,"lsn":2,"role":"backup"}',  # a bool is no epoch
    b'{"node_id":"a","advertise":"a:1","epoch":1.0,"lsn":2,"role":"backup"}',
    b'{"node_id":"a","advertise":"a:1","epoch":-1,"lsn":2,"role":"backup"}',
    b'{"node_id":"a","advertise":"a:1","epoch":1,"lsn":9223372036854775808,"role":"backup"}',
    b'{"node_id":"a","advertise":"a:1","epoch":NaN,"lsn":2,"role":"backup"}',
    b'{"node_id":"a/b","advertise":"a:1","epoch":1,"lsn":2,"role":"backup"}',  # not a znode name
    b'{"node_id":"","advertise":"a:1","epoch":1,"lsn":2,"role":"backup"}',
    b'{"node_id":"a","advertise":"a","epoch":1,"lsn":2,"role":"backup"}',  # no port
    b'{"node_id":"a","advertise":"a:0","epoch":1,"lsn":2,"role":"backup"}',
    b'{"node_id":"a","advertise":"a:65536","epoch":1,"lsn":2,"role":"backup"}',
    b'{"node_id":"a","advertise":"a b:1","epoch":1,"lsn":2,"role":"backup"}',
    b'{"node_id":"a","advertise":":1","epoch":1,"lsn":2,"role":"backup"}',
    b'{"node_id":"a","advertise":"a:1","epoch":1,"lsn":2,"role":"backup","pad":"' + b"x" * 1024 + b'"}',
    b"[" * 100_000,  # deep nesting: refused by size before the parser recurses
])
def test_a_bad_node_record_is_refused_with_the_reason(data: bytes) -> None:
    with pytest.raises(RecordError):
        NodeRecord.from_json(data)


@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_arbitrary_bytes_raise_only_record_error(data: bytes) -> None:
    for parse in (NodeRecord.from_json, PrimaryRecord.from_json, election.parse_epoch):
        try:
            parse(data)
        except RecordError:
            pass


@given(st.dictionaries(st.sampled_from(["node_id", "advertise", "epoch", "lsn", "role", "x"]),
                       st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10)
                       | st.lists(st.integers(), max_size=2)))
def test_arbitrary_json_objects_raise_only_record_error(fields: dict[str, object]) -> None:
    try:
        NodeRecord.from_json(json.dumps(fields).encode())
    except RecordError:
        pass


def test_a_record_is_validated_when_constructed() -> None:
    with pytest.raises(RecordError):
        NodeRecord("a", "a:1", 1, 2, "backup")  # type: ignore[arg-type]  # a str is not a Role
    with pytest.raises(RecordError):
        PrimaryRecord("a", -1, "a:1")


# -- the candidate ----------------------------------------------------------------


def test_the_node_with_the_highest_epoch_then_lsn_is_the_candidate() -> None:
    assert election.candidate([node("a", 1, 90), node("b", 2, 10), node("c", 2, 9)]) == "b"
    assert election.candidate([node("a", 2, 5), node("b", 2, 7), node("c", 1, 99)]) == "b"


def test_ties_go_to_the_lowest_node_id() -> None:
    assert election.candidate([node("gw-2", 1, 5), node("gw-0", 1, 5), node("gw-1", 1, 5)]) == "gw-0"


def test_a_syncing_node_is_not_eligible_however_much_it_holds() -> None:
    records = [node("a", 1, 5), node("b", 9, 999, Role.SYNCING)]
    assert election.candidate(records) == "a"
    assert election.candidate([node("b", 9, 999, Role.SYNCING)]) is None
    assert election.candidate([]) is None


def test_a_node_still_saying_primary_is_eligible() -> None:
    # The old primary stepped down (released /primary) but has not rewritten its record yet.
    assert election.candidate([node("a", 3, 10, Role.PRIMARY), node("b", 3, 9)]) == "a"


@given(st.lists(records, max_size=8).map(unique_by_id))
def test_the_candidate_holds_no_less_than_any_eligible_node(items: list[NodeRecord]) -> None:
    chosen = election.candidate(items)
    eligible = [r for r in items if election.eligible(r)]
    if not eligible:
        assert chosen is None
        return
    (winner,) = [r for r in items if r.node_id == chosen]
    assert election.eligible(winner)
    assert all(winner.position() >= r.position() for r in eligible)
    # ...and among those that hold as much, it is the lowest id.
    assert winner.node_id == min(r.node_id for r in eligible if r.position() == winner.position())


@given(st.lists(records, max_size=8).map(unique_by_id), st.randoms())
def test_the_candidate_does_not_depend_on_the_order_records_were_read(items: list[NodeRecord], rnd: random.Random) -> None:
    shuffled = list(items)
    rnd.shuffle(shuffled)
    assert election.candidate(shuffled) == election.candidate(items) == election.candidate(reversed(items))


@given(st.lists(records, min_size=1, max_size=8).map(unique_by_id))
def test_losing_a_node_that_is_not_the_candidate_never_changes_the_candidate(items: list[NodeRecord]) -> None:
    chosen = election.candidate(items)
    for r in items:
        if r.node_id != chosen:
            assert election.candidate([x for x in items if x is not r]) == chosen


# -- settling: decided only on final records ------------------------------------------


def final_for(vacancy: int, *items: NodeRecord) -> list[NodeRecord]:
    return [dataclasses.replace(r, vacancy=vacancy) for r in items]


def test_nobody_leads_until_every_eligible_record_is_final_for_the_vacancy() -> None:
    a, b = node("a", 1, 40), node("b", 1, 45)  # as last published while epoch 1's primary lived
    # b has settled (final: 50), a not yet: a's record may be stale, so no decision.
    assert election.decide([a, dataclasses.replace(b, lsn=50, vacancy=1)], 1) is None
    # Final for an older vacancy is not final for this one.
    assert election.decide([dataclasses.replace(a, vacancy=0), dataclasses.replace(b, vacancy=1)], 1) is None
    # Both final: a turns out to hold more.
    assert election.decide(final_for(1, dataclasses.replace(a, lsn=60), dataclasses.replace(b, lsn=50)), 1) == "a"


def test_a_record_that_is_not_eligible_need_not_settle() -> None:
    records = [*final_for(2, node("a", 2, 5)), node("b", 9, 999, Role.SYNCING)]
    assert election.decide(records, 2) == "a"
    assert election.decide([], 0) is None


def test_an_election_needs_enough_final_records_to_include_every_confirmed_batch() -> None:
    # Three nodes, a batch confirmed by one backup: any two of the three hold it.
    assert election.quorum(3, 1) == 2
    assert election.quorum(5, 2) == 3
    assert election.quorum(2, 1) == 1
    assert election.quorum(1, 0) == 1
    assert election.quorum(3, 0) == 2  # 0 elects as 1 does rather than wait for a dead primary
    lagging, ahead = node("c", 1, 10), node("b", 1, 90)
    # c alone (the first back after a full stop) may not lead a group of three...
    assert election.decide(final_for(1, lagging), 1, election.quorum(3, 1)) is None
    # ...and once b is back, b leads, holding what c lacks.
    assert election.decide(final_for(1, lagging, ahead), 1, election.quorum(3, 1)) == "b"
    # A record that may not lead does not count toward the quorum.
    assert election.decide([*final_for(1, lagging), node("d", 1, 99, Role.SYNCING)], 1, 2) is None


@given(st.lists(records, min_size=1, max_size=8).map(unique_by_id), st.integers(0, 5), st.integers(1, 9))
def test_with_fewer_eligible_records_than_the_quorum_nobody_leads(items: list[NodeRecord], vacancy: int,
                                                                  needed: int) -> None:
    items = final_for(vacancy, *items)
    chosen = election.decide(items, vacancy, needed)
    if sum(1 for r in items if election.eligible(r)) < needed:
        assert chosen is None
    else:
        assert chosen == election.candidate(items)


settled_groups = st.tuples(st.lists(records, min_size=1, max_size=8).map(unique_by_id), st.integers(0, 5))


@given(settled_groups)
def test_with_every_record_final_the_winner_holds_the_most(group: tuple[list[NodeRecord], int]) -> None:
    items, vacancy = group
    items = final_for(vacancy, *items)
    chosen = election.decide(items, vacancy)
    assert chosen == election.candidate(items)
    eligible = [r for r in items if election.eligible(r)]
    if eligible:
        (winner,) = [r for r in items if r.node_id == chosen]
        assert all(winner.position() >= r.position() for r in eligible)
    else:
        assert chosen is None


@given(settled_groups, st.data())
def test_with_one_eligible_record_not_final_nobody_may_lead(group: tuple[list[NodeRecord], int],
                                                            data: st.DataObject) -> None:
    items, vacancy = group
    items = final_for(vacancy, *items)
    late = data.draw(st.sampled_from(items))
    stale = data.draw(st.none() | st.integers(0, 5).filter(lambda v: v != vacancy))
    items = [dataclasses.replace(r, vacancy=stale, role=Role.BACKUP) if r is late else r for r in items]
    assert election.decide(items, vacancy) is None


# -- epochs -----------------------------------------------------------------------


@given(counters)
def test_an_epoch_round_trips_through_its_znode(epoch: int) -> None:
    assert election.parse_epoch(election.format_epoch(epoch)) == epoch


@pytest.mark.parametrize("data", [b"", b"-1", b"+1", b" 1", b"1 ", b"1.0", b"0x10", b"9223372036854775808", b"1" * 20, "١".encode()])
def test_a_bad_epoch_is_refused(data: bytes) -> None:
    with pytest.raises(RecordError):
        election.parse_epoch(data)


def test_a_takeover_takes_the_next_epoch() -> None:
    assert election.takeover_epoch(0) == 1
    assert election.takeover_epoch(41) == 42
    with pytest.raises(RecordError):
        election.takeover_epoch(election.MAX_COUNTER)


@given(counters, counters)
def test_a_node_never_accepts_an_older_epoch(highest: int, offered: int) -> None:
    verdict = election.judge_epoch(highest, offered)
    assert (verdict is Verdict.REFUSE) == (offered < highest)
    assert (verdict is Verdict.ACCEPT) == (offered == highest)
    assert (verdict is Verdict.ADVANCE) == (offered > highest)


def test_epoch_verdicts_in_a_takeover() -> None:
    # A backup that followed epoch 4 hears from the new primary (5), then from the old one (4).
    assert election.judge_epoch(4, 4) is Verdict.ACCEPT
    assert election.judge_epoch(4, 5) is Verdict.ADVANCE
    assert election.judge_epoch(5, 4) is Verdict.REFUSE


# -- what /epoch says when it was written over ------------------------------------


@given(counters)
def test_the_group_s_own_epoch_is_taken_as_written(epoch: int) -> None:
    # Every takeover writes n + 1 by compare-and-set: value and data version agree.
    assert election.current_epoch(election.format_epoch(epoch), epoch) == (epoch, None)


@pytest.mark.parametrize("data", [b"garbage", b"", b"-5", b"1" * 20, b'{"epoch": 3}', b"\xff\xfe", b"7" * 2000])
def test_an_epoch_that_does_not_parse_counts_as_its_version(data: bytes) -> None:
    """Not 0 (absent), which would let a deposed primary's epoch count again:
    the version is at least every epoch ever written there, so the next
    takeover (version + 1) is newer than every deposed primary's."""
    epoch, reason = election.current_epoch(data, 6)
    assert epoch == 6 and reason is not None and "epoch must be a decimal number" in reason
    assert election.takeover_epoch(epoch) == 7


def test_an_epoch_written_lower_never_goes_back() -> None:
    # A write that is not a takeover bumped the version past the value: the version counts.
    assert election.current_epoch(b"0", 9) == (9, None)
    # A value above the version (a tree restored by hand) is kept: epochs only grow.
    assert election.current_epoch(b"12", 3) == (12, None)


def test_a_refused_record_is_news_once_per_reason() -> None:
    refusals = election.Refusals(limit=3)
    assert refusals.first("/g/epoch", "not a number")
    assert not refusals.first("/g/epoch", "not a number")  # read again at the next look: not logged again
    assert refusals.first("/g/epoch", "too long")  # another reason is news
    refusals.clear("/g/epoch")  # it parsed again
    assert refusals.first("/g/epoch", "too long")
    # Bounded: past the limit it starts over (at worst a line logged again).
    for i in range(10):
        assert refusals.first(f"/g/nodes/{i}", "bad")
        assert len(refusals.reasons) <= 3
