"""The end of a pass writes the connection whose input it handled first: a
producer waiting on its receipt is answered before the deliveries its
message made to other connections go out."""

from __future__ import annotations

from typing import Any

from gateway.transports.connection import Pass


class Written:
    """Stands in for a Connection at the end of a pass: records the order."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    def write_now(self) -> bool:
        self.log.append(self.name)
        return False


def run_pass(order: list[str], first: str | None) -> list[str]:
    log: list[str] = []
    writes = Pass()
    conns: dict[str, Any] = {name: Written(name, log) for name in order}
    writes.first = conns.get(first) if first else None
    with writes:
        for name in order:
            writes.dirty.append(conns[name])
    assert writes.first is None and writes.dirty == []
    return log


def test_the_reading_connection_is_written_before_the_ones_it_delivered_to() -> None:
    assert run_pass(["consumer-1", "consumer-2", "producer"], first="producer") == ["producer", "consumer-1", "consumer-2"]


def test_otherwise_the_order_output_appeared_in() -> None:
    assert run_pass(["a", "b", "c"], first=None) == ["a", "b", "c"]
    assert run_pass(["a", "b"], first="a") == ["a", "b"]
    # The reader had nothing to write (no receipt asked): the others as they came.
    log: list[str] = []
    writes = Pass()
    writes.first = Written("reader", log)  # type: ignore[assignment]
    with writes:
        writes.dirty += [Written("x", log), Written("y", log)]  # type: ignore[list-item]
    assert log == ["x", "y"]


def test_a_pass_with_nothing_to_write_forgets_its_reader() -> None:
    writes = Pass()
    writes.first = Written("reader", [])  # type: ignore[assignment]
    with writes:
        pass
    assert writes.first is None
