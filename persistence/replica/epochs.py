"""A node's epoch history: which epoch wrote which LSNs of its journal, kept
in a small fsynced file in the store folder (``EPOCHS``), and the rule that
tells whether a backup's journal is a prefix of the primary's.

The history is ``((epoch, first_lsn), ...)``, epochs ascending: the records
from ``first_lsn`` on (up to the next entry's) were written by the primary of
``epoch``.  Its last epoch is the highest the node has accepted, the fencing
token it refuses anything older than.  A new primary appends ``(epoch, its
last lsn + 1)`` when it takes over; a backup takes the history of the primary
it follows (the primary's Hello answer, or SnapshotBegin).

Divergence (:func:`diverged`): LSNs are positions in the journal, and every
epoch has a single writer, so two journals agree up to LSN ``L`` exactly when
the record at ``L`` was written in the same epoch on both (the primary of an
epoch streams from its own journal, and a backup only ever extends a journal
the primary has checked the same way).  A backup whose last record's epoch is
not the primary's epoch of that LSN, or that holds more than the primary,
holds records the primary never had (it was the primary of an older epoch,
or followed one): it is wiped and copied again by snapshot.  Cutting it back
to the common prefix instead (as Kafka does) would need the index to undo
records; a snapshot is simpler and always right.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from persistence.files import FILE_MODE
from persistence.journal import fsync_directory

HISTORY_NAME = "EPOCHS"

History = tuple[tuple[int, int], ...]


def load(directory: Path) -> History:
    """The folder's history; empty when it has none."""
    try:
        text = (directory / HISTORY_NAME).read_text()
    except FileNotFoundError:
        return ()
    try:
        return tuple((int(e), int(f)) for e, f in json.loads(text))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{directory / HISTORY_NAME} is damaged: {exc}") from None


def save(directory: Path, history: History) -> None:
    """Temp file, fsync, rename, fsync the folder: durable before it returns."""
    tmp = directory / (HISTORY_NAME + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.write(fd, json.dumps([list(entry) for entry in history]).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / HISTORY_NAME)
    fsync_directory(directory)


def current(history: History) -> int:
    """The highest accepted epoch (0: none yet)."""
    return history[-1][0] if history else 0


def extended(history: History, epoch: int, first_lsn: int) -> History:
    """``history`` with ``epoch`` starting at ``first_lsn`` (unchanged when it
    is already the current one).  An older epoch is a ValueError."""
    if epoch < current(history):
        raise ValueError(f"epoch {epoch} is older than the accepted {current(history)}")
    if epoch == current(history):
        return history
    return history + ((epoch, first_lsn),)


def epoch_of(history: History, lsn: int) -> int:
    """The epoch that wrote ``lsn`` (0 for none, or before every entry)."""
    found = 0
    for epoch, first in history:
        if first > lsn:
            break
        found = epoch
    return found


def diverged(primary: History, primary_lsn: int, backup: History, backup_lsn: int) -> bool:
    """True when the backup's journal is not a prefix of the primary's."""
    if backup_lsn == 0:
        return False
    if backup_lsn > primary_lsn:
        return True
    return epoch_of(backup, backup_lsn) != epoch_of(primary, backup_lsn)
