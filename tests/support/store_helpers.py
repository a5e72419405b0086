"""What the store's unit tests (tests/unit/persistence/test_store_*.py) share:
a stored message, a store opened on a folder, a crash as SIGKILL would leave
it, the recovered state in comparable form, and a workload of everything."""

from __future__ import annotations

from pathlib import Path

from core.storage import Recovered, StoredMessage
from persistence.store import Store

SEGMENT = 4096


def message(mid: str, destination: str = "/queue/a", body: bytes = b"body", **headers: str) -> StoredMessage:
    return StoredMessage(mid, destination, {"h": mid, **headers}, body, 4, 0, 1_700_000_000_000, 0)


def opened(directory: Path, **kwargs) -> tuple[Store, Recovered]:
    kwargs.setdefault("segment_bytes", SEGMENT)
    kwargs.setdefault("sync", "never")
    s = Store(directory, **kwargs)
    return s, s.open()


def crash(s: Store) -> None:
    """Write what is pending, then stop as SIGKILL would: no close()."""
    s.flush()
    s.abandon()


def subscriptions(r: Recovered) -> dict[str, str]:
    return {s.key: s.pattern for s in r.subscriptions}


def state(r: Recovered) -> tuple:
    return (
        subscriptions(r),
        {k: [(m.id, m.destination, m.priority, m.timestamp) for m in q] for k, q in sorted(r.queues.items())},
        r.kv,
    )


def reopen(directory: Path, s: Store | None = None, **kwargs) -> tuple[Store, Recovered]:
    if s is not None:
        crash(s)
    return opened(directory, **kwargs)


def workload(s: Store) -> None:
    """A bit of everything, over several segments."""
    s.add_subscription("durable:c:s", "/topic/t")
    for i in range(60):
        s.add_message(message(f"q{i}", body=b"x" * 40), ["/queue/a"])
        s.add_message(message(f"t{i}", "/topic/t"), ["durable:c:s", "/queue/copy"])
        if i % 3 == 0:
            s.ack("/queue/a", f"q{i}")
        if i % 4 == 0:
            s.ack("/queue/copy", f"t{i}")
    s.transaction([(message("tx1"), ["/queue/a"]), (message("tx2"), ["/queue/b"])], [("/queue/a", "q1"), ("durable:c:s", "t1")])
    s.put("retained", "a/b", b"value")
    s.put("retained", "gone", b"x")
    s.delete("retained", "gone")
