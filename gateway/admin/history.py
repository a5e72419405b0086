"""The console's charts: a small in-process history of the broker, sampled
every few seconds by one task (gateway/tasks.py; the core is only read,
never awaited), kept in bounded rings and served by ``GET /api/v1/history``.

Each sample holds the message rates in and out (per second over the last
interval), the messages queued and delivered-but-unacked, connections,
resident memory, the store's bytes and the data folder's free space; each
destination (queue, durable or shared subscription, and each topic with
its subscribers together) has its own shorter ring of depth and rates for
the console's sparklines.  Rates come from each queue's counters compared
with the same queue's at the last sample, so a subscriber that leaves does
not make a rate negative.
"""

from __future__ import annotations

import collections
import shutil
from typing import Any

from gateway.admin import topics
from gateway.admin.metrics import rss_bytes

INTERVAL_S = 5.0
# 15 minutes at the default interval: what the overview charts.
KEEP_SAMPLES = 180
# 5 minutes at the default interval: a sparkline per destination.
KEEP_DESTINATION_SAMPLES = 60
# Destinations followed at once (the first by name): the rings' bound.
MAX_DESTINATIONS = 500


class History:
    """``sample()`` takes one sample; ``view()`` is what the API answers."""

    def __init__(self, broker: Any, server: Any, store: Any, data_dir: str, interval_s: float = INTERVAL_S) -> None:
        self.broker = broker
        self.server = server
        self.store = store
        self.data_dir = data_dir
        self.interval_s = interval_s
        self.samples: collections.deque[dict[str, Any]] = collections.deque(maxlen=KEEP_SAMPLES)
        self.destinations: dict[str, collections.deque[list[Any]]] = {}
        self.last_ms = 0
        self.published = 0
        # Each queue's (enqueued, delivered, dequeued) at the last sample, by the queue itself.
        self.counters: dict[Any, tuple[int, int, int]] = {}

    def measure(self) -> dict[str, Any]:
        """The broker as it is now (what the overview's figures show)."""
        broker = self.broker
        queues = broker.all_queues()
        held = sum(len(subscription.unacked) for _, _, subscription in topics.subscriptions(broker, self.server))
        try:
            disk_free = shutil.disk_usage(self.data_dir).free
        except OSError:
            disk_free = -1
        return {
            "queued": sum(queue.depth for queue in queues),
            "unacked": held + sum(topics.unacked(queue) for queue in queues),
            "connections": len(self.server.connections), "memory": rss_bytes(),
            "store_bytes": self.store.stats()["bytes"], "disk_free": disk_free,
        }

    def sample(self, now_ms: int) -> None:
        seconds = (now_ms - self.last_ms) / 1000 if self.last_ms else 0.0
        counters: dict[Any, tuple[int, int, int]] = {}
        by_name: dict[str, list[int]] = {}  # name -> [depth, in, out]
        for name, queue in followed(self.broker, self.server):
            stats = queue.stats
            now = counters.get(queue)
            if now is None:
                now = counters[queue] = (stats.enqueued, stats.delivered, stats.dequeued)
            before = self.counters.get(queue, (0, 0, 0))
            entry = by_name.setdefault(name, [0, 0, 0])
            entry[0] += queue.depth
            entry[1] += max(0, now[0] - before[0])
            entry[2] += max(0, now[2] - before[2])
        delivered = sum(max(0, now[1] - self.counters.get(queue, (0, 0, 0))[1]) for queue, now in counters.items())
        published = self.broker.stats.messages_in

        def rate(count: int) -> float:
            return round(count / seconds, 2) if seconds > 0 else 0.0

        self.samples.append({"t": now_ms, "in": rate(max(0, published - self.published)), "out": rate(delivered),
                             **self.measure()})
        for name in sorted(by_name)[:MAX_DESTINATIONS]:
            depth, entered, left = by_name[name]
            ring = self.destinations.get(name)
            if ring is None:
                ring = self.destinations[name] = collections.deque(maxlen=KEEP_DESTINATION_SAMPLES)
            ring.append([now_ms, depth, rate(entered), rate(left)])
        for gone in [name for name in self.destinations if name not in by_name]:
            del self.destinations[gone]
        self.counters = counters
        self.published = published
        self.last_ms = now_ms

    def view(self) -> dict[str, Any]:
        return {
            "interval_s": self.interval_s,
            "samples": list(self.samples),
            "destinations": {name: list(ring) for name, ring in self.destinations.items()},
        }


def followed(broker: Any, server: Any) -> list[tuple[str, Any]]:
    """(name, queue) for every queue the console charts: each queue, durable
    and shared subscription under the name the API lists it by, and every
    topic subscriber's queue under its topic's name (summed there)."""
    pairs = [(topics.queue_name(queue), queue) for queue in broker.all_queues()]
    pairs += [(pattern, queue) for pattern, queue, _ in topics.subscriptions(broker, server)]
    pairs += [(durable.pattern.text, durable.queue) for durable in broker.durables.values()]
    return pairs

