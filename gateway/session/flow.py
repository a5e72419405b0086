"""Producer flow control: whether a session reads on.

Reading stops while the core holds this producer back (a queue it sent to is
over its high-water mark) or while the session holds an event back (a CONNECT
waiting for its password check, a persistent SEND during the disk alarm).
Frames already received stay in the codec meanwhile; the server parks its
reader until :meth:`InputGate.release`.  While the core holds a producer, a
protocol may go on reading up to its next event and handle it if it adds
nothing to a queue (STOMP: a DISCONNECT), so a client done sending can leave.
Sans-IO.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.clients import Client


class InputGate:
    __slots__ = ("blocked", "wake_reader")

    def __init__(self) -> None:
        self.blocked = False
        self.wake_reader: Callable[[], None] | None = None  # set by the server

    def release(self) -> None:
        """The core let go (Sink.unblocked), or the held event may go on: read again."""
        self.blocked = False
        if self.wake_reader is not None:
            self.wake_reader()


def report_slow_consumers(client: Client, now: float, log: Any) -> None:
    """At the held producer's ``held_until``: the core declares a queue that
    delivered nothing since its last look a slow consumer and stops holding
    the producer for it; each is logged once, here."""
    for queue in client.check_held(now):
        log.warning("slow_consumer", destination=queue.address.text,
                    consumer_client=getattr(queue.owner, "number", None), depth=queue.depth)
