"""A connection's bounded output buffer, with durability gates.

Sans-IO: sessions append encoded bytes; the server's writer task drains them in
batches with one ``send_all``.  An entry tagged with an LSN (a receipt that
promises durability) is held, with everything behind it so order is kept, until
the store reports that LSN durable.  Shared by the STOMP and MQTT sessions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

# One send_all carries at most this much: large enough to amortise the syscall
# and the task switch over hundreds of messages, small enough to keep latency.
DRAIN_BYTES = 256 * 1024
NO_GATES = ()  # what an outbox that never held a gated entry has instead of a deque


class Outbox:
    __slots__ = ("_chunks", "nbytes", "_base", "_gates", "high_water", "wakeup", "sent_bytes")

    def __init__(self, high_water: int, wakeup: Callable[[], None] | None = None) -> None:
        self._chunks: list[bytes] = []
        # Bytes queued; a plain attribute, not a property: every delivery
        # reads it (the sessions' ``accepting``).  Only the outbox writes it.
        self.nbytes = 0
        self._base = 0  # absolute index of _chunks[0]
        # (absolute chunk index, lsn, what it promises: a receipt id, or None);
        # an empty deque is 600 bytes, so one is made at the first gated entry.
        self._gates: deque[tuple[int, int, str | None]] | tuple[()] = NO_GATES
        self.high_water = high_water
        self.wakeup = wakeup
        self.sent_bytes = 0

    @property
    def full(self) -> bool:
        return self.nbytes >= self.high_water

    def __bool__(self) -> bool:
        return self.nbytes > 0

    def append(self, data: bytes, lsn: int = 0, promise: str | None = None) -> None:
        """Queue bytes; with ``lsn`` they leave only once that LSN is durable.
        ``promise`` names them (a receipt id) should the write fail."""
        if lsn:
            if self._gates is NO_GATES:
                self._gates = deque()
            self._gates.append((self._base + len(self._chunks), lsn, promise))  # type: ignore[union-attr]
        if not self._chunks and self.wakeup is not None:
            self.wakeup()
        self._chunks.append(data)
        self.nbytes += len(data)

    def extend(self, parts: tuple[bytes, ...], size: int) -> None:
        """Queue several pieces of one frame (``size`` is their total length)."""
        if not self._chunks and self.wakeup is not None:
            self.wakeup()
        self._chunks.extend(parts)
        self.nbytes += size

    def drain(self, durable_lsn: int, max_bytes: int = DRAIN_BYTES) -> bytes:
        """Take up to about ``max_bytes`` of releasable output (at least one chunk)."""
        chunks = self._chunks
        limit = len(chunks)
        gates = self._gates
        while gates and gates[0][1] <= durable_lsn:
            gates.popleft()
        if gates:
            limit = gates[0][0] - self._base
        taken = 0
        size = 0
        while taken < limit and size < max_bytes:
            size += len(chunks[taken])
            taken += 1
        if not taken:
            return b""
        data = b"".join(chunks[:taken])
        del chunks[:taken]
        self._base += taken
        self.nbytes -= size
        self.sent_bytes += size
        return data

    def drop_gated(self, first_lsn: int, last_lsn: int) -> list[str | None]:
        """Withdraw every gated entry waiting on an LSN in the range (the store
        failed to write it: its promise must never go out).  Returns what
        each promised, in order (None for an unnamed one)."""
        dropped = []
        kept: deque[tuple[int, int, str | None]] = deque()
        for gate in self._gates:
            index, lsn, promise = gate
            if first_lsn <= lsn <= last_lsn:
                chunk = index - self._base
                self.nbytes -= len(self._chunks[chunk])
                self._chunks[chunk] = b""
                dropped.append(promise)
            else:
                kept.append(gate)
        self._gates = kept
        return dropped

    def waiting_on(self) -> int | None:
        """The LSN the head of the outbox waits for, if it is gated."""
        if self._gates and self._gates[0][0] == self._base:
            return self._gates[0][1]
        return None
