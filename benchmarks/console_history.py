"""What one sample of the console's history costs (gateway/admin/history.py),
in process, on a core broker with an in-memory store.

    .venv/bin/python benchmarks/console_history.py [--queues 100,1000,5000] [--samples 31]

Each queue holds 3 messages and has a client-ack consumer holding 1 more
(prefetch 1), so depth, unacked and the counters are all non-zero.  Reports
the median time of ``History.sample`` per queue count: the pause the
sampling task puts on the event loop once per ``history_interval_s``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from types import SimpleNamespace
from typing import Any

from core.broker import Broker, BrokerSettings
from core.clients import Client
from core.names import Address, parse
from core.subscriptions import AckMode
from gateway.admin.history import History


class _Sink:
    """Takes every delivery (a consumer that keeps up)."""

    accepting = True

    def deliver(self, subscription: Any, message: Any) -> None:
        pass

    def unblocked(self) -> None:
        pass


class _Store:
    """Nothing persistent is sent: the store is asked only for its size."""

    durable_lsn = 0

    def stats(self) -> dict[str, Any]:
        return {"bytes": 0}


class _Clock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall_ms(self) -> int:
        return int(time.time() * 1000)


def _queue(i: int) -> Address:
    address = parse(f"/queue/bench.{i}")
    assert not isinstance(address, str)
    return address


def median_sample_ms(queues: int, samples: int) -> float:
    broker = Broker(_Clock(), BrokerSettings(), node="bench", store=_Store())  # type: ignore[arg-type]
    producer: Client = broker.open_client(_Sink())  # type: ignore[arg-type]
    for i in range(queues):
        for _ in range(3):
            producer.send(broker.message(_queue(i), {}, b"x"))
        broker.open_client(_Sink()).subscribe("s", _queue(i), AckMode.CLIENT_INDIVIDUAL, prefetch=1)  # type: ignore[arg-type]
    history = History(broker, SimpleNamespace(connections={}), broker.store, tempfile.gettempdir())
    times = []
    for k in range(samples):
        started = time.perf_counter()
        history.sample(1000 * (k + 1))
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", default="100,1000,5000", help="queue counts, comma-separated")
    parser.add_argument("--samples", type=int, default=31)
    args = parser.parse_args()
    for queues in (int(n) for n in args.queues.split(",")):
        print(f"{queues:>6} queues: median sample {median_sample_ms(queues, args.samples):.2f} ms")


if __name__ == "__main__":
    main()
