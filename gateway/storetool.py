"""``gateway store check|compact DATA_DIR``: the store, offline, for operators."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, TextIO

from persistence import offline
from persistence.recovery import FolderInUse

# Exit codes: 0 a sound store, 1 damage found (or the folder unreadable), 2 no
# store there, 3 the folder is in use (a running broker holds its lock).
IN_USE_EXIT = 3


class ProgressBar:
    """A one-line progress bar on a terminal; silent when output is piped,
    so scripts and logs get only the report."""

    def __init__(self, label: str, out: TextIO = sys.stderr, width: int = 30) -> None:
        self.label = label
        self.out = out
        self.width = width
        self.enabled = out.isatty()
        self._last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self._last < 0.1 and done < total):
            return
        self._last = now
        fraction = done / total if total else 1.0
        filled = int(fraction * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        self.out.write(f"\r{self.label} [{bar}] {fraction:6.1%} {done / 2**20:,.1f}/{total / 2**20:,.1f} MiB")
        self.out.flush()

    def done(self) -> None:
        if self.enabled:
            self.out.write("\n")


def main(action: str, data_dir: str) -> int:
    directory = Path(data_dir) / "store"
    if not directory.is_dir():
        print(f"gateway: no store in {data_dir} (expected {directory})", file=sys.stderr)
        return 2
    bar = ProgressBar("checking" if action == "check" else "compacting")
    try:
        report = offline.check(directory, progress=bar) if action == "check" else offline.compact(directory, progress=bar)
    except FolderInUse as exc:
        # Not a damaged store: a broker (or another tool) has it open.
        bar.done()
        print(f"gateway: {exc}", file=sys.stderr)
        return IN_USE_EXIT
    except OSError as exc:
        bar.done()
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    bar.done()
    _print_report(report)
    return 1 if report.get("corrupt_records") or report.get("archive", {}).get("problems") else 0


def _print_report(report: dict[str, Any], indent: str = "") -> None:
    for key, value in report.items():
        if isinstance(value, dict):
            print(f"{indent}{key}:")
            _print_report(value, indent + "  ")
        elif isinstance(value, float):
            print(f"{indent}{key}: {value:.3f}")
        else:
            print(f"{indent}{key}: {value}")
