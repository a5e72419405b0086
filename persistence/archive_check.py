"""``gateway store check`` for topic archives: read every segment of every
topic, validate every record's frame and checksum, and check that offsets run
on without a gap or a repeat, segment to segment.  Nothing is changed (not
even a torn tail, which the broker cuts and refills from the journal at its
next start)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from persistence import records
from persistence.archive_format import OFFSET, list_bases, segment_name
from persistence.records import HEADER_BYTES, CorruptRecord

# At most this many problems are listed one by one per report.
MAX_LISTED = 100


def check_archive(directory: Path) -> dict[str, Any]:
    topics: dict[str, Any] = {}
    problems: list[dict[str, Any]] = []

    def problem(topic: str, segment: str, offset: int, reason: str) -> None:
        if len(problems) < MAX_LISTED:
            problems.append({"topic": topic, "segment": segment, "offset": offset, "reason": reason})

    corrupt = torn = 0
    for entry in sorted(os.listdir(directory)) if directory.is_dir() else ():
        path = directory / entry
        if not path.is_dir():
            continue
        name = unquote(entry)
        bases = list_bases(path)
        if not bases:
            continue
        expected = bases[0]
        count = size = 0
        for i, base in enumerate(bases):
            seg = segment_name(base)
            if base != expected:
                problem(name, seg, base, f"offsets {expected}..{base - 1} are missing before this segment"
                        if base > expected else f"segment starts at {base}, but offsets up to {expected - 1} came before")
                expected = base
            data = (path / seg).read_bytes()
            size += len(data)
            p, n = 0, len(data)
            while p < n:
                try:
                    _rtype, length = records.parse_frame(data, p, n)
                except CorruptRecord as exc:
                    if i == len(bases) - 1:  # the newest segment's unfinished tail
                        torn += n - p
                    else:
                        corrupt += 1
                        problem(name, seg, p, f"{exc.reason}; the {n - p} bytes after it are unreadable")
                    break
                (offset,) = OFFSET.unpack_from(data, p + HEADER_BYTES)
                if offset != expected:
                    problem(name, seg, p, f"record holds offset {offset}, expected {expected}")
                expected = offset + 1
                count += 1
                p += HEADER_BYTES + length
        topics[name] = {"segments": len(bases), "bytes": size, "records": count,
                        "earliest": bases[0], "next_offset": expected}
    return {"topics": len(topics), "corrupt_records": corrupt, "torn_bytes": torn,
            "problems": problems, "by_topic": topics}
