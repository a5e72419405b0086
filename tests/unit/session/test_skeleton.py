"""The skeleton on its own, with a toy protocol: words separated by ';' are
its events, and its dialect records what the skeleton asks of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from core.broker import Broker
from gateway.session.skeleton import PASS_BUDGET_S, Dialect, Skeleton, State
from tests.support.core_fakes import FakeClock, RecordingSink


class Words:
    """A codec: ``hello;world;`` -> "hello", "world"; digits are an int (an
    event no state handles); "boom" is a protocol error."""

    def __init__(self) -> None:
        self.buffer = b""

    @property
    def buffered_bytes(self) -> int:
        return len(self.buffer)

    def receive_data(self, data: bytes) -> None:
        self.buffer += data

    def events(self) -> Iterator[str | int]:
        while b";" in self.buffer:
            word, _, self.buffer = self.buffer.partition(b";")
            if word == b"boom":
                raise ValueError("boom")
            yield int(word) if word.isdigit() else Leave("leave") if word == b"leave" else word.decode()


class Leave(str):
    """The toy's DISCONNECT: an event that adds nothing to a queue."""


class Toy:
    def __init__(self, clock: FakeClock, broker: Broker, while_held: frozenset[type] = frozenset(),
                 timer: Callable[[], float] | None = None) -> None:
        self.seen: list[str] = []
        self.said: list[str] = []
        self.room = True
        self.broker = broker
        self.skeleton = Skeleton(Words(), clock, None, Dialect(
            handlers={
                State.AWAITING_CONNECT: {str: self.login},
                State.CONNECTED: {str: self.word, Leave: self.word},
                State.CLOSED: {},
            },
            reject=lambda event: self.said.append(f"reject {event}"),
            errors=(ValueError,),
            on_error=lambda exc, event: self.said.append(f"error {exc} after {event}"),
            fail=lambda reason: self.said.append(f"fail {reason}"),
            on_eof=lambda: self.said.append("eof"),
            silence="idle",
            room=lambda: self.room,
            while_held=while_held,
        ), outbox_high_water_bytes=100, connect_timeout_s=5.0, heartbeat=b".",
           **({} if timer is None else {"timer": timer}))

    def login(self, word: str) -> None:
        self.seen.append(f"login {word}")
        self.skeleton.connected(self.broker.open_client(RecordingSink()))

    def word(self, word: str) -> None:
        self.seen.append(word)
        if word == "wait":
            self.skeleton.defer("waited")
        elif word in ("bye", "leave"):
            self.skeleton.close(word)


def toy() -> tuple[FakeClock, Toy]:
    clock = FakeClock()
    return clock, Toy(clock, Broker(clock))


def test_events_go_to_the_current_states_handler() -> None:
    _, t = toy()
    t.skeleton.receive_data(b"me;a;b;")
    assert t.seen == ["login me", "a", "b"] and t.skeleton.state is State.CONNECTED


def test_the_loop_stops_at_close_and_later_input_is_ignored() -> None:
    _, t = toy()
    t.skeleton.receive_data(b"me;bye;after;")
    t.skeleton.receive_data(b"more;")
    assert t.seen == ["login me", "bye"] and t.skeleton.closed and t.skeleton.close_reason == "bye"
    assert t.skeleton.close("again") is False and t.skeleton.close_reason == "bye"


def test_a_deferred_event_stops_reading_and_goes_first_on_release() -> None:
    _, t = toy()
    t.skeleton.receive_data(b"me;wait;x;")
    assert t.seen == ["login me", "wait"] and not t.skeleton.wants_input
    t.skeleton.resume_input()  # still held: nothing happens
    assert t.seen == ["login me", "wait"]
    t.skeleton.gate.release()
    t.skeleton.resume_input()
    assert t.seen == ["login me", "wait", "waited", "x"]


def test_errors_and_eof_go_to_the_dialect() -> None:
    _, t = toy()
    t.skeleton.receive_data(b"me;boom;")
    t.skeleton.receive_data(b"")
    assert t.said == ["error boom after me", "eof"]


def test_an_event_the_state_has_no_handler_for_is_rejected() -> None:
    _, t = toy()
    t.skeleton.receive_data(b"me;7;x;")
    assert t.said == ["reject 7"] and t.seen == ["login me"]


def test_deadlines_login_then_silence_and_beat() -> None:
    clock, t = toy()
    assert t.skeleton.next_deadline() == clock.now + 5.0
    t.skeleton.receive_data(b"me;")
    assert t.skeleton.next_deadline() is None
    t.skeleton.silence.limit_s, t.skeleton.beat.interval_s = 3.0, 1.0
    assert t.skeleton.next_deadline() == clock.now + 1.0
    clock.advance(1.0)
    t.skeleton.on_deadline(clock.now)
    assert t.skeleton.outbox.drain(0) == b"."
    clock.advance(2.0)
    t.skeleton.on_deadline(clock.now)
    assert t.said == ["fail idle timeout: nothing received from the client in time"]


def test_deliveries_resume_only_with_room_in_the_outbox_and_the_protocols_window() -> None:
    _, t = toy()
    t.skeleton.receive_data(b"me;")
    t.skeleton.paused = True
    t.room = False
    t.skeleton.on_drained()
    assert t.skeleton.paused
    t.room = True
    t.skeleton.on_drained()
    assert not t.skeleton.paused


def test_while_the_core_holds_the_producer_only_the_next_event_is_read_and_a_leave_is_handled() -> None:
    clock = FakeClock()
    t = Toy(clock, Broker(clock), while_held=frozenset({Leave}))
    t.skeleton.receive_data(b"me;")
    t.skeleton.gate.blocked = True  # as Skeleton.process sets it when the core holds the producer
    assert t.skeleton.wants_input  # nothing held back yet: read on, to find a leave
    t.skeleton.receive_data(b"a;leave;")
    assert t.seen == ["login me"] and t.skeleton.deferred == "a"  # "a" waits, in order, and so what follows it
    assert not t.skeleton.wants_input
    t.skeleton.gate.release()
    t.skeleton.resume_input()
    assert t.seen == ["login me", "a", "leave"] and t.skeleton.state is State.CLOSED

    t = Toy(clock, Broker(clock), while_held=frozenset({Leave}))
    t.skeleton.receive_data(b"me;")
    t.skeleton.gate.blocked = True
    t.skeleton.receive_data(b"leave;")  # next while held: handled at once
    assert t.seen == ["login me", "leave"] and t.skeleton.state is State.CLOSED


def test_a_protocol_that_handles_nothing_while_held_stops_reading() -> None:
    _, t = toy()
    t.skeleton.receive_data(b"me;")
    t.skeleton.gate.blocked = True
    assert not t.skeleton.wants_input


class Stopwatch:
    """The pass timer: each handled event costs ``cost`` seconds of it."""

    def __init__(self, cost: float) -> None:
        self.now = 0.0
        self.cost = cost

    def __call__(self) -> float:
        return self.now


def timed_toy(cost: float, while_held: frozenset[type] = frozenset()) -> tuple[Stopwatch, Toy]:
    watch = Stopwatch(cost)
    t = Toy(FakeClock(), Broker(FakeClock()), while_held, timer=watch)
    handle = t.word

    def costly(word: str) -> None:
        watch.now += watch.cost
        handle(word)

    t.word = costly  # type: ignore[method-assign]
    t.skeleton.dialect.handlers[State.CONNECTED][str] = costly  # type: ignore[index]
    return watch, t


def test_a_pass_stops_at_its_time_budget_and_the_rest_waits_buffered_in_order() -> None:
    _, t = timed_toy(PASS_BUDGET_S / 2)
    t.skeleton.receive_data(b"me;a;b;c;d;e;")
    assert t.seen == ["login me", "a", "b"] and t.skeleton.backlogged and t.skeleton.wants_input
    t.skeleton.resume_input()
    assert t.seen == ["login me", "a", "b", "c", "d"] and t.skeleton.backlogged
    t.skeleton.resume_input()
    assert t.seen == ["login me", "a", "b", "c", "d", "e"] and not t.skeleton.backlogged
    assert t.skeleton.codec.buffered_bytes == 0


def test_an_event_costlier_than_the_budget_is_still_handled_one_per_pass() -> None:
    _, t = timed_toy(PASS_BUDGET_S * 10)
    t.skeleton.receive_data(b"me;a;b;")
    assert t.seen == ["login me", "a"] and t.skeleton.backlogged
    t.skeleton.resume_input()
    assert t.seen == ["login me", "a", "b"] and not t.skeleton.backlogged


def test_cheap_input_is_handled_in_one_pass() -> None:
    _, t = timed_toy(0.0)
    t.skeleton.receive_data(b"me;" + b"w;" * 1000)
    assert len(t.seen) == 1001 and not t.skeleton.backlogged


def test_a_backlog_held_back_by_the_core_waits_for_release_without_spinning() -> None:
    _, t = timed_toy(PASS_BUDGET_S, while_held=frozenset({Leave}))
    t.skeleton.receive_data(b"me;a;b;c;")
    assert t.seen == ["login me", "a"] and t.skeleton.backlogged
    t.skeleton.gate.blocked = True  # the core held this producer back meanwhile
    t.skeleton.resume_input()  # b is not handled while held: deferred, and the backlog is over
    assert t.seen == ["login me", "a"] and not t.skeleton.backlogged and not t.skeleton.wants_input
    t.skeleton.gate.release()
    t.skeleton.resume_input()
    assert t.seen == ["login me", "a", "b"] and t.skeleton.backlogged
    t.skeleton.resume_input()
    assert t.seen == ["login me", "a", "b", "c"] and not t.skeleton.backlogged


def test_a_closed_session_has_no_backlog() -> None:
    _, t = timed_toy(PASS_BUDGET_S)
    t.skeleton.receive_data(b"me;a;bye;c;")
    assert t.skeleton.backlogged
    t.skeleton.close("gone")
    assert not t.skeleton.backlogged
