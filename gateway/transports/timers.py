"""Every connection's deadlines in one heap, fired by one task: the server
holds one, each connection (gateway.transports.connection) arms it."""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Protocol

import trio


class Connection(Protocol):
    """What the timers need of a connection."""

    @property
    def ended(self) -> bool: ...

    def deadline_passed(self, deadline: float, now: float) -> None: ...

    def failed(self) -> None: ...


class Timers:
    """Every connection's next deadline (login, heart-beat, keepalive) in one
    heap, fired by one task (:meth:`run`), so a connection needs no timer
    task of its own.  A connection's deadline only ever moves earlier here;
    at an entry's time the connection looks again and re-arms for later."""

    __slots__ = ("_heap", "_order", "_scope", "_ended")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Connection]] = []
        self._order = itertools.count()  # equal deadlines never compare connections
        self._scope: trio.CancelScope | None = None
        self._ended = 0  # connections gone since the heap was last swept

    def arm(self, connection: Connection, deadline: float) -> None:
        heapq.heappush(self._heap, (deadline, next(self._order), connection))
        scope = self._scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline

    def forget(self) -> None:
        """A connection ended: once the ended outnumber half the heap, drop
        their entries (a closed connection's session is not kept alive
        until its old keepalive deadline)."""
        self._ended += 1
        if self._ended * 2 > len(self._heap):
            self._heap = [entry for entry in self._heap if not entry[2].ended]
            heapq.heapify(self._heap)
            self._ended = 0

    async def run(self) -> None:
        while True:
            now = trio.current_time()
            due = []
            while self._heap and self._heap[0][0] <= now:
                due.append(heapq.heappop(self._heap))
            # What firing re-arms waits for the next round (after a yield),
            # even if already due: no connection can spin this loop.
            for deadline, _, connection in due:
                try:
                    connection.deadline_passed(deadline, now)
                except Exception:
                    connection.failed()  # costs that connection, never every connection's timers
            with trio.CancelScope(deadline=self._heap[0][0] if self._heap else math.inf) as self._scope:
                await trio.sleep_forever()
            self._scope = None
