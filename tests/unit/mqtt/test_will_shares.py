"""Delayed wills as a pool (gateway.mqtt.lifetime): what a pending will
counts for, each holder's share of them (core.tally) kept in step with the
deadlines, and sessions through their own door: a CONNECT whose delayed will
has no room is refused with 0x97, and a will whose room went by the time its
connection ended is published at once instead of held."""

from __future__ import annotations

from typing import Any

import pytest

from core.broker import Broker
from core.tally import ANONYMOUS, USER
from gateway.mqtt import codec
from gateway.mqtt.codec import packets
from gateway.mqtt.lifetime import Lifetimes, PendingWill, will_bytes, will_refusal
from gateway.mqtt.codec.reasons import ReasonCode as R
from gateway.mqtt.registry import Registry
from gateway.mqtt.session import MqttSession, MqttSettings
from tests.support.core_fakes import FakeClock, RecordingStore
from tests.unit.mqtt.test_lifetime import Log, drop, read, send

T0 = 1_700_000_000_000
HERE, THERE, BOB = (ANONYMOUS, "127.0.0.1"), (ANONYMOUS, "127.0.0.2"), (USER, "bob")


def pending(holder: Any = HERE, nbytes: int = 10) -> PendingWill:
    return PendingWill(None, False, 0, "w", holder, nbytes)  # type: ignore[arg-type]


def test_what_a_will_counts_for_is_what_it_keeps() -> None:
    will = packets.Will("wé", b"12345", properties=packets.Properties(
        will_delay_interval=9, content_type="ct", response_topic="r", correlation_data=b"cd",
        user_properties=(("k", "vv"), ("k", "v"))))
    assert will_bytes(will) == 5 + 3 + 2 + 1 + 2 + 3 + 2
    assert will_bytes(packets.Will("w", b"")) == 1


def test_the_shares_follow_the_wills_pending() -> None:
    lifetimes = Lifetimes()
    shares = lifetimes.will_shares
    lifetimes.will_at("a", T0 + 1000, pending(nbytes=10))
    lifetimes.will_at("b", T0 + 2000, pending(nbytes=20))
    lifetimes.will_at("c", T0 + 9000, pending(BOB, 5))
    assert (shares.items[HERE], shares.bytes[HERE], shares.total_items, shares.total_bytes) == (2, 30, 3, 35)
    lifetimes.will_at("a", T0 + 3000, pending(nbytes=7))  # a will replaced: the old one out
    assert (shares.items[HERE], shares.bytes[HERE]) == (2, 27)
    lifetimes.resume("b")  # called off
    lifetimes.pop_due(T0 + 3000)  # published
    lifetimes.end_at("c", T0 + 4000)
    lifetimes.pop_due(T0 + 4000)  # gone with its session
    assert (len(shares.items), len(shares.bytes), shares.total_items, shares.total_bytes) == (0, 0, 0, 0)


def test_a_refusal_names_the_share_or_the_bound_and_a_reconnect_makes_its_own_room() -> None:
    lifetimes = Lifetimes()
    settings = MqttSettings(max_delayed_wills_per_user=2, max_delayed_will_bytes_per_user=100, max_delayed_wills=3)
    lifetimes.will_at("a", T0 + 1000, pending(nbytes=50))
    lifetimes.will_at("b", T0 + 1000, pending(nbytes=40))
    assert will_refusal(lifetimes, HERE, 1, settings) == "too many delayed wills for anonymous clients from 127.0.0.1 (limit 2)"
    assert will_refusal(lifetimes, HERE, 60, settings, "a") is None  # replaces a's: 100 bytes
    assert will_refusal(lifetimes, HERE, 61, settings, "a") == (
        "delayed wills of anonymous clients from 127.0.0.1 would pass 100 bytes (max_delayed_will_bytes_per_user)")
    assert will_refusal(lifetimes, THERE, 100, settings) is None
    lifetimes.will_at("c", T0 + 1000, pending(THERE, 1))
    assert will_refusal(lifetimes, BOB, 1, settings) == "too many delayed wills on the broker (limit 3)"
    assert will_refusal(lifetimes, THERE, 1, settings, "c") is None  # its own, replaced


@pytest.mark.parametrize("name", ["max_delayed_wills_per_user", "max_delayed_will_bytes_per_user", "max_delayed_wills",
                                  "max_delayed_will_bytes"])
def test_the_settings_are_checked(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        MqttSettings(**{name: -1})  # type: ignore[arg-type]


# -- sessions ------------------------------------------------------------------


class World:
    def __init__(self, **settings: Any) -> None:
        self.clock = FakeClock(wall_ms=T0)
        self.broker = Broker(self.clock, store=RecordingStore())
        self.registry = Registry()
        self.settings = MqttSettings(**settings)
        self.log = Log()

    def connect(self, client_id: str, will: packets.Will | None, *, source: str = "127.0.0.1",
                level: int = 5) -> tuple[MqttSession, codec.MqttConnection, packets.ConnAck]:
        session = MqttSession(self.broker, self.clock, self.settings, self.registry, conn_id=client_id, log=self.log,
                              source=source)
        conn = codec.MqttConnection(codec.Role.CLIENT)
        props = packets.Properties(session_expiry_interval=300) if level == 5 else None
        session.skeleton.receive_data(conn.send(packets.Connect(client_id, True, will=will, protocol_level=level,
                                                                properties=props)))
        connack, *_ = read(session, conn)
        return session, conn, connack

    def watcher(self) -> tuple[MqttSession, codec.MqttConnection]:
        session, conn, _ = self.connect("watcher", None, level=4)
        send(session, conn, packets.Subscribe(1, [("w/#", 0)]))
        read(session, conn)
        return session, conn


def delayed(topic: str = "w/x", payload: bytes = b"gone") -> packets.Will:
    return packets.Will(topic, payload, properties=packets.Properties(will_delay_interval=60))


def test_a_connect_whose_delayed_will_has_no_room_is_refused_with_quota_exceeded() -> None:
    world = World(max_delayed_wills_per_user=1)
    session, _, connack = world.connect("a", delayed())
    assert connack.return_code == R.SUCCESS
    drop(session)
    _, _, connack = world.connect("b", delayed())
    assert connack.return_code == R.QUOTA_EXCEEDED
    assert "b" not in world.registry.active
    _, _, connack = world.connect("c", delayed(), source="127.0.0.2")
    assert connack.return_code == R.SUCCESS
    _, _, connack = world.connect("d", packets.Will("w/x", b"now"))  # a will without a delay waits for nothing
    assert connack.return_code == R.SUCCESS
    _, _, connack = world.connect("a", delayed())  # a's own pending will makes room for its next
    assert connack.return_code == R.SUCCESS


def test_a_will_whose_room_went_while_connected_is_published_at_once() -> None:
    world = World(max_delayed_wills_per_user=1)
    watcher, wconn = world.watcher()
    first, _, _ = world.connect("a", delayed("w/a"))
    second, _, _ = world.connect("b", delayed("w/b"))  # both found room
    drop(first)
    drop(second)
    assert [p.payload for p in read(watcher, wconn)] == [b"gone"]  # b's, now
    assert list(world.registry.lifetimes.wills) == ["a"]
    assert any(event == "mqtt_will_not_delayed" for event, _ in world.log.events)
