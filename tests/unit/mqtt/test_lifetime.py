"""MQTT 5 session lifetime, sans-IO: the deadlines' bookkeeping
(gateway.mqtt.lifetime) alone, then sessions through their own door (v5
packets in, the outbox read back) on a fake clock, a real core Broker and a
store that records its notes; the registry's expire_due plays the timer."""

from __future__ import annotations

from typing import Any

from core.broker import Broker
from gateway.mqtt import codec
from gateway.mqtt.codec import packets
from gateway.mqtt.lifetime import CLOSED, EXPIRY_NOTES, NEVER, OPEN, Lifetimes, PendingWill, expiry_note, read_note
from gateway.mqtt.registry import OWNER_PREFIX, Registry
from gateway.mqtt.session import MqttSession, MqttSettings
from tests.support.core_fakes import FakeClock, RecordingStore

T0 = 1_700_000_000_000


def pending(topic: str = "w") -> PendingWill:
    return PendingWill(None, False, 0, topic)  # type: ignore[arg-type]


# -- the bookkeeping -----------------------------------------------------------


def test_deadlines_come_due_in_order_and_only_when_due() -> None:
    lifetimes = Lifetimes()
    will = pending()
    lifetimes.end_at("a", T0 + 5000)
    lifetimes.will_at("b", T0 + 2000, will)
    assert lifetimes.next_due() == T0 + 2000
    assert lifetimes.pop_due(T0 + 1999) == []
    assert lifetimes.pop_due(T0 + 2000) == [("b", False, will)]
    assert lifetimes.next_due() == T0 + 5000
    assert lifetimes.pop_due(T0 + 9000) == [("a", True, None)]
    assert lifetimes.next_due() is None and not lifetimes.ends and not lifetimes.wills


def test_a_session_end_takes_its_pending_will_with_it() -> None:
    lifetimes = Lifetimes()
    will = pending()
    lifetimes.will_at("a", T0 + 10_000, will)  # a will delay longer than the session's interval
    lifetimes.end_at("a", T0 + 2000)
    assert lifetimes.pop_due(T0 + 2000) == [("a", True, will)]
    assert lifetimes.pop_due(T0 + 10_000) == []  # not published twice


def test_resuming_calls_off_the_end_and_hands_back_the_will() -> None:
    lifetimes = Lifetimes()
    will = pending()
    lifetimes.end_at("a", T0 + 2000)
    lifetimes.will_at("a", T0 + 1000, will)
    assert lifetimes.resume("a") is will
    assert lifetimes.next_due() is None
    assert lifetimes.pop_due(T0 + 60_000) == []
    assert lifetimes.resume("a") is None


def test_a_rescheduled_end_counts_only_at_its_new_time() -> None:
    lifetimes = Lifetimes()
    lifetimes.end_at("a", T0 + 1000)
    lifetimes.end_at("a", T0 + 3000)
    assert lifetimes.next_due() == T0 + 3000
    assert lifetimes.pop_due(T0 + 2000) == []
    assert lifetimes.pop_due(T0 + 3000) == [("a", True, None)]


def test_the_timer_is_woken_only_for_an_earlier_deadline() -> None:
    lifetimes = Lifetimes()
    wakes: list[int] = []
    lifetimes.on_earlier = lambda: wakes.append(1)
    lifetimes.end_at("a", T0 + 5000)
    lifetimes.end_at("b", T0 + 9000)
    lifetimes.end_at("c", T0 + 1000)
    assert len(wakes) == 2  # the first, and the earlier one


def test_the_heap_stays_bounded_when_deadlines_are_called_off() -> None:
    lifetimes = Lifetimes()
    for i in range(10_000):
        lifetimes.end_at("a", T0 + i)
        lifetimes.resume("a")
    assert len(lifetimes) < 200


def test_notes_read_back_at_start_up() -> None:
    assert read_note(expiry_note(CLOSED, T0 + 5000, "alice"), T0) == (T0 + 5000, "alice")
    # Written while the connection was open: the interval counts from this start.
    assert read_note(expiry_note(OPEN, 30, ""), T0) == (T0 + 30_000, "")  # anonymous's
    assert read_note(b"garbage", T0) is None
    assert read_note(b"at:soon:", T0) is None


# -- sessions ------------------------------------------------------------------


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def bind(self, **_: Any) -> Log:
        return self

    def info(self, event: str, **fields: Any) -> None:
        self.events.append((event, fields))

    warning = info


class World:
    def __init__(self) -> None:
        self.clock = FakeClock(wall_ms=T0)
        self.store = RecordingStore()
        self.broker = Broker(self.clock, store=self.store)
        self.registry = Registry()
        self.log = Log()

    def client(self, client_id: str, *, clean: bool = True, expiry: int | None = None, will: packets.Will | None = None,
               level: int = 5) -> tuple[MqttSession, codec.MqttConnection, packets.ConnAck]:
        session = MqttSession(self.broker, self.clock, MqttSettings(), self.registry, conn_id=client_id, log=self.log)
        conn = codec.MqttConnection(codec.Role.CLIENT)
        props = packets.Properties(session_expiry_interval=expiry) if expiry is not None else None
        session.skeleton.receive_data(conn.send(packets.Connect(client_id, clean, will=will, protocol_level=level,
                                                                properties=props)))
        connack, *_ = read(session, conn)
        assert isinstance(connack, packets.ConnAck) and connack.return_code == 0, connack
        return session, conn, connack

    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.registry.expire_due(self.broker, self.clock.wall_ms(), self.log)

    def notes(self) -> list[tuple[str, bytes | None]]:
        return [(call[2], call[3]) for call in self.store.calls if call[0] == "note" and call[1] == EXPIRY_NOTES]


def read(session: MqttSession, conn: codec.MqttConnection) -> list[Any]:
    out = []
    while data := session.outbox.drain(1 << 62):
        session.skeleton.on_drained()
        conn.receive_data(data)
        out.extend(conn.events())
    return out


def send(session: MqttSession, conn: codec.MqttConnection, *sent: Any) -> None:
    session.skeleton.receive_data(b"".join(conn.send(packet) for packet in sent))


def drop(session: MqttSession) -> None:
    session.skeleton.receive_data(b"")  # the peer's EOF: no DISCONNECT


def test_a_session_with_an_expiry_is_resumed_before_it_and_gone_after() -> None:
    world = World()
    session, conn, _ = world.client("c", expiry=2)
    send(session, conn, packets.Subscribe(1, [("t", 1)]))
    read(session, conn)
    drop(session)
    assert world.notes()[-1] == ("c", b"at:%d:" % (T0 + 2000))  # the deadline survives a restart
    world.tick(1)
    session, conn, connack = world.client("c", clean=False, expiry=2)
    assert connack.session_present
    drop(session)
    world.tick(1.5)
    assert world.broker.durables.of_client(OWNER_PREFIX + "c")  # 1.5 s into a fresh 2 s
    world.tick(1)
    assert not world.broker.durables.of_client(OWNER_PREFIX + "c")
    assert "c" not in world.registry.persistent and "c" not in world.registry.states
    assert world.notes()[-1] == ("c", None)
    assert ("mqtt_session_expired", {"client_id": "c"}) in world.log.events
    _, _, connack = world.client("c", clean=False, expiry=2)
    assert not connack.session_present


def test_never_and_3_1_1_persistent_sessions_stay() -> None:
    world = World()
    for client_id, kwargs in (("forever", {"expiry": NEVER}), ("old", {"level": 4})):
        session, conn, _ = world.client(client_id, clean=False, **kwargs)  # type: ignore[arg-type]
        send(session, conn, packets.Subscribe(1, [("t", 1)]))
        read(session, conn)
        drop(session)
    assert world.registry.lifetimes.next_due() is None and world.notes() == []
    world.tick(10 * 365 * 86400)
    assert set(world.registry.persistent) == {"forever", "old"}


def test_a_will_waits_out_its_delay() -> None:
    world = World()
    watcher, wconn, _ = world.client("watcher", level=4)
    send(watcher, wconn, packets.Subscribe(1, [("w", 0)]))
    read(watcher, wconn)
    will = packets.Will("w", b"gone", properties=packets.Properties(will_delay_interval=2))
    session, _, _ = world.client("c", expiry=60, will=will)
    drop(session)
    world.tick(1)
    assert read(watcher, wconn) == []
    world.tick(1)
    assert [p.payload for p in read(watcher, wconn)] == [b"gone"]
    world.tick(60)
    assert read(watcher, wconn) == []  # once


def test_a_reconnect_within_the_delay_calls_the_will_off() -> None:
    world = World()
    watcher, wconn, _ = world.client("watcher", level=4)
    send(watcher, wconn, packets.Subscribe(1, [("w", 0)]))
    read(watcher, wconn)
    will = packets.Will("w", b"gone", properties=packets.Properties(will_delay_interval=2))
    session, _, _ = world.client("c", expiry=60, will=will)
    drop(session)
    world.tick(1)
    world.client("c", clean=False, expiry=60)
    world.tick(5)
    assert read(watcher, wconn) == []


def test_a_clean_start_ends_the_session_and_so_publishes_its_pending_will() -> None:
    world = World()
    watcher, wconn, _ = world.client("watcher", level=4)
    send(watcher, wconn, packets.Subscribe(1, [("w", 0)]))
    read(watcher, wconn)
    will = packets.Will("w", b"gone", properties=packets.Properties(will_delay_interval=30))
    session, _, _ = world.client("c", expiry=60, will=will)
    drop(session)
    world.client("c", clean=True, expiry=60)
    assert [p.payload for p in read(watcher, wconn)] == [b"gone"]


def test_a_will_delay_beyond_the_session_fires_at_its_end() -> None:
    world = World()
    watcher, wconn, _ = world.client("watcher", level=4)
    send(watcher, wconn, packets.Subscribe(1, [("w", 0)]))
    read(watcher, wconn)
    will = packets.Will("w", b"gone", properties=packets.Properties(will_delay_interval=30))
    session, _, _ = world.client("c", expiry=2, will=will)
    drop(session)
    world.tick(1)
    assert read(watcher, wconn) == []
    world.tick(1)
    assert [p.payload for p in read(watcher, wconn)] == [b"gone"]
    session, _, _ = world.client("d", expiry=0, will=will)  # a session that ends with its connection
    drop(session)
    assert [p.payload for p in read(watcher, wconn)] == [b"gone"]


def test_a_connected_session_is_noted_with_its_interval_for_a_crash() -> None:
    world = World()
    world.client("c", expiry=30)
    assert world.notes() == [("c", b"in:30:")]


def test_at_start_up_the_overdue_end_and_the_rest_are_scheduled() -> None:
    world = World()
    notes = {
        "late": expiry_note(CLOSED, T0 - 1, ""),
        "later": expiry_note(CLOSED, T0 + 5000, ""),
        "crashed": expiry_note(OPEN, 10, ""),
    }
    world.registry.restore_lifetimes(world.broker, notes, world.log)
    assert set(world.registry.persistent) == {"later", "crashed"}
    assert ("late", None) in world.notes()
    assert ("crashed", b"at:%d:" % (T0 + 10_000)) in world.notes()  # restarts cannot put it off
    _, _, connack = world.client("later", clean=False, expiry=5)
    assert connack.session_present  # kept, though it held nothing else
    world.tick(10)
    assert set(world.registry.persistent) == {"later"}


def test_shared_memberships_count_resume_and_go_with_the_session() -> None:
    world = World()
    owner = OWNER_PREFIX + "c"
    session, conn, _ = world.client("c", expiry=60)
    send(session, conn, packets.Subscribe(1, [("$share/g/t", 1)]))
    read(session, conn)
    drop(session)
    assert [m.active for m in world.broker.shared.of_client(owner)] == [None]
    session, conn, connack = world.client("c", clean=False, expiry=60)
    assert connack.session_present
    assert [m.active is not None for m in world.broker.shared.of_client(owner)] == [True]  # resumed
    drop(session)
    _, _, connack = world.client("c", clean=True, expiry=60)
    assert not connack.session_present and world.broker.shared.of_client(owner) == []
    assert not world.broker.shared  # the group went with its last membership


def test_an_expired_session_takes_its_shared_membership() -> None:
    world = World()
    session, conn, _ = world.client("c", expiry=1)
    send(session, conn, packets.Subscribe(1, [("$share/g/t", 1)]))
    read(session, conn)
    drop(session)
    world.tick(1)
    assert world.broker.shared.of_client(OWNER_PREFIX + "c") == [] and not world.broker.shared


def test_a_disconnect_may_change_the_interval_to_never_or_to_zero() -> None:
    world = World()
    session, conn, _ = world.client("c", expiry=30)
    send(session, conn, packets.Disconnect(properties=packets.Properties(session_expiry_interval=NEVER)))
    assert world.notes()[-1] == ("c", None)  # a restart must not end it after all
    assert world.registry.lifetimes.next_due() is None and "c" in world.registry.persistent
    session, conn, connack = world.client("c", clean=False, expiry=30)
    assert connack.session_present
    send(session, conn, packets.Disconnect(properties=packets.Properties(session_expiry_interval=0)))
    assert world.notes()[-1] == ("c", None) and "c" not in world.registry.persistent
