"""Where an idle MQTT connection's memory and connect time go: a broker run
in this process, N idle connections held by the native load generator
(brokerbench m5), then

* CPU per connect while they arrive, and how much of it the cyclic garbage
  collector took (by generation); ``--tuned`` first sets the collector up as
  ``gateway serve`` does (app.tune_collector);
* the objects the collector tracks, per connection, by type;
* under tracemalloc (``--depth 0`` turns it off, for timing), the
  allocations made between "ready" and "N connected", per connection, by the
  allocating line's owner (Trio, stdlib, structlog, gateway, core), by the
  innermost line of gateway or core on the traceback (so a Trio object made for
  one of our calls is charged to that call), and by Trio file.

    PYTHONPATH=. python benchmarks/idle_memory.py --conns 2000 --mqtt-port 62301
    PYTHONPATH=. python benchmarks/idle_memory.py --conns 5000 --depth 0 --tuned
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter, defaultdict

import trio

from gateway import app, config, logs

BROKERBENCH = "/tmp/brokerbench/brokerbench"


class GcTimer:
    """Time spent in the cyclic garbage collector, by generation."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._started
            self.count[info["generation"]] += 1


OWNERS = (("trio/", "trio"), ("<attrs generated methods trio", "trio"), ("/outcome/", "trio"), ("/sniffio/", "trio"),
          ("/structlog/", "structlog"), ("/gateway/", "gateway"), ("/core/", "core"))


def owner(filename: str) -> str:
    for mark, name in OWNERS:
        if mark in filename:
            return name
    return "stdlib" if "/lib/python" in filename else "other"


def _type_counts() -> Counter[str]:
    return Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())


def report(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, conns: int, top: int) -> None:
    stats = after.compare_to(before, "traceback")
    by_owner: dict[str, int] = defaultdict(int)
    by_site: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_caller: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_pair: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for stat in stats:
        frames = list(stat.traceback)[::-1]  # most recent first
        site = frames[0]
        ours = next((f for f in frames if owner(f.filename) in ("gateway", "core")), None)
        by_owner[owner(site.filename)] += stat.size_diff
        key = f"{_short(site.filename)}:{site.lineno}"
        by_site[key][0] += stat.size_diff
        by_site[key][1] += stat.count_diff
        ckey = f"{_short(ours.filename)}:{ours.lineno}" if ours is not None else "(no gateway frame)"
        by_caller[ckey][0] += stat.size_diff
        by_caller[ckey][1] += stat.count_diff
        by_pair[f"{ckey} <- {key}"][0] += stat.size_diff
        by_pair[f"{ckey} <- {key}"][1] += stat.count_diff
    by_file: dict[str, int] = defaultdict(int)
    for key, (size, _) in by_caller.items():
        by_file[key.rsplit(":", 1)[0]] += size
    total = sum(by_owner.values())
    print(f"traced growth: {total / 1024:.0f} KiB for {conns} connections = {total / conns:.0f} B each")
    print("by owner of the allocating line (B per connection):")
    for name, size in sorted(by_owner.items(), key=lambda kv: -kv[1]):
        print(f"  {name:10s} {size / conns:8.0f}")
    print("by innermost gateway/core file, whoever allocated (B per connection):")
    for name, size in sorted(by_file.items(), key=lambda kv: -kv[1]):
        if abs(size) >= conns:
            print(f"  {size / conns:8.0f}  {name}")
    trio_files: dict[str, int] = defaultdict(int)
    for key, (size, _) in by_site.items():
        if owner(key) == "trio":
            trio_files[key.rsplit(":", 1)[0]] += size
    print("Trio's allocations by file (B per connection):")
    for name, size in sorted(trio_files.items(), key=lambda kv: -kv[1]):
        if abs(size) >= conns:
            print(f"  {size / conns:8.0f}  {name}")
    for title, table in (("allocating line", by_site), ("innermost gateway/core line", by_caller),
                         ("gateway/core line <- allocating line", by_pair)):
        print(f"by {title} (B and blocks per connection):")
        for key, (size, count) in sorted(table.items(), key=lambda kv: -kv[1][0])[:top]:
            print(f"  {size / conns:8.0f} {count / conns:6.2f}  {key}")


def _short(filename: str) -> str:
    for mark in ("/site-packages/", "/lib/python3.11/", "/gateway/", "/core/"):
        if mark in filename:
            head = "" if mark in ("/site-packages/", "/lib/python3.11/") else mark.strip("/") + "/"
            return head + filename.split(mark, 1)[1]
    return filename


async def main(args: argparse.Namespace) -> None:
    data = tempfile.mkdtemp(prefix="idle-memory.")
    cfg = config.load(None, {"mqtt_port": args.mqtt_port, "stomp_port": args.mqtt_port - 1,
                             "admin_port": args.mqtt_port + 1, "data_dir": data, "log_level": args.log_level})
    log = logs.configure("console", args.log_level)
    async with trio.open_nursery() as nursery:
        running = await nursery.start(lambda task_status: app.serve(cfg, log, handle_signals=False, task_status=task_status))
        await trio.sleep(0.5)
        gc.collect()
        before = tracemalloc.take_snapshot() if tracemalloc.is_tracing() else None
        types_before = _type_counts()
        if args.tuned:
            app.tune_collector()
        timer = GcTimer()
        gc.callbacks.append(timer)
        cpu = time.process_time()
        bench = subprocess.Popen([args.brokerbench, "m5", "--mqtt-port", str(args.mqtt_port), "--conns", str(args.conns),
                                  "--hold", str(args.hold), "--pid", str(os.getpid())], stdout=subprocess.PIPE)
        while sum(1 for c in running.server.connections.values() if c.io.client is not None) < args.conns:
            await trio.sleep(0.05)
        cpu = time.process_time() - cpu
        gc.callbacks.remove(timer)
        print(f"connect phase: {cpu / args.conns * 1e6:.0f} us CPU per connection, of which gc "
              f"{sum(timer.seconds) / args.conns * 1e6:.0f} us (collections by generation {timer.count}, "
              f"seconds {[round(x, 3) for x in timer.seconds]})")
        await trio.sleep(0.5)
        gc.collect()
        grown = _type_counts()
        grown.subtract(types_before)
        print(f"objects the collector tracks: {sum(grown.values()) / args.conns:.1f} more per connection; by type:")
        print("  " + ", ".join(f"{name} {count / args.conns:.2f}" for name, count in grown.most_common(25)))
        if before is not None:
            report(before, tracemalloc.take_snapshot(), args.conns, args.top)
        await trio.to_thread.run_sync(bench.wait)
        print(bench.stdout.read().decode() if bench.stdout else "", file=sys.stderr)
        running.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conns", type=int, default=2000, help="idle connections to hold")
    parser.add_argument("--hold", type=float, default=6, help="seconds brokerbench holds them")
    parser.add_argument("--mqtt-port", type=int, default=62301, help="also uses the port below (STOMP) and above (admin)")
    parser.add_argument("--top", type=int, default=30, help="lines per table")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--depth", type=int, default=30, help="tracemalloc frames kept; 0: no tracemalloc")
    parser.add_argument("--tuned", action="store_true", help="the collector as gateway serve sets it up")
    parser.add_argument("--brokerbench", default=BROKERBENCH)
    arguments = parser.parse_args()
    if arguments.depth:
        tracemalloc.start(arguments.depth)
    trio.run(main, arguments)
