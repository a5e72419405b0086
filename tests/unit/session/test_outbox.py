"""The outbox: FIFO drain in bounded batches, wakeups, and LSN durability gates."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.session.outbox import DRAIN_BYTES, Outbox


class Wakeups:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def test_drain_returns_everything_in_order() -> None:
    box = Outbox(high_water=1000)
    for part in (b"a", b"bc", b"def"):
        box.append(part)
    assert box.nbytes == 6 and box
    assert box.drain(durable_lsn=0) == b"abcdef"
    assert box.nbytes == 0 and not box
    assert box.sent_bytes == 6
    assert box.drain(durable_lsn=0) == b""


def test_extend_queues_the_pieces_of_one_frame() -> None:
    box = Outbox(high_water=1000)
    box.append(b"1")
    box.extend((b"2", b"34"), 3)
    box.append(b"5")
    assert box.nbytes == 5
    assert box.drain(0) == b"12345"


def test_drain_batches_by_max_bytes_and_always_takes_one_chunk() -> None:
    box = Outbox(high_water=1000)
    for part in (b"aaaa", b"bbbb", b"cccc", b"dddddddddd", b"e"):
        box.append(part)
    # Stops at the first chunk that reaches max_bytes.
    assert box.drain(0, max_bytes=8) == b"aaaabbbb"
    assert box.drain(0, max_bytes=5) == b"ccccdddddddddd"
    assert box.nbytes == 1
    # A chunk larger than max_bytes still goes, alone.
    box.append(b"f" * 50)
    assert box.drain(0, max_bytes=1) == b"e"
    assert box.drain(0, max_bytes=1) == b"f" * 50
    assert box.sent_bytes == 4 * 3 + 10 + 1 + 50


def test_default_batch_is_drain_bytes() -> None:
    box = Outbox(high_water=10 * DRAIN_BYTES)
    chunk = b"x" * 1024
    for _ in range(2 * DRAIN_BYTES // len(chunk)):
        box.append(chunk)
    assert len(box.drain(0)) == DRAIN_BYTES
    assert len(box.drain(0)) == DRAIN_BYTES
    assert not box


def test_full_at_high_water() -> None:
    box = Outbox(high_water=10)
    box.append(b"x" * 9)
    assert not box.full
    box.append(b"x")
    assert box.full
    box.drain(0, max_bytes=1)
    assert not box.full


def test_wakeup_only_on_empty_to_non_empty() -> None:
    wake = Wakeups()
    box = Outbox(high_water=1000, wakeup=wake)
    box.append(b"a")
    assert wake.count == 1
    box.append(b"b")
    box.extend((b"c", b"d"), 2)
    assert wake.count == 1
    box.drain(0, max_bytes=1)  # partly drained: still non-empty
    box.append(b"e")
    assert wake.count == 1
    box.drain(0)
    box.extend((b"f",), 1)
    assert wake.count == 2
    box.drain(0)
    box.append(b"g", lsn=5)
    assert wake.count == 3
    # Held behind a gate, the outbox is still non-empty: no further wakeups.
    assert box.drain(durable_lsn=4) == b""
    box.append(b"h")
    assert wake.count == 3


def test_lsn_gate_holds_its_entry_and_everything_after() -> None:
    box = Outbox(high_water=1000)
    box.append(b"a")
    box.append(b"R1", lsn=10)
    box.append(b"b")
    box.append(b"R2", lsn=20)
    box.append(b"c")
    assert box.drain(durable_lsn=9) == b"a"
    assert box.drain(durable_lsn=9) == b""
    assert box.nbytes == 6
    assert box.drain(durable_lsn=10) == b"R1b"
    assert box.drain(durable_lsn=19) == b""
    assert box.drain(durable_lsn=25) == b"R2c"
    assert not box


def test_a_later_durable_lsn_releases_several_gates_at_once() -> None:
    box = Outbox(high_water=1000)
    box.append(b"1", lsn=3)
    box.append(b"2", lsn=1)  # a smaller LSN still waits behind the first gate
    box.append(b"3", lsn=2)
    assert box.drain(durable_lsn=2) == b""
    assert box.drain(durable_lsn=3) == b"123"


def test_gate_and_max_bytes_together() -> None:
    box = Outbox(high_water=1000)
    for part in (b"aa", b"bb", b"cc"):
        box.append(part)
    box.append(b"R", lsn=7)
    assert box.drain(durable_lsn=0, max_bytes=3) == b"aabb"
    assert box.drain(durable_lsn=0, max_bytes=3) == b"cc"
    assert box.drain(durable_lsn=0, max_bytes=3) == b""
    assert box.drain(durable_lsn=7, max_bytes=3) == b"R"


def test_waiting_on_names_the_lsn_only_when_the_head_is_gated() -> None:
    box = Outbox(high_water=1000)
    assert box.waiting_on() is None
    box.append(b"a")
    box.append(b"R", lsn=4)
    assert box.waiting_on() is None  # "a" can go now
    box.drain(durable_lsn=0)
    assert box.waiting_on() == 4
    box.append(b"S", lsn=9)
    assert box.waiting_on() == 4
    assert box.drain(durable_lsn=4) == b"R"
    assert box.waiting_on() == 9
    assert box.drain(durable_lsn=9) == b"S"
    assert box.waiting_on() is None


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.binary(min_size=1, max_size=5), st.integers(0, 6)),
            st.tuples(st.just("drain"), st.integers(1, 12), st.integers(0, 6)),
        ),
        max_size=40,
    )
)
def test_model_order_is_kept_and_nothing_passes_an_undurable_gate(ops: list[tuple[str, object, int]]) -> None:
    box = Outbox(high_water=1 << 20)
    model: list[tuple[bytes, int]] = []  # (chunk, lsn) in order
    out = b""
    durable = 0
    for op, arg, lsn in ops:
        if op == "append":
            assert isinstance(arg, bytes)
            box.append(arg, lsn=lsn)
            model.append((arg, lsn))
        else:
            assert isinstance(arg, int)
            durable = max(durable, lsn)  # durable_lsn never goes back
            data = box.drain(durable, max_bytes=arg)
            # Releasable: the longest prefix with no gate above durable_lsn.
            releasable = 0
            while releasable < len(model) and model[releasable][1] <= durable:
                releasable += 1
            taken, size = 0, 0
            while taken < releasable and size < arg:
                size += len(model[taken][0])
                taken += 1
            assert data == b"".join(chunk for chunk, _ in model[:taken])
            del model[:taken]
            out += data
            # After a drain the head waits on its own LSN exactly when it is not durable.
            assert box.waiting_on() == (model[0][1] if model and model[0][1] > durable else None)
        assert box.nbytes == sum(len(chunk) for chunk, _ in model)
    assert box.sent_bytes == len(out)
