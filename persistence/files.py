"""Owner-only files: every folder the store and the archive make is 0700 and
every file they write is 0600, whatever the process's umask (a shell's 022
would leave the journal, and so every persistent message, readable by any
local user).  A umask can only take bits away, so asking for these modes at
creation is enough; nothing is chmodded after the fact except by
:func:`tighten`, for a folder an older version left open."""

from __future__ import annotations

import os
import stat
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def create(path: Path | str, flags: int) -> int:
    """``os.open(path, flags | O_CREAT)``, owner-only when it creates the file."""
    return os.open(path, flags | os.O_CREAT, FILE_MODE)


def make_dirs(path: Path) -> None:
    """``path.mkdir(parents=True, exist_ok=True)`` with every folder it
    makes 0700 (``Path.mkdir`` gives missing parents the umask's mode), and
    the same errors (a file in the way: NotADirectoryError, FileExistsError)."""
    missing: list[Path] = []
    while not os.path.lexists(path) and path.parent != path:
        missing.append(path)
        path = path.parent
    if not missing:
        path.mkdir(DIR_MODE, exist_ok=True)  # there already: fine if a folder
    for folder in reversed(missing):
        folder.mkdir(DIR_MODE, exist_ok=True)  # exist_ok: another maker got there first


def write_bytes(path: Path, data: bytes) -> None:
    """``path.write_bytes(data)``, creating the file owner-only."""
    fd = create(path, os.O_WRONLY | os.O_TRUNC)
    try:
        view = memoryview(data)
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:])
    finally:
        os.close(fd)


def tighten(folder: Path) -> tuple[int | None, int]:
    """Make an existing data folder and what is in it owner-only, as a new
    one is: (the folder's mode before, when it was group/world-accessible
    and was tightened; how many files or subfolders were).  Only what this
    process's user owns is touched (a mounted volume's root belongs to root,
    and its files are what matter); links are not followed."""
    uid = os.geteuid()
    before: int | None = None
    changed = 0
    info = folder.stat()  # the folder itself, through a link if it is one
    if info.st_uid == uid and stat.S_IMODE(info.st_mode) & 0o077:
        before = stat.S_IMODE(info.st_mode)
        os.chmod(folder, before & 0o700)
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = os.path.join(root, name)
            try:
                entry = os.lstat(path)
                if entry.st_uid != uid or stat.S_ISLNK(entry.st_mode) or not stat.S_IMODE(entry.st_mode) & 0o077:
                    continue
                os.chmod(path, stat.S_IMODE(entry.st_mode) & 0o700)  # the owner's bits stay as they were
            except FileNotFoundError:
                continue  # gone meanwhile (a store tool's temporary file): nothing left to tighten
            changed += 1
    return before, changed
