"""The outbound in-flight table, swept: every stage against every packet a
client acknowledges with (h2's state-machine test shape)."""

from __future__ import annotations

import pytest

from gateway.mqtt.codec import packets
from gateway.mqtt.inflight import MAX_PACKET_ID, InFlight, RefusingPubRec, SessionState, Stage

ACKS = (packets.PubAck, packets.PubRec, RefusingPubRec, packets.PubComp)
# What each (stage, packet) does: (next stage or None if forgotten, core ack now);
# absent: nothing changes.
EXPECTED = {
    (Stage.AWAITING_PUBACK, packets.PubAck): (None, True),
    (Stage.AWAITING_PUBREC, packets.PubRec): (Stage.AWAITING_PUBCOMP, True),
    # A v5 PUBREC >= 0x80 ends the exchange: no PUBREL, the id is free [MQTT-4.3.3-4].
    (Stage.AWAITING_PUBREC, RefusingPubRec): (None, True),
    (Stage.AWAITING_PUBCOMP, packets.PubComp): (None, False),
}


@pytest.mark.parametrize("stage", list(Stage))
@pytest.mark.parametrize("kind", ACKS, ids=lambda kind: kind.__name__)
def test_every_stage_against_every_acknowledgement(stage: Stage, kind: type) -> None:
    state = SessionState()
    entry = InFlight("token", "m1", stage)
    state.outbound[5] = entry
    step = state.advance(5, kind)
    expected = EXPECTED.get((stage, kind))
    if expected is None:
        assert step is None and state.outbound == {5: entry} and entry.stage is stage
        return
    next_stage, acked = expected
    assert step == (entry, acked)
    if next_stage is None:
        assert state.outbound == {}
    else:
        assert state.outbound == {5: entry} and entry.stage is next_stage


@pytest.mark.parametrize("kind", ACKS, ids=lambda kind: kind.__name__)
def test_an_id_not_in_flight_changes_nothing(kind: type) -> None:
    state = SessionState()
    assert state.advance(1, kind) is None and state.outbound == {}


def test_suspend_remembers_unacked_ids_and_keeps_released_ones() -> None:
    state = SessionState()
    state.outbound = {
        1: InFlight("t", "a", Stage.AWAITING_PUBACK),
        2: InFlight("t", "b", Stage.AWAITING_PUBREC),
        3: InFlight("t", "c", Stage.AWAITING_PUBCOMP),
    }
    state.suspend("alice")
    assert state.owner == "alice"
    assert state.ids_by_message == {"a": 1, "b": 2}
    assert list(state.outbound) == [3] and state.released() == [3]


def test_packet_ids_skip_those_in_flight() -> None:
    state = SessionState()
    first = state.next_packet_id()
    state.outbound[first + 1] = InFlight("t", "x", Stage.AWAITING_PUBACK)
    assert state.next_packet_id() == first + 2


def test_packet_ids_go_round_from_the_last_to_the_first_skipping_those_in_flight() -> None:
    state = SessionState()
    state.outbound[1] = InFlight("t", "x", Stage.AWAITING_PUBACK)  # still unacknowledged at the wrap
    ids = [state.next_packet_id() for _ in range(MAX_PACKET_ID)]
    assert ids[0] == 2 and ids[MAX_PACKET_ID - 2] == MAX_PACKET_ID
    assert ids[MAX_PACKET_ID - 1] == 2  # 1 is still in flight: skipped, never 0
    assert sorted(set(ids)) == list(range(2, MAX_PACKET_ID + 1))


def test_with_every_packet_id_in_flight_none_is_given() -> None:
    state = SessionState()
    state.outbound = {packet_id: InFlight("t", str(packet_id), Stage.AWAITING_PUBACK) for packet_id in range(1, MAX_PACKET_ID + 1)}
    with pytest.raises(RuntimeError):
        state.next_packet_id()
