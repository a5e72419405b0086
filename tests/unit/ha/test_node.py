"""The node's role table (gateway/ha/node.py): the paths a node takes from
start to backup, to primary through an election, through a ZooKeeper
disconnection with its receipts held, and, when fenced, out of its run so
that the process starts a fresh node that rejoins as a backup."""

from __future__ import annotations

import pytest

from gateway.ha.node import TABLE, Action, Event, State, Transition, step


def run(state: State, *events: Event) -> tuple[State, list[Action]]:
    actions: list[Action] = []
    for event in events:
        state, done = step(state, event)
        actions += done
    return state, actions


def test_a_node_that_finds_a_primary_follows_it_until_caught_up() -> None:
    assert run(State.STARTING, Event.PRIMARY_SEEN, Event.CAUGHT_UP) == (State.BACKUP_IN_SYNC, [Action.FOLLOW])


def test_a_backup_whose_primary_vanishes_publishes_its_lsn_before_trying_to_lead_then_promotes() -> None:
    state, actions = run(State.BACKUP_IN_SYNC, Event.PRIMARY_GONE, Event.LEAD_TAKEN, Event.PROMOTED)
    assert state == State.PRIMARY
    assert actions == [Action.STOP_FOLLOWING, Action.PUBLISH_LSN, Action.TRY_LEAD, Action.PROMOTE, Action.START_PRIMARY]


def test_a_candidate_that_loses_tries_again_while_nobody_leads_and_follows_the_winner() -> None:
    state, actions = run(State.CANDIDATE, Event.LEAD_NOT_TAKEN, Event.PRIMARY_GONE)
    assert (state, actions) == (State.CANDIDATE, [Action.PUBLISH_LSN, Action.TRY_LEAD])
    assert step(State.CANDIDATE, Event.PRIMARY_SEEN) == Transition(State.BACKUP_SYNCING, (Action.FOLLOW,))


def test_the_first_node_of_an_empty_group_becomes_candidate() -> None:
    assert step(State.STARTING, Event.PRIMARY_GONE) == Transition(State.CANDIDATE, (Action.PUBLISH_LSN, Action.TRY_LEAD))


def test_a_suspended_primary_holds_its_receipts_and_arms_its_fence_keeping_its_clients() -> None:
    assert step(State.PRIMARY, Event.FENCE) == Transition(State.SUSPENDED, (Action.HOLD_RECEIPTS, Action.ARM_FENCE_TIMER))


def test_a_suspended_primary_connected_again_with_its_session_releases_the_receipts_and_serves_on() -> None:
    assert run(State.PRIMARY, Event.FENCE, Event.RECONNECT) == (
        State.PRIMARY, [Action.HOLD_RECEIPTS, Action.ARM_FENCE_TIMER, Action.RELEASE_RECEIPTS])
    # Again and again (a rolling restart of the ensemble: one suspension per server).
    state, actions = run(State.PRIMARY, *[Event.FENCE, Event.RECONNECT] * 3)
    assert state == State.PRIMARY and actions.count(Action.RELEASE_RECEIPTS) == 3
    assert Action.STOP_ACCEPTING not in actions


def test_a_suspended_primary_whose_fence_is_due_stops_accepting_and_restarts_as_a_backup_once_lost_or_back() -> None:
    restart = Action.RESTART_AS_BACKUP
    held = [Action.HOLD_RECEIPTS, Action.ARM_FENCE_TIMER]
    assert run(State.PRIMARY, Event.FENCE, Event.FENCE_DUE) == (State.FENCED, [*held, Action.STOP_ACCEPTING])
    assert run(State.PRIMARY, Event.FENCE, Event.FENCE_DUE, Event.LOST) == (
        State.FENCED, [*held, Action.STOP_ACCEPTING, restart])
    # Back after the fence, its session kept or not: another node may have led meanwhile.
    assert run(State.PRIMARY, Event.FENCE, Event.FENCE_DUE, Event.RECONNECT) == (
        State.FENCED, [*held, Action.STOP_ACCEPTING, restart])


def test_a_fenced_primary_that_hears_nothing_restarts_as_a_backup_all_the_same() -> None:
    # ZooKeeper away for a whole session timeout after the fence: waiting is bounded.
    assert run(State.PRIMARY, Event.FENCE, Event.FENCE_DUE, Event.QUIET) == (
        State.FENCED, [Action.HOLD_RECEIPTS, Action.ARM_FENCE_TIMER, Action.STOP_ACCEPTING, Action.RESTART_AS_BACKUP])


def test_a_fence_due_after_the_primary_is_back_changes_nothing() -> None:
    # A timer from an earlier suspension, late: the runtime disarms it, and the table ignores it.
    assert step(State.PRIMARY, Event.FENCE_DUE) == Transition(State.PRIMARY, ())
    for state in State:
        if state != State.SUSPENDED:
            assert step(state, Event.FENCE_DUE) == Transition(state, ())


@pytest.mark.parametrize("event", [Event.LOST, Event.PRIMARY_SEEN, Event.PRIMARY_GONE, Event.REFUSED_STALE])
def test_a_suspended_primary_that_is_deposed_stops_accepting_and_restarts_as_a_backup_at_once(event: Event) -> None:
    # No waiting for the timer: its session expired, or another node leads, or a backup follows a newer epoch.
    assert step(State.SUSPENDED, event) == Transition(State.FENCED, (Action.STOP_ACCEPTING, Action.RESTART_AS_BACKUP))


def test_a_suspended_primary_never_releases_receipts_except_when_connected_again() -> None:
    for (state, event), transition in TABLE.items():
        if Action.RELEASE_RECEIPTS in transition.actions:
            assert (state, event, transition.state) == (State.SUSPENDED, Event.RECONNECT, State.PRIMARY)
    for event in Event:
        if event not in (Event.RECONNECT, Event.FENCE_DUE, Event.LOST, Event.PRIMARY_SEEN, Event.PRIMARY_GONE,
                         Event.REFUSED_STALE, Event.STORE_FAILED):
            assert step(State.SUSPENDED, event) == Transition(State.SUSPENDED, ())


@pytest.mark.parametrize("event", [Event.LOST, Event.PRIMARY_SEEN, Event.PRIMARY_GONE, Event.REFUSED_STALE])
def test_a_primary_that_is_deposed_stops_accepting_and_restarts_as_a_backup(event: Event) -> None:
    assert step(State.PRIMARY, event) == Transition(State.FENCED, (Action.STOP_ACCEPTING, Action.RESTART_AS_BACKUP))


@pytest.mark.parametrize("event", list(Event))
def test_a_fenced_node_never_serves_again_in_the_same_run(event: Event) -> None:
    # Only a fresh node (a new session, the folder reopened as a follower) leads again.
    state, actions = step(State.FENCED, event)
    assert state == State.FENCED
    assert not {Action.START_PRIMARY, Action.PROMOTE, Action.TRY_LEAD, Action.FOLLOW} & set(actions)


@pytest.mark.parametrize("state", [State.PRIMARY, State.SUSPENDED])
def test_a_primary_whose_store_cannot_write_steps_down(state: State) -> None:
    assert step(state, Event.STORE_FAILED) == Transition(State.STEPPED_DOWN, (Action.STOP_ACCEPTING, Action.STEP_DOWN))


@pytest.mark.parametrize("event", list(Event))
def test_a_stepped_down_node_does_nothing_more_in_its_run(event: Event) -> None:
    # Its run ends (STEP_DOWN); only a fresh node, once the disk writes, joins again.
    assert step(State.STEPPED_DOWN, event) == Transition(State.STEPPED_DOWN, ())


def test_only_a_primary_steps_down_for_its_store() -> None:
    for state in State:
        if state not in (State.PRIMARY, State.SUSPENDED):
            assert step(state, Event.STORE_FAILED) == Transition(state, ())


def test_quiet_means_nothing_to_a_node_that_is_not_fenced() -> None:
    for state in State:
        if state != State.FENCED:
            assert step(state, Event.QUIET) == Transition(state, ())


def test_a_primary_ignores_what_only_concerns_backups() -> None:
    for event in (Event.CAUGHT_UP, Event.GAP, Event.FOLLOW_ENDED, Event.LEAD_TAKEN, Event.RECONNECT):
        assert step(State.PRIMARY, event) == Transition(State.PRIMARY, ())


def test_a_backup_that_loses_its_session_stops_following_and_rejoins_when_back() -> None:
    state, actions = run(State.BACKUP_IN_SYNC, Event.LOST, Event.RECONNECT)
    assert (state, actions) == (State.STARTING, [Action.STOP_FOLLOWING, Action.REJOIN])


def test_a_backup_refused_as_stale_stops_following_and_waits_for_a_new_lock() -> None:
    assert step(State.BACKUP_IN_SYNC, Event.REFUSED_STALE) == Transition(State.BACKUP_SYNCING, (Action.STOP_FOLLOWING,))
    assert step(State.BACKUP_SYNCING, Event.GAP) == Transition(State.BACKUP_SYNCING, ())


def test_only_a_candidate_promotes_and_only_a_primary_or_fenced_node_restarts_or_stops_accepting() -> None:
    for (state, _event), transition in TABLE.items():
        if Action.PROMOTE in transition.actions or Action.START_PRIMARY in transition.actions:
            assert state == State.CANDIDATE
        if Action.RESTART_AS_BACKUP in transition.actions or Action.STOP_ACCEPTING in transition.actions:
            assert state in (State.PRIMARY, State.SUSPENDED, State.FENCED)
            assert transition.state in (State.FENCED, State.STEPPED_DOWN)  # never serving while its run ends
        if Action.HOLD_RECEIPTS in transition.actions or Action.ARM_FENCE_TIMER in transition.actions:
            assert (state, transition.state) == (State.PRIMARY, State.SUSPENDED)


def test_only_a_serving_primary_steps_down_when_cut_off_from_its_backups() -> None:
    assert step(State.PRIMARY, Event.ISOLATED) == Transition(State.STEPPED_DOWN, (Action.STOP_ACCEPTING, Action.STEP_DOWN))
    for state in State:
        if state != State.PRIMARY:  # a suspended one fences on its own timer
            assert step(state, Event.ISOLATED) == Transition(state, ())


def test_the_runtime_carries_out_every_action_of_the_table_with_a_method_of_its_own() -> None:
    """HaNode.act dispatches through a table (gateway/ha/runtime.py): none of
    the actions the role table can return is missing from it."""
    import structlog

    from gateway.config import Config, HaSettings
    from gateway.ha.runtime import HaNode

    node = HaNode(Config(ha=HaSettings(node_id="n")), structlog.get_logger("test"))
    assert set(node.acts) == set(Action)
    assert {a for t in TABLE.values() for a in t.actions} <= set(node.acts)
    assert len({method.__name__ for method in node.acts.values()}) == len(Action)
