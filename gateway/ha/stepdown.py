"""A primary that stepped down because its store cannot write
(gateway/ha/node.py's STEPPED_DOWN): what its process does until the disk
writes again.

Its run has ended and its ZooKeeper session is closed, so it is no member of
the group and never a candidate: a backup with a healthy disk leads.  It
stays up rather than exit, answering its admin port as a backup does, with
/readyz 503 and the reason: an operator (or Kubernetes' readiness) sees why,
and a pod restart would not mend a volume that went read-only anyway.  Every
:data:`DISK_PROBE_S` it writes, fsyncs and removes a small file in its data
folder; once that works the process starts a fresh node, which joins as a
backup (catch-up copies the folder again if it holds records the new
primary never had).
"""

from __future__ import annotations

import os
from typing import Any

import trio

DISK_PROBE_S = 5.0  # how often a stepped-down node tries its data folder again
PROBE_NAME = ".write-probe"  # the file it writes, fsyncs and removes to try it


def write_probe(data_dir: str) -> None:
    """Write, fsync and remove a small file in ``data_dir`` (OSError if it cannot)."""
    path = os.path.join(data_dir, PROBE_NAME)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, b"probe")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.unlink(path)


async def stand_down(node: Any) -> None:
    """Serve ``node``'s (runtime.HaNode) admin port, not ready and saying
    why, until its data folder takes a write and an fsync, or a signal."""
    async with trio.open_nursery() as nursery:
        await node.serve_standby(nursery, lambda: f"{node.state.value}: the store cannot write ({node.sick})")
        while not node.stopping:
            node.changed = trio.Event()
            with trio.move_on_after(DISK_PROBE_S):
                await node.changed.wait()  # woken early by a signal (HaNode.stop)
            if node.stopping:
                break
            try:
                await trio.to_thread.run_sync(write_probe, node.config.data_dir)
            except OSError as exc:
                node.sick = exc.strerror or str(exc)
                continue
            node.log.warning("ha_store_writes_again", data_dir=node.config.data_dir,
                             detail="the data folder takes writes again: a fresh node rejoins as a backup")
            break
        nursery.cancel_scope.cancel()
