"""The in-memory index: which messages are live, where each is, and which
queue keys still hold it; durable subscriptions; key/value state; live and
total record counts per segment (for garbage collection and compaction).

One entry per message, as an immutable tuple (see ``Entry``)::

    (location, refs, destination, priority, expires, timestamp, delivery_count)

``refs`` is the one key holding the message (a ``str``, the common case) or a
tuple of keys.  Tuples rather than a slotted class because a checkpoint takes
a shallow ``dict.copy()`` on the main thread and serialises it in a worker:
an entry that is replaced rather than mutated cannot change under the worker.
They are also the smallest honest representation (a 1M-message backlog costs
about 300 bytes a message here, id included).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from core.storage import StoredMessage

from persistence import records
from persistence.journal import OFFSET_BITS
from persistence.records import CorruptRecord, RecordType

Entry = tuple[int, Any, str, int, int, int, int]
# Final: a checker (and mypyc, `make fast`) types ``entry[REFS]`` by position.
LOCATION: Final = 0
REFS: Final = 1
DESTINATION: Final = 2


def has_ref(refs: str | tuple[str, ...], key: str) -> bool:
    return refs == key if refs.__class__ is str else key in refs


def ref_list(refs: str | tuple[str, ...]) -> tuple[str, ...]:
    return (refs,) if refs.__class__ is str else refs  # type: ignore[return-value]


# The records a transaction may hold (its adds, acks, archive copies and the
# idempotency key of its COMMIT), replayed like the same records outside one.
_TX_OPS = frozenset({RecordType.MESSAGE_ADD, RecordType.ACK, RecordType.ARCHIVE, RecordType.KV_PUT})

class Index:
    __slots__ = ("messages", "subscriptions", "kv", "seg_live", "seg_records", "orphans", "forward", "origin", "tracking", "_sub_ids", "_apply", "on_archive")

    def __init__(self) -> None:
        self.messages: dict[str, Entry] = {}
        self.subscriptions: dict[str, str] = {}
        self.kv: dict[str, dict[str, bytes]] = {}
        self.seg_live: dict[int, int] = {}
        self.seg_records: dict[int, int] = {}
        # Messages whose add failed to reach disk (Store.batch_failed): still
        # live for the broker, readable from here, never checkpointed.
        self.orphans: dict[int, bytes] = {}
        # Compaction moves messages the broker knows by their old location:
        # forward maps the location the broker holds to the current one, and
        # origin the current one back, so both go when the message dies.
        self.forward: dict[int, int] = {}
        self.origin: dict[int, int] = {}
        # Message ids per durable-subscription key, so removing one does not
        # scan every message.  Queue keys are not tracked (memory).  Not kept
        # during replay (speed): removals there scan, and open() rebuilds it.
        self.tracking = True
        self._sub_ids: dict[str, dict[str, None]] = {}
        self._apply: dict[int, Callable[[int, memoryview], None]] = {
            RecordType.MESSAGE_ADD: self._replay_add,
            RecordType.ACK: self._replay_ack,
            RecordType.SUB_ADD: self._replay_sub_add,
            RecordType.SUB_REMOVE: self._replay_sub_remove,
            RecordType.TX: self._replay_tx,
            RecordType.KV_PUT: self._replay_kv_put,
            RecordType.KV_DELETE: self._replay_kv_delete,
            RecordType.PAD: self._replay_nothing,
            RecordType.MESSAGE_MOVE: self._replay_move,
            RecordType.ARCHIVE: self._replay_archive,
        }
        # Where replayed archive records go (Archive.recover); None: nowhere.
        self.on_archive: Callable[[memoryview], None] | None = None

    # -- changes (runtime and replay) ----------------------------------------

    def add(self, message: StoredMessage, location: int, keys: Sequence[str]) -> None:
        message_id, destination, _, _, priority, expires, timestamp, delivery_count, _ = message
        if not keys:
            return  # held by nobody: dead on arrival
        refs: Any = keys[0] if len(keys) == 1 else tuple(dict.fromkeys(keys))
        if refs.__class__ is tuple and len(refs) == 1:
            refs = refs[0]
        old = self.messages.get(message_id)
        if old is not None:
            # The same id again (a replay overlapping a checkpoint): one copy,
            # held by the union of keys.
            merged = tuple(dict.fromkeys(ref_list(old[REFS]) + ref_list(refs)))
            self.messages[message_id] = (old[0], merged[0] if len(merged) == 1 else merged, *old[2:])
            return
        self.messages[message_id] = (location, refs, destination, priority, expires, timestamp, delivery_count)
        seg = location >> OFFSET_BITS
        self.seg_live[seg] = self.seg_live.get(seg, 0) + 1
        if self._sub_ids and self.tracking:
            for key in ref_list(refs):
                ids = self._sub_ids.get(key)
                if ids is not None:
                    ids[message_id] = None

    def ack(self, key: str, message_id: str) -> None:
        entry = self.messages.get(message_id)
        if entry is None:
            return
        refs = entry[REFS]
        if refs.__class__ is str:
            if refs != key:
                return
            self._kill(message_id, entry)
        else:
            if key not in refs:
                return
            rest = tuple(r for r in refs if r != key)
            self.messages[message_id] = (entry[0], rest[0] if len(rest) == 1 else rest, *entry[2:])
        ids = self._sub_ids.get(key)
        if ids:
            ids.pop(message_id, None)

    def _kill(self, message_id: str, entry: Entry) -> None:
        del self.messages[message_id]
        location = entry[LOCATION]
        if self.origin:
            first = self.origin.pop(location, None)
            if first is not None:
                del self.forward[first]
        if self.orphans and self.orphans.pop(location, None) is not None:
            return  # an orphan never counted as live in a segment
        seg = location >> OFFSET_BITS
        self.seg_live[seg] -= 1

    def add_subscription(self, key: str, pattern: str) -> None:
        self.subscriptions[key] = pattern
        if self.tracking and key not in self._sub_ids:
            # New key: it may already hold messages (rare, and one scan).
            self._sub_ids[key] = {mid: None for mid, e in self.messages.items() if has_ref(e[REFS], key)}

    def remove_subscription(self, key: str) -> None:
        self.subscriptions.pop(key, None)
        ids = self._sub_ids.pop(key, None)
        if ids is None or not self.tracking:
            held = [mid for mid, e in self.messages.items() if has_ref(e[REFS], key)]
        else:
            held = list(ids)
        for message_id in held:
            self.ack(key, message_id)

    def put(self, namespace: str, key: str, value: bytes) -> None:
        self.kv.setdefault(namespace, {})[key] = value

    def delete(self, namespace: str, key: str) -> None:
        space = self.kv.get(namespace)
        if space is not None:
            space.pop(key, None)
            if not space:
                del self.kv[namespace]

    def move(self, message_id: str, location: int) -> None:
        """Compaction copied a live message to ``location``."""
        entry = self.messages.get(message_id)
        if entry is None or entry[LOCATION] == location or entry[LOCATION] in self.orphans:
            return
        old = entry[LOCATION]
        self.seg_live[old >> OFFSET_BITS] -= 1
        seg = location >> OFFSET_BITS
        self.seg_live[seg] = self.seg_live.get(seg, 0) + 1
        self.messages[message_id] = (location, *entry[1:])
        first = self.origin.pop(old, old)
        self.forward[first] = location
        self.origin[location] = first

    def orphan(self, location: int, payload: bytes) -> None:
        """The add at ``location`` never reached disk (see Store.batch_failed)."""
        entry = self.messages.get(records.decode_message_id(payload))
        if entry is None or entry[LOCATION] != location:
            return
        self.orphans[location] = payload
        self.seg_live[location >> OFFSET_BITS] -= 1

    def count_record(self, location: int) -> None:
        seg = location >> OFFSET_BITS
        self.seg_records[seg] = self.seg_records.get(seg, 0) + 1

    def forget_segment(self, seg: int) -> None:
        self.seg_live.pop(seg, None)
        self.seg_records.pop(seg, None)

    def track_subscriptions(self) -> None:
        """Rebuild the per-subscription id sets (after a checkpoint load)."""
        self._sub_ids = {key: {} for key in self.subscriptions}
        if not self._sub_ids:
            return
        for message_id, entry in self.messages.items():
            for key in ref_list(entry[REFS]):
                ids = self._sub_ids.get(key)
                if ids is not None:
                    ids[message_id] = None

    # -- replay ----------------------------------------------------------------

    def replay(self, location: int, rtype: int, payload: memoryview, on_unknown: Callable[[int, int], None]) -> None:
        """Apply one record read back from the journal."""
        self.count_record(location)
        handler = self._apply.get(rtype)
        if handler is None:
            on_unknown(location, rtype)  # a later format's record: skip it
            return
        handler(location, payload)

    def _replay_add(self, location: int, payload: memoryview) -> None:
        message, keys = records.decode_message_meta(payload, location)
        self.add(message, location, keys)

    def _replay_move(self, location: int, payload: memoryview) -> None:
        self.move(records.decode_message_id(payload), location)

    def _replay_ack(self, location: int, payload: memoryview) -> None:
        key, mid, _ = records.decode_two(payload)
        self.ack(key, mid)

    def _replay_sub_add(self, location: int, payload: memoryview) -> None:
        key, pattern, _ = records.decode_two(payload)
        self.add_subscription(key, pattern)

    def _replay_sub_remove(self, location: int, payload: memoryview) -> None:
        self.remove_subscription(records.decode_one(payload))

    def _replay_tx(self, location: int, payload: memoryview) -> None:
        ops = records.decode_tx(payload)  # decodes all before applying any
        base = location + records.HEADER_BYTES
        if len(ops) > 1:  # each op counts as a record for dead ratios
            self.seg_records[location >> OFFSET_BITS] += len(ops) - 1
        for at, rtype, op in ops:
            if rtype not in _TX_OPS:
                raise CorruptRecord(f"record type {rtype} inside a transaction")
            self._apply[rtype](base + at, op)

    def _replay_kv_put(self, location: int, payload: memoryview) -> None:
        self.put(*records.decode_kv_put(payload))

    def _replay_kv_delete(self, location: int, payload: memoryview) -> None:
        namespace, key, _ = records.decode_two(payload)
        self.delete(namespace, key)

    def _replay_archive(self, location: int, payload: memoryview) -> None:
        if self.on_archive is not None:
            self.on_archive(payload)

    def _replay_nothing(self, location: int, payload: memoryview) -> None:
        pass
