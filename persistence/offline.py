"""``check`` and ``compact`` of a store folder while no broker has it open
(``gateway store check|compact``)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from persistence import recovery
from persistence.archive import Archive
from persistence.archive_check import check_archive
from persistence.index import REFS, Index, ref_list
from persistence.journal import OFFSET_BITS, OFFSET_MASK, Journal, list_segments, segment_name
from persistence.records import CorruptRecord
from persistence.recovery import CLEAN_NAME
from persistence.store import Store

Progress = Callable[[int, int], None] | None
# At most this many corrupt records are listed one by one in a report.
MAX_LISTED_CORRUPTIONS = 100
_PROGRESS_EVERY_RECORDS = 20_000


def check(directory: Path, progress: Progress = None) -> dict[str, Any]:
    """Read every segment and validate every record (nothing is changed,
    not even a torn tail), and rebuild the state the broker would recover."""
    if not directory.is_dir():
        raise FileNotFoundError(f"no store at {directory}")
    # Only to see that no broker has it: released at once, nothing is changed.
    busy = (f"store {directory} is in use (a running broker or tool holds its lock), which is not damage: "
            "stop the broker first, or check a copy of the folder")
    os.close(recovery.lock_folder(directory, busy))
    corruptions: list[dict[str, Any]] = []

    def on_corrupt(path: str, offset: int, reason: str) -> None:
        if len(corruptions) < MAX_LISTED_CORRUPTIONS:
            corruptions.append({"segment": Path(path).name, "offset": offset, "reason": reason})

    index = Index()
    report_checkpoint: dict[str, Any] = {"present": False}
    start = 0
    try:
        snapshot = recovery.load_snapshot(directory, index)
    except CorruptRecord as exc:
        snapshot = None
        report_checkpoint = {"present": True, "corrupt": exc.reason}
    if snapshot is not None:
        start = snapshot.position
        report_checkpoint = {
            "present": True,
            "segment": segment_name(start >> OFFSET_BITS),
            "offset": start & OFFSET_MASK,
            "messages": len(snapshot.messages),
        }
    segments = list_segments(directory)
    sizes = {seg: (directory / segment_name(seg)).stat().st_size for seg in segments}
    total = sum(sizes.values())
    before: dict[int, int] = {}
    running = 0
    for seg in segments:
        before[seg] = running
        running += sizes[seg]
    journal = Journal(directory, 2**62)
    index.tracking = False
    records = 0
    unknown = 0

    def on_unknown(location: int, rtype: int) -> None:
        nonlocal unknown
        unknown += 1

    def scanned(location: int) -> None:
        nonlocal records
        records += 1
        if progress is not None and records % _PROGRESS_EVERY_RECORDS == 0:
            progress(before.get(location >> OFFSET_BITS, 0) + (location & OFFSET_MASK), total)

    replayed = recovery.replay(journal, index, start, on_corrupt, on_unknown, scan_from=0, truncate=False, scanned=scanned)
    if progress is not None:
        progress(total, total)
    destinations: Counter[str] = Counter()
    keys: Counter[str] = Counter()
    dead_ratio = {}
    for entry in index.messages.values():
        destinations[entry[2]] += 1
        for key in ref_list(entry[REFS]):
            keys[key] += 1
    for seg in segments:
        count = index.seg_records.get(seg, 0)
        dead_ratio[segment_name(seg)] = round(1 - index.seg_live.get(seg, 0) / count, 3) if count else 1.0
    return {
        "directory": str(directory),
        "clean": (directory / CLEAN_NAME).exists(),
        "segments": len(segments),
        "bytes": total,
        "records": records,
        "replayed_records": replayed,
        "corrupt_records": journal.corrupt_records + (1 if report_checkpoint.get("corrupt") else 0),
        "torn_bytes": journal.torn_bytes,
        "unknown_records": unknown,
        "checkpoint": report_checkpoint,
        "messages": len(index.messages),
        "subscriptions": len(index.subscriptions),
        "kv_keys": sum(len(space) for space in index.kv.values()),
        "destinations": dict(sorted(destinations.items())),
        "keys": dict(sorted(keys.items())),
        "dead_ratio": dead_ratio,
        "corruptions": corruptions,
        # The topic archives beside the store (a broker's data_dir/archive).
        "archive": check_archive(directory.parent / "archive"),
    }


def compact(directory: Path, progress: Progress = None) -> dict[str, Any]:
    """Open the store, move every live message out of every closed segment
    that has any dead record, checkpoint, delete the emptied segments."""
    if not directory.is_dir():
        raise FileNotFoundError(f"no store at {directory}")
    # The topic archives beside the store (a broker's data_dir/archive) are
    # opened with it, so the archive records its journal still holds for
    # them are re-applied before the checkpoint lets the journal forget them.
    archive_dir = directory.parent / "archive"
    store = Store(directory, sync="always", archive=Archive(archive_dir) if archive_dir.is_dir() else None)
    recovered = store.open()
    start = store.stats()
    total = start["bytes"] or 1
    moved_steps = 0
    deleted: list[str] = []
    try:
        while store.compact_step(10_000, min_dead_ratio=0.0) or store.stats()["pending_bytes"]:
            store.flush()
            moved_steps += 1
            if progress is not None:
                progress(min(moved_steps * 2**20, total), total)
        store.checkpoint()
        store.flush()
        deleted = store.collect_garbage()
        end = store.stats()
    finally:
        store.close()
    if progress is not None:
        progress(total, total)
    return {
        "directory": str(directory),
        "segments_before": start["segments"],
        "segments_after": end["segments"],
        "bytes_before": start["bytes"],
        "bytes_after": end["bytes"],
        "deleted": deleted,
        "messages": end["live_messages"],
        "corrupt_records": recovered.corrupt_records,
        "torn_bytes": recovered.torn_bytes,
    }
