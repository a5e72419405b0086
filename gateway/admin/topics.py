"""Topics as the console shows them: every topic (or pattern) someone
subscribes to, with each subscriber (non-durable, durable, shared group),
its pending and delivered-but-unacked messages, and the topic's archive.

A topic has no queue of its own: its messages are copied into each
subscriber's queue as they are published.  A non-durable subscriber's queue
belongs to its connection, so it is found through the server's
connections; durable subscriptions and shared groups are the broker's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from core.shared import SharedGroup
from persistence.archive import list_topics


def queue_name(queue: Any) -> str:
    """What the API lists a queue by: a shared group's key (``shared:...``),
    a durable subscription's key (``durable:...``), or a queue's name."""
    if isinstance(queue.owner, SharedGroup):
        return str(queue.owner.key)
    if queue.key is not None and queue.key.startswith("durable:"):
        return str(queue.key)
    return str(queue.address.text)


def unacked(queue: Any) -> int:
    """Messages delivered from ``queue`` that its consumers have not acked yet."""
    return sum(len(getattr(consumer, "unacked", ())) for consumer in queue.consumers)


def subscriptions(broker: Any, server: Any) -> Iterator[tuple[str, Any, Any]]:
    """(topic pattern, its queue, the subscription) of every connected
    non-durable, unshared topic subscriber."""
    for _, queue, subscription in _private(server):
        yield subscription.address.text, queue, subscription


def _private(server: Any) -> Iterator[tuple[str, Any, Any]]:
    for conn_id, connection in list(server.connections.items()):
        client = getattr(connection.session, "client", None)
        if client is None:
            continue
        for subscription in list(client.subscriptions.values()):
            if subscription.private and subscription.durable is None and subscription.shared is None:
                yield conn_id, subscription.queue, subscription


def view(broker: Any, server: Any, archive: Any) -> list[dict[str, Any]]:
    """Every topic with subscribers or an archive, sorted by name."""
    found: dict[str, dict[str, Any]] = {}

    def topic(pattern: str) -> dict[str, Any]:
        entry = found.get(pattern)
        if entry is None:
            entry = found[pattern] = {"topic": pattern, "subscribers": [], "pending": 0, "unacked": 0,
                                      "enqueued": 0, "archive": None}
        return entry

    def add(pattern: str, subscriber: dict[str, Any]) -> None:
        entry = topic(pattern)
        entry["subscribers"].append(subscriber)
        for field in ("pending", "unacked", "enqueued"):
            entry[field] += subscriber[field]

    for conn_id, queue, subscription in _private(server):
        add(subscription.address.text, {
            "kind": "non-durable", "name": _token(subscription.token), "connection": conn_id,
            "client_id": getattr(subscription.owner, "client_id", None), "active": True,
            **_counts(queue, len(subscription.unacked)),
        })
    for durable in broker.durables.values():
        add(durable.pattern.text, {
            "kind": "durable", "name": durable.key, "connection": None, "client_id": durable.client_id,
            "active": durable.active is not None, **_counts(durable.queue, unacked(durable.queue)),
        })
    for group in broker.shared.values():
        add(group.pattern.text, {
            "kind": "shared", "name": group.key, "connection": None, "client_id": None,
            "active": bool(group.queue.consumers), "members": len(group.queue.consumers),
            **_counts(group.queue, unacked(group.queue)),
        })
    if archive is not None:
        for info in list_topics(archive):
            topic("/topic/" + info.topic)["archive"] = {"earliest": info.earliest, "latest": info.latest,
                                                        "bytes": info.bytes}
    return [found[name] for name in sorted(found)]


def _token(token: Any) -> str:
    """A subscription's name as its client knows it: a STOMP subscription's
    id (the session keeps it in a state object), an MQTT topic filter."""
    for field in ("id", "filter"):
        if hasattr(token, field):
            return str(getattr(token, field))
    return str(token)


def _counts(queue: Any, held: int) -> dict[str, int]:
    stats = queue.stats
    return {"pending": queue.depth, "unacked": held, "enqueued": stats.enqueued, "delivered": stats.delivered,
            "discarded": stats.discarded}
