"""The core's dispatch cost: messages per second through a queue with plain
consumers, with a selector, with mixed priorities, with message groups, and
with an authorization map in force.

    .venv/bin/python benchmarks/dispatch.py [--messages N]

No sockets and no store: this isolates what a policy costs per message in the
core (sessions and the network add the same amount whichever policy runs).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core import names  # noqa: E402
from core.authorization import Authorizer, Principal, parse_entries  # noqa: E402
from core.broker import Broker, BrokerSettings  # noqa: E402
from core.selectors import compile_selector  # noqa: E402
from core.subscriptions import AckMode  # noqa: E402

QUEUE = names.parse("/queue/bench.dispatch")
assert not isinstance(QUEUE, str)
# An authorization map of a realistic size, the entry that grants last.
ACL = [{"destination": f"/queue/team{i}.>", "read": [f"team{i}"], "write": [f"team{i}"]} for i in range(20)] + [
    {"destination": "/queue/bench.>", "read": ["consumers"], "write": ["producers"], "admin": ["producers", "consumers"]}
]


class Clock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000


class CountingSink:
    accepting = True

    def __init__(self) -> None:
        self.count = 0

    def deliver(self, subscription: Any, message: Any) -> None:
        self.count += 1

    def unblocked(self) -> None:
        pass


def run(name: str, n: int, *, selector: str | None = None, priorities: bool = False, groups: bool = False,
        backlog: bool = False, acl: bool = False) -> tuple[str, float]:
    authorizer = Authorizer(parse_entries(ACL)) if acl else None
    broker = Broker(Clock(), BrokerSettings(queue_high_water=0), node="bench", authorizer=authorizer)
    sinks = [CountingSink() for _ in range(4)]
    producer = broker.open_client(CountingSink(), principal=Principal("app", frozenset({"producers"})))
    compiled = compile_selector(selector) if selector else None

    def subscribe() -> None:
        for i, sink in enumerate(sinks):
            client = broker.open_client(sink, principal=Principal("worker", frozenset({"consumers"})))
            # One consumer filters when a selector is asked for; the others take the rest.
            client.subscribe("s", QUEUE, AckMode.AUTO, selector=compiled if i == 0 else None)

    if not backlog:
        subscribe()
    headers = [{"region": "eu" if i % 3 else "us", "x-price": str(i % 200)} for i in range(64)]
    start = time.perf_counter()
    for i in range(n):
        h = dict(headers[i % 64])
        if groups:
            h["JMSXGroupID"] = f"g{i % 32}"
        message = broker.message(QUEUE, h, b"x" * 128, priority=(i % 10) if priorities else 4)
        producer.send(message)
    if backlog:
        subscribe()  # drain a standing backlog through the priority lanes
    elapsed = time.perf_counter() - start
    delivered = sum(s.count for s in sinks)
    assert delivered == n, (name, delivered, n)
    return name, n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    args = parser.parse_args()
    n = args.messages
    print(f"gateway core dispatch: CPython {sys.version.split()[0]}, {os.cpu_count()} CPUs, {n:,} messages, "
          "4 consumers, auto ack")
    results = [
        run("plain round robin", n),
        run("one consumer with a selector", n, selector="region = 'eu' AND \"x-price\" > 100"),
        run("mixed priorities 0-9, live", n, priorities=True),
        run("mixed priorities 0-9, backlog drained", n, priorities=True, backlog=True),
        run("message groups (32)", n, groups=True),
        run("authorization map (21 entries)", n, acl=True),
    ]
    base = results[0][1]
    for name, rate in results:
        print(f"  {name:40s} {rate:12,.0f} msgs/s  ({rate / base:5.0%} of plain)")
    print(f"  peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
