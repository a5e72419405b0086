"""No Local: a subscription that never gets what its own client published
(MQTT 5's No Local subscription option, JMS's noLocal).

A message carries its publisher's :class:`Origin` (``Message.origin``, set by
``Client.send``: one object per client, none per message).  A No Local
subscription's queue gets a :class:`NoLocal` filter as its selector, so the
topic's fan-out leaves such messages out of that queue (nothing to ack, no
cost to subscriptions without it: the fan-out looks at a queue's selector
only when it has one).
"""

from __future__ import annotations

from typing import Any


class Origin:
    """Who published a message: a client, by its client id.  A small object
    of its own, not the client, so a message kept long (a retained value,
    a durable subscriber's backlog) does not keep its publisher's
    connection alive."""

    __slots__ = ("client_id",)

    def __init__(self, client_id: str | None) -> None:
        self.client_id = client_id

    def __repr__(self) -> str:
        return f"Origin({self.client_id!r})"


class NoLocal:
    """A queue's selector that refuses messages from ``origin`` or, when it
    has a client id, from any client with that id: [MQTT-3.8.3-3] compares
    ClientIDs, so a session's later connection (a durable subscription
    resumed) counts as the same client.  Then ``inner``, the subscription's
    own selector (None: every message), decides."""

    __slots__ = ("origin", "inner", "text")

    def __init__(self, origin: Origin, inner: Any = None) -> None:
        self.origin = origin
        self.inner = inner
        # What a durable subscription compares and stores: its own
        # selector's text (No Local is not part of what is stored).
        self.text: str | None = inner.text if inner is not None else None

    def matches(self, message: Any) -> bool:
        origin = message.origin
        if origin is not None and (
            origin is self.origin or (origin.client_id is not None and origin.client_id == self.origin.client_id)
        ):
            return False
        return self.inner is None or self.inner.matches(message)


def with_no_local(selector: Any, origin: Origin | None) -> Any:
    """``selector`` (None, a selector, or a :class:`NoLocal` from an earlier
    subscription) refusing ``origin``'s messages too, or no longer (None)."""
    inner = selector.inner if isinstance(selector, NoLocal) else selector
    return inner if origin is None else NoLocal(origin, inner)
