"""HA end to end, a primary whose disk stops writing: three `gateway serve`
nodes on a real ZooKeeper; the primary's data folder is an ext4 filesystem of
its own (a loop device) mounted errors=remount-ro, and mid-load the kernel is
told the filesystem is corrupt (ext4's trigger_fs_error), so it goes
read-only under the broker as a real disk error makes it: every write and
fsync then fails with EROFS.  The primary steps down (its clients closed, the
lock released, /readyz 503 with the reason) and stays up, not a member; a
backup leads within a bounded time and holds every receipted message.  Once
the filesystem is checked and mounted again the node rejoins as a backup.
Needs root and a free loop device (skipped otherwise)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ha_nodes import WAIT_S, Node, wait_ready, wait_role
from tests.support.helpers import RawClient
from tests.support.processes import HOST
from tests.support.zookeeper_helpers import ZooKeeperServer

DISK_BYTES = 64 * 1024 * 1024


@contextlib.contextmanager
def own_ext4(folder: Path) -> Iterator[str]:
    """An ext4 filesystem of its own (an image on a loop device) mounted at
    ``folder`` with errors=remount-ro; the loop device (/dev/loopN)."""
    if os.geteuid() != 0 or shutil.which("losetup") is None or shutil.which("mkfs.ext4") is None:
        pytest.skip("needs root, losetup and mkfs.ext4")
    image = folder.parent / "disk.img"
    with open(image, "wb") as f:
        f.truncate(DISK_BYTES)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    made = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"no loop device: {made.stderr.strip()}")
    device = made.stdout.strip()
    try:
        folder.mkdir(exist_ok=True)
        subprocess.run(["mount", "-o", "errors=remount-ro", device, str(folder)], check=True)
        try:
            (folder / "lost+found").rmdir()  # the data folder holds the store's files only
            yield device
        finally:
            subprocess.run(["umount", "-l", str(folder)], check=False)
    finally:
        subprocess.run(["losetup", "-d", device], check=False)


class Producer(threading.Thread):
    """Receipted persistent SENDs, one at a time, until the connection fails;
    ``receipted`` holds the bodies whose RECEIPT came."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.receipted: list[bytes] = []
        self.ended: str | None = None

    def run(self) -> None:
        client = RawClient((HOST, self.port), timeout=30)
        try:
            client.connect()
            for i in range(100_000):
                body = f"order {i}".encode()
                client.send_frame("SEND", {"destination": "/queue/orders", "persistent": "true", "receipt": f"r{i}"},
                                  body)
                frame = client.next_frame(30)
                if frame.command != "RECEIPT":
                    self.ended = f"{frame.command}: {frame.headers.get('message')}"
                    return
                assert frame.headers["receipt-id"] == f"r{i}"
                self.receipted.append(body)
        except (OSError, AssertionError, EOFError) as exc:
            self.ended = repr(exc)
        finally:
            client.close()


def test_a_primary_whose_disk_goes_read_only_steps_down_and_a_backup_leads(tmp_path: Path,
                                                                           zookeeper: ZooKeeperServer) -> None:
    nodes = [Node(tmp_path, name, zookeeper) for name in ("gw-0", "gw-1", "gw-2")]
    sick, backups = nodes[0], nodes[1:]
    with own_ext4(sick.data_dir) as device:
        try:
            # gw-0 first: alone it waits (replicas - sync_replicas = 2 nodes);
            # with a second, equal, node the tie goes to the lowest id.
            sick.start()
            deadline = time.monotonic() + WAIT_S
            while "ha_waiting_for_nodes" not in sick.log_path.read_text(errors="replace"):
                assert time.monotonic() < deadline and sick.alive(), sick.log_tail()
                time.sleep(0.1)
            for node in backups:
                node.start()
            assert wait_ready(nodes) is sick

            producer = Producer(sick.stomp_port)
            producer.start()
            deadline = time.monotonic() + WAIT_S
            while len(producer.receipted) < 200:  # under load
                assert time.monotonic() < deadline and producer.is_alive(), producer.ended
                time.sleep(0.05)
            with open(f"/sys/fs/ext4/{os.path.basename(device)}/trigger_fs_error", "w") as trigger:
                trigger.write("test: the disk goes read-only\n")
            producer.join(WAIT_S)
            assert not producer.is_alive()
            receipted = list(producer.receipted)

            # A backup leads; the old primary is up and answers 503, saying why.
            new = wait_ready(nodes)
            assert new in backups
            answer = sick.get("/readyz")
            assert answer is not None and answer[0] == 503 and "store cannot write" in answer[1], answer
            assert sick.alive()
            log = sick.log_path.read_text(errors="replace")
            assert "ha_stepped_down" in log and "Read-only file system" in log

            # Every receipted message is on the new primary, once.
            consumer = RawClient((HOST, new.stomp_port), timeout=30)
            consumer.connect()
            consumer.send_frame("SUBSCRIBE", {"destination": "/queue/orders", "id": "s", "ack": "auto"})
            bodies = [frame.body for frame in consumer.quiet_for(3.0) if frame.command == "MESSAGE"]
            consumer.close()
            assert len(bodies) == len(set(bodies))
            missing = set(receipted) - set(bodies)
            assert not missing, f"{len(missing)} of {len(receipted)} receipted messages lost"
            assert len(receipted) >= 200
            members = json.loads(new.get("/api/v1/cluster")[1])["nodes"]  # type: ignore[index]
            assert sick.node_id not in [m["node_id"] for m in members]  # no member: never a candidate

            # The disk mended (the filesystem checked and mounted again): the
            # node rejoins, as a backup of the new primary.
            subprocess.run(["umount", "-l", str(sick.data_dir)], check=True)
            subprocess.run(["e2fsck", "-f", "-y", device], capture_output=True, check=False)  # 1: errors fixed
            subprocess.run(["mount", "-o", "errors=remount-ro", device, str(sick.data_dir)], check=True)
            wait_role(sick, "backup_in_sync")
            assert wait_ready(nodes) is new
        finally:
            for node in nodes:
                node.kill()
