"""The replication link's liveness as deadline math (gateway/ha/liveness.py)."""

from __future__ import annotations

import pytest

from gateway.ha.liveness import HEARTBEAT_S, TIMEOUT_S, Liveness, backoff


def test_an_idle_end_pings_one_heartbeat_after_its_last_send() -> None:
    live = Liveness.start(100.0, heartbeat_s=0.5, timeout_s=2.0)
    assert live.ping_at() == 100.5
    assert not live.ping_due(100.49)
    assert live.ping_due(100.5)
    live.sent(100.3)  # a batch or an ack went out: no ping needed until later
    assert live.ping_at() == 100.8
    assert not live.ping_due(100.5)


def test_a_link_is_dead_after_the_timeout_of_silence_and_anything_heard_resets_it() -> None:
    live = Liveness.start(10.0, heartbeat_s=0.5, timeout_s=2.0)
    assert live.dead_at() == 12.0
    assert not live.dead(11.99)
    live.heard(11.5)
    assert live.dead_at() == 13.5
    assert not live.dead(13.0)
    assert live.dead(13.5)


def test_sending_does_not_keep_a_link_alive_and_hearing_does_not_delay_a_ping() -> None:
    # A link we only send on (the peer gone silent) still dies; one we only hear on still pings.
    live = Liveness.start(0.0, heartbeat_s=0.5, timeout_s=2.0)
    for t in (0.5, 1.0, 1.5):
        live.sent(t)
    assert live.dead(2.0)
    live = Liveness.start(0.0, heartbeat_s=0.5, timeout_s=2.0)
    live.heard(0.4)
    assert live.ping_due(0.5)


def test_times_never_go_backwards() -> None:
    live = Liveness.start(5.0, heartbeat_s=0.5, timeout_s=2.0)
    live.heard(4.0)
    live.sent(4.0)
    assert (live.dead_at(), live.ping_at()) == (7.0, 5.5)


def test_the_defaults_leave_several_heartbeats_within_the_timeout() -> None:
    assert TIMEOUT_S >= 3 * HEARTBEAT_S


@pytest.mark.parametrize(("failures", "pause"), [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.5), (10, 0.5), (1000, 0.5)])
def test_reconnection_backs_off_from_a_tenth_of_a_second_to_a_quarter_of_the_timeout(
        failures: int, pause: float) -> None:
    assert backoff(failures, timeout_s=2.0) == pytest.approx(pause)


def test_the_worst_case_from_a_heal_to_a_new_attempt_is_within_the_timeout_and_a_backoff() -> None:
    # An attempt begun just before the heal is given up at most timeout_s later
    # (its connect and handshake share one deadline); the next begins one
    # backoff after: together within 1.25 x timeout_s, 2.5 s by default.
    assert TIMEOUT_S + max(backoff(n, TIMEOUT_S) for n in range(1, 100)) <= 1.25 * TIMEOUT_S <= 3.0
