"""Promotion benchmark: how long a backup holding a long journal after its
last checkpoint takes to become a primary that can serve (stdlib + project
code; one process, loopback only).

    .venv/bin/python benchmarks/promotion.py [--records 500000] [--body 100] [--json FILE]

1. Build: a primary :class:`Store` (sync never, in a temp folder) takes
   ``--records`` records in batches of ``--batch`` (half MESSAGE_ADD with
   ``--body``-byte bodies, half ACKs of the previous batch's messages, as a
   queue whose consumer keeps up), each batch becoming the Batch frame a
   primary sends.
2. Follow: a scripted primary streams those frames over a 127.0.0.1 link to
   the real :class:`gateway.ha.backup.Backup` into a :class:`Follower` in the
   data folder of a broker, which writes and acks them as a backup does, with
   no checkpoint of its own in between (its upkeep is kept from running: the
   worst case, every record after the last checkpoint; ``--upkeep`` lets it
   checkpoint when due, as in service).  Reported: the stream's wall time
   and this process's CPU time per record (the scripted primary's share is
   the same on every version).
3. Promote: what gateway/ha/runtime.py's PROMOTE action and the broker's
   start run until the core is restored: :meth:`Follower.promote` (and the new
   epoch saved), then what gateway/app.py's serve runs first: the store's open
   and the core's recovery.  Reported: its wall time and the records the
   store replayed.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from core.storage import StoredMessage  # noqa: E402
from core import recovery as core_recovery  # noqa: E402
from core.broker import Broker  # noqa: E402
from gateway import startup  # noqa: E402
from gateway.transports.server import TrioClock  # noqa: E402
from gateway.config import Config  # noqa: E402
from gateway.ha.backup import Backup  # noqa: E402
from gateway.ha.link import Link  # noqa: E402
from persistence.replica import epochs  # noqa: E402
from persistence.replica import replication as r  # noqa: E402
from persistence.replica.follower import Follower  # noqa: E402
from persistence.settings import StoreSettings  # noqa: E402
from persistence.store import Store  # noqa: E402

QUEUE = "/queue/backlog"
WAIT_S = 600.0


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000, help="records after the checkpoint (default 500000)")
    parser.add_argument("--batch", type=int, default=500, help="records per Batch frame (default 500)")
    parser.add_argument("--body", type=int, default=100, help="message body bytes (default 100)")
    parser.add_argument("--upkeep", action="store_true",
                        help="let the backup checkpoint when due, as in service (for its CPU per record; the "
                             "promotion then finds only what followed its last checkpoint)")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    return parser.parse_args(argv)


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def build_frames(folder: Path, records: int, batch: int, body: bytes) -> list[r.Batch]:
    """The primary's journal as the Batch frames it would send."""
    store = Store(folder / "store", sync="never")
    store.open()
    frames: list[r.Batch] = []
    previous: list[str] = []
    n = 0
    while n < records:
        ids = [f"m{n + i}" for i in range(max(1, min(batch, records - n) // 2))]
        for mid in ids:
            store.add_message(StoredMessage(mid, QUEUE, {"persistent": "true"}, body, 4, 0, 0, 0), [QUEUE])
        for mid in previous:
            store.ack(QUEUE, mid)
        n += len(ids) + len(previous)
        previous = ids
        taken = store.take_batch()
        assert taken is not None
        store.write_batch(taken)
        store.batch_written(taken)
        frames.append(r.Batch(1, taken.first_lsn, taken.last_lsn, tuple((s, o, bytes(d)) for s, o, d in taken.runs)))
    store.abandon()
    return frames


class NoUpkeep(Follower):
    """Never checkpoints while following: every record stays after the last checkpoint."""

    def checkpoint_due(self) -> bool:
        return False


async def follow(follower: Follower, frames: list[r.Batch]) -> None:
    last = frames[-1].last_lsn
    done = trio.Event()

    async def scripted_primary(stream: trio.SocketStream) -> None:
        link = Link(stream, r.Role.PRIMARY)
        await link.authenticate("primary", "p", b"")
        hello = await link.receive(WAIT_S)
        assert isinstance(hello, r.Hello) and hello.last_lsn == 0, hello
        await link.send(r.Hello("p", 1, last, ((1, 1),)))

        async def acks() -> None:
            while True:
                frame = await link.receive(WAIT_S)
                if isinstance(frame, r.Ack) and frame.lsn == last:
                    done.set()
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(acks)
            for frame in frames:
                await link.send(frame)
            await done.wait()
            nursery.cancel_scope.cancel()

    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            (listener,) = await nursery.start(partial(trio.serve_tcp, scripted_primary, 0, host="127.0.0.1"))
            port = listener.socket.getsockname()[1]
            backup = Backup(follower, "b", "127.0.0.1", port, connect_attempts=1, log=lambda *a, **k: None)
            nursery.start_soon(backup.run)
            await done.wait()
            # As the runtime's stop_following: the backup's task cancelled
            # (it finishes a catch-up under way first).
            nursery.cancel_scope.cancel()


class Quiet:
    def __getattr__(self, name: str):  # info, warning, ... of a structlog logger
        return lambda *a, **k: None


async def promote(follower: Follower, data_dir: Path) -> tuple[float, object]:
    """The PROMOTE action and the broker's open and recovery; (seconds, what recovered)."""
    started = time.perf_counter()
    if "epoch" in inspect.signature(follower.promote).parameters:
        await trio.to_thread.run_sync(follower.promote, 2)
    else:  # before the index handover: the runtime saved the epoch itself
        await trio.to_thread.run_sync(follower.promote)
        history = epochs.extended(follower.history, 2, follower.last_lsn + 1)
        await trio.to_thread.run_sync(epochs.save, follower.directory, history)
    # What gateway/app.py's serve runs first (its _open_and_recover).
    config = Config(data_dir=str(data_dir))
    await trio.to_thread.run_sync(startup.prepare_data_dir, config, Quiet())
    store = Store.in_data_dir(config.data_dir, config.store)
    seed = getattr(follower, "seed", None)
    recovered = await trio.to_thread.run_sync(store.open, *([] if seed is None else [seed]))
    broker = Broker(TrioClock(), config.broker, store=store)
    core_recovery.restore(broker, recovered)
    store.forget_redeliveries()
    seconds = time.perf_counter() - started
    store.abandon()
    return seconds, recovered


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    folder = Path(tempfile.mkdtemp(prefix="promotion-"))
    try:
        t0 = time.perf_counter()
        frames = build_frames(folder / "primary", args.records, args.batch, b"x" * args.body)
        built_s = time.perf_counter() - t0
        records = frames[-1].last_lsn
        data_dir = folder / "backup"
        follower = (Follower if args.upkeep else NoUpkeep).in_data_dir(data_dir, StoreSettings())
        follower.open()
        cpu0, wall0 = cpu_s(), time.perf_counter()
        trio.run(follow, follower, frames)
        follow_s, follow_cpu = time.perf_counter() - wall0, cpu_s() - cpu0
        del frames
        promote_s, recovered = trio.run(promote, follower, data_dir)
        result = {
            "records": records,
            "body_bytes": args.body,
            "batch_records": args.batch,
            "upkeep": args.upkeep,
            "build_s": round(built_s, 2),
            "follow_s": round(follow_s, 2),
            "follow_records_per_s": round(records / follow_s),
            "follow_cpu_us_per_record": round(follow_cpu / records * 1e6, 2),
            "promotion_s": round(promote_s, 3),
            "replayed_records": recovered.replayed_records,  # type: ignore[attr-defined]
            "live_messages": sum(len(q) for q in recovered.queues.values()),  # type: ignore[attr-defined]
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg()[0],
        }
        print(json.dumps(result, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        return 0
    finally:
        if args.keep:
            print(f"kept {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
