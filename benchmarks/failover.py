"""Failover benchmark: a real ZooKeeper and 3 ``gateway serve`` nodes with
[ha] tables on 127.0.0.1, the primary SIGKILLed at a random moment, round
after round, under receipted persistent load (stdlib only).

    .venv/bin/python benchmarks/failover.py [--rounds 20] [--seed S] [--json FILE]
    .venv/bin/python benchmarks/run.py --scenario failover [...]   (the same)

Load: ``--producers`` (8) threads send receipted persistent SENDs to
/queue/failover, at most ``--window`` (32) receipts outstanding each; one
consumer (ack:client-individual) ACKs every message with a receipt.  Every
client reconnects through the node list (only the primary listens for
clients); a producer sends its unreceipted messages again after a reconnect.

1. Steady: once the cluster is up (one primary, two backups in sync), the
   receipted msgs/s over ``--steady-seconds`` (sync_replicas = 1).
2. Rounds: after a random pause (seeded), SIGKILL the primary (``--faults
   kill``), or cut its backups' links to it silently while every node keeps
   ZooKeeper (``cut``: each node's replication port sits behind a proxy,
   benchmarks/harness/link_proxy.py; the primary must step down); ``kill,cut``
   alternates; ``stop`` SIGSTOPs the primary past its session timeout and
   then wakes it (it must fence itself); ``flap`` cuts and heals its links
   every second for 12 s (reported: the longest time without a receipt).
   The failover time runs from the fault to the first receipt
   on a connection made after it (the new primary's, confirmed by its
   backup); then the killed node is restarted (as a supervisor would), or
   the cut heals, and the round ends once the old primary is a backup in
   sync again.  A node that exits on its own is restarted too (counted).
3. Drain: producers stop and wait for their receipts; the consumer reads on
   until it has every receipted message (bounded), so "lost" is exact.
4. Single node: the same load against a plain ``gateway serve`` (no [ha]) on
   the same machine, the same steady measurement.

Reported: receipted, lost (receipted, never delivered: must be 0), acked
then redelivered (delivered again after its ACK's receipt: must be 0),
other redeliveries and resent copies (allowed, counted), failover time (p50,
max), and replicated next to single-node throughput.  Exit status 0 only if
both must-be-zero counts are zero and every round failed over.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the checkout, for benchmarks.harness, .load and .scenarios

from benchmarks.harness.broker import ScenarioFailed, loadavg, on_sigterm  # noqa: E402
from benchmarks.harness.ha_cluster import Cluster, HaNode, SingleNode, zookeeper_unavailable  # noqa: E402
from benchmarks.load.failover_clients import (  # noqa: E402
    Consumer, Producer, first_receipt_after, receipted_between)

WAIT_S = 120.0  # any wait for the cluster to settle (a loaded two-core machine)
FAULTS = ("kill", "cut", "stop", "flap")
FAULT_NAMES = {"kill": "primary SIGKILLed", "cut": "primary cut from its backups",
               "stop": "primary SIGSTOPped past its session", "flap": "links flapping (longest stall)"}
FLAP_CYCLES = 6  # a flap round: the primary's links cut for 1 s, healed for 1 s, this many times


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=("failover",), default="failover", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=20, help="primary kills or cuts (default 20)")
    parser.add_argument("--faults", default="kill", metavar="LIST",
                        help="what each round does to the primary, in turn: kill (SIGKILL), cut (its backups' links "
                             "to it cut silently, ZooKeeper still reached), stop (SIGSTOP past its session timeout, "
                             "then SIGCONT), flap (its links cut 1 s / healed 1 s, 6 times), e.g. kill,cut "
                             "(default kill)")
    parser.add_argument("--seed", type=int, default=None, help="for the pauses before each kill (default: random)")
    parser.add_argument("--producers", type=int, default=8, help="producer connections (default 8)")
    parser.add_argument("--window", type=int, default=32, help="outstanding receipts per producer (default 32)")
    parser.add_argument("--session-timeout", type=float, default=3.0, metavar="S",
                        help="[ha] zookeeper_session_timeout_s (default 3)")
    parser.add_argument("--steady-seconds", type=float, default=10.0, metavar="S",
                        help="length of each throughput measurement (default 10)")
    parser.add_argument("--pause", type=float, nargs=2, default=(1.0, 4.0), metavar=("MIN", "MAX"),
                        help="seconds of load between a steady cluster and the next kill (default 1 4)")
    parser.add_argument("--drain-timeout", type=float, default=120.0, metavar="S",
                        help="the consumer's bound to receive every receipted message (default 120)")
    parser.add_argument("--no-single", action="store_true", help="skip the single-node comparison")
    parser.add_argument("--keep", action="store_true", help="keep the data and log folder")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.rounds < 0 or args.producers <= 0 or args.window <= 0 or args.steady_seconds <= 0:
        parser.error("--rounds must be >= 0; --producers, --window, --steady-seconds > 0")
    args.faults = args.faults.split(",")
    if not args.faults or set(args.faults) - set(FAULTS):
        parser.error(f"--faults takes a comma-separated list of {', '.join(FAULTS)}")
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    return args


class Load:
    """The producers and the consumer against a node list."""

    def __init__(self, ports: list[int], args: argparse.Namespace, deadline: float) -> None:
        self.began = time.monotonic()
        self.consumer = Consumer(ports, deadline)
        self.producers = [Producer(i, ports, deadline, args.window) for i in range(args.producers)]

    def start(self) -> None:
        self.consumer.start()
        for producer in self.producers:
            producer.start()

    def wait_flowing(self, since: float, timeout: float = WAIT_S, tick=lambda: None) -> float:
        """When the first receipt came on a link made after ``since``; ``tick`` is called meanwhile."""
        deadline = time.monotonic() + timeout
        while (first := first_receipt_after(self.producers, since)) is None:
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"no receipt within {timeout} s; client errors: {self.errors()}")
            tick()
            time.sleep(0.05)
        return first

    def throughput(self, seconds: float) -> float:
        start = time.monotonic()
        time.sleep(seconds)
        return receipted_between(self.producers, start, start + seconds) / seconds

    def drain(self, timeout: float, tick=lambda: None) -> bool:
        """Producers stop and wait for their receipts; the consumer reads on until
        every receipted message came; False if that took longer than ``timeout``."""
        start = time.monotonic()
        for producer in self.producers:
            producer.draining.set()
        for producer in self.producers:
            while producer.is_alive() and time.monotonic() < start + timeout / 2:
                tick()
                producer.join(0.2)
            producer.stop.set()
        for producer in self.producers:
            producer.join(5)
        receipted = self.receipted()
        drained = False
        while not drained and time.monotonic() < start + timeout:
            tick()
            drained = receipted <= set(self.consumer.deliveries)
            time.sleep(0.1)
        time.sleep(0.5)  # any late redelivery of something acked still counts
        self.stop()
        return drained

    def stop(self) -> None:
        for client in [*self.producers, self.consumer]:
            client.stop.set()
        for client in [*self.producers, self.consumer]:
            client.join(5)

    def receipted(self) -> set[tuple[int, int, int]]:
        return set().union(*(p.receipted for p in self.producers))

    def errors(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for client in [*self.producers, self.consumer]:
            for reason, count in client.errors.items():
                out[reason] = out.get(reason, 0) + count
        return out

    def tally(self) -> dict:
        receipted = self.receipted()
        deliveries = self.consumer.deliveries
        lost = sorted(receipted - set(deliveries))
        copies: dict[tuple[int, int], int] = {}
        for producer, seq, _attempt in deliveries:
            copies[producer, seq] = copies.get((producer, seq), 0) + 1
        return {
            "receipted": len(receipted),
            "delivered": sum(deliveries.values()),
            "lost": len(lost),
            "lost_examples": [list(k) for k in lost[:10]],
            "acked_then_redelivered": len(self.consumer.acked_then_redelivered),
            "acked_then_redelivered_examples": [list(k) for k, _, _ in self.consumer.acked_then_redelivered[:10]],
            # (ACK receipted at, from port, delivered again at, on port), times since the run began
            "acked_then_redelivered_when": sorted({(round(a - self.began, 2), ap, round(d - self.began, 2), dp)
                                                   for _, (a, ap), (d, dp) in self.consumer.acked_then_redelivered})[:20],
            "redelivered_unacked": self.consumer.redelivered,
            "resent_copies_delivered": sum(n - 1 for n in copies.values()),
            "acks_receipted": len(self.consumer.acked),
            "client_errors": self.errors(),
        }


def fail_over(cluster: Cluster, load: Load, primary: HaNode, session_timeout_s: float) -> float:
    """SIGKILL ``primary``; seconds until the first receipt on a link made after
    the kill.  The killed node is restarted (as a supervisor would) once
    another node is ready, or after twice the session timeout whatever happens
    (a backup that lost its own session meanwhile may be the only other one)."""
    killed_at = time.monotonic()
    cluster.kill_node(primary)

    def tick() -> None:
        cluster.supervise()
        if primary.node_id in cluster.down:
            ready = cluster.primary()
            if (ready is not None and ready is not primary) or time.monotonic() > killed_at + 2 * session_timeout_s:
                cluster.restart_node(primary)

    try:
        return load.wait_flowing(killed_at, WAIT_S, tick) - killed_at
    finally:
        if primary.node_id in cluster.down:
            cluster.restart_node(primary)


def cut_off(cluster: Cluster, load: Load, primary: HaNode) -> float:
    """Cut ``primary``'s backups' links to it (its proxy), leaving its
    ZooKeeper session alone; seconds until the first receipt on a link made
    after the cut.  It must step down for a backup to lead
    (gateway/ha/isolation.py).  The cut heals once another node is ready,
    and the old primary follows it (only links to it were cut)."""
    cut_at = time.monotonic()
    primary.proxy.cut()
    try:
        return load.wait_flowing(cut_at, WAIT_S, cluster.supervise) - cut_at
    finally:
        primary.proxy.heal()


def freeze(cluster: Cluster, load: Load, primary: HaNode, session_timeout_s: float) -> float:
    """SIGSTOP ``primary`` past its session timeout, then SIGCONT it (it must
    fence itself and rejoin as a backup, releasing no receipt on waking);
    seconds until the first receipt on a link made after the stop."""
    assert primary.proc is not None
    stopped_at = time.monotonic()
    primary.proc.send_signal(signal.SIGSTOP)
    try:
        first = load.wait_flowing(stopped_at, WAIT_S, cluster.supervise) - stopped_at
        time.sleep(max(0.0, stopped_at + 2 * session_timeout_s - time.monotonic()))
        return first
    finally:
        primary.proc.send_signal(signal.SIGCONT)


def flap(cluster: Cluster, load: Load, primary: HaNode) -> float:
    """Cut the primary's links for 1 s and heal them for 1 s, :data:`FLAP_CYCLES`
    times; the longest time without any receipt from the first cut until
    5 s after the last heal (a failover, should one happen, included)."""
    began = time.monotonic()
    for _ in range(FLAP_CYCLES):
        primary.proxy.cut()
        time.sleep(1.0)
        primary.proxy.heal()
        time.sleep(1.0)
    end = time.monotonic() + 5.0
    while time.monotonic() < end:
        cluster.supervise()
        time.sleep(0.1)
    times = sorted(t for p in load.producers for t in list(p.receipt_times) if began <= t <= end)
    marks = [began, *times, end]
    return max(b - a for a, b in zip(marks, marks[1:]))


def run_cluster(args: argparse.Namespace, folder: Path) -> dict:
    rng = random.Random(args.seed)
    cluster = Cluster(folder / "cluster", 3, args.session_timeout)
    load: Load | None = None
    result: dict = {"rounds": [], "session_timeout_s": args.session_timeout, "seed": args.seed}
    try:
        cluster.start()
        cluster.wait_steady(WAIT_S)
        load = Load(cluster.stomp_ports, args, time.monotonic() + 24 * 3600)
        load.start()
        result["stomp_ports"] = {n.node_id: n.stomp_port for n in cluster.nodes}
        load.wait_flowing(0.0, WAIT_S, cluster.supervise)
        time.sleep(1.0)  # past the first connections' start
        result["throughput"] = load.throughput(args.steady_seconds)
        print(f"replicated throughput: {result['throughput']:,.0f} receipted msgs/s", flush=True)
        for index in range(args.rounds):
            time.sleep(rng.uniform(*args.pause))
            primary = cluster.wait_steady(WAIT_S)
            fault = args.faults[index % len(args.faults)]
            began = time.monotonic()
            round_: dict = {"round": index + 1, "fault": fault, "primary": primary.node_id,
                            "at": round(began - load.began, 2)}
            if fault == "kill":
                round_["failover_s"] = fail_over(cluster, load, primary, args.session_timeout)
            elif fault == "cut":
                round_["failover_s"] = cut_off(cluster, load, primary)
            elif fault == "stop":
                round_["failover_s"] = freeze(cluster, load, primary, args.session_timeout)
            else:
                round_["failover_s"] = flap(cluster, load, primary)
            new = cluster.wait_steady(WAIT_S)
            round_["steady_s"] = time.monotonic() - began
            round_["new_primary"] = new.node_id
            result["rounds"].append(round_)
            what = "longest stall" if fault == "flap" else "first receipt after"
            print(f"round {index + 1:>3}: {fault} {primary.node_id}, {new.node_id} primary, {what} "
                  f"{round_['failover_s']:.2f} s, steady again after {round_['steady_s']:.1f} s", flush=True)
    except ScenarioFailed as exc:
        result["error"] = str(exc).splitlines()[0]
        print(f"FAILED: {exc}", file=sys.stderr)
        for node in cluster.nodes:  # so the drain can still count what is lost
            if node.node_id in cluster.down:
                cluster.restart_node(node)
    try:
        if load is not None:
            result["drained"] = load.drain(args.drain_timeout, cluster.supervise)
            result.update(load.tally())
        result["node_restarts"] = cluster.restarts
    finally:
        if load is not None:
            load.stop()
        cluster.kill()
    return result


def run_single(args: argparse.Namespace, folder: Path) -> dict:
    node = SingleNode(folder)
    load: Load | None = None
    result: dict = {}
    try:
        node.start()
        load = Load([node.stomp_port], args, time.monotonic() + 3600)
        load.start()
        load.wait_flowing(0.0)
        time.sleep(1.0)
        result["throughput"] = load.throughput(args.steady_seconds)
        print(f"single-node throughput: {result['throughput']:,.0f} receipted msgs/s", flush=True)
        result["drained"] = load.drain(args.drain_timeout)
        result.update(load.tally())
    except ScenarioFailed as exc:
        result["error"] = str(exc).splitlines()[0]
        print(f"FAILED (single node): {exc}", file=sys.stderr)
    finally:
        if load is not None:
            load.stop()
        node.kill()
    return result


def summary(result: dict) -> list[tuple[str, str]]:
    times = [r["failover_s"] for r in result["cluster"]["rounds"] if "failover_s" in r]
    cluster, single = result["cluster"], result.get("single", {})
    by_fault = {fault: [r["failover_s"] for r in cluster["rounds"] if r.get("fault") == fault and "failover_s" in r]
                for fault in FAULTS}
    done = ", ".join(f"{len(t)} {FAULT_NAMES[f]}" for f, t in by_fault.items() if t)
    rows = [
        ("rounds done", f"{len(times)} of {result['rounds_asked']}" + (f" ({done})" if done else "")),
        ("ZooKeeper session timeout", f"{cluster['session_timeout_s']:g} s"),
        ("messages receipted", f"{cluster.get('receipted', 0):,}"),
        ("lost (must be 0)", f"{cluster.get('lost', '?')}" + ("" if cluster.get("drained") else
                                                              " (the drain did not finish: an upper bound)")),
        ("acked then redelivered (must be 0)", f"{cluster.get('acked_then_redelivered', '?')}"),
        ("redelivered, ACK not receipted", f"{cluster.get('redelivered_unacked', 0):,}"),
        ("resent copies delivered", f"{cluster.get('resent_copies_delivered', 0):,}"),
        *((f"{'receipts stalled' if f == 'flap' else 'failover'} p50 / max, {FAULT_NAMES[f]}",
           f"{statistics.median(t):.2f} s / {max(t):.2f} s")
          for f, t in by_fault.items() if t),
        ("throughput, 3 nodes, sync_replicas=1", f"{cluster.get('throughput', 0):,.0f} msgs/s"),
    ]
    if single:
        rows.append(("throughput, single node", f"{single.get('throughput', 0):,.0f} msgs/s"))
        if single.get("throughput"):
            rows.append(("replicated / single", f"{cluster.get('throughput', 0) / single['throughput']:.2f}"))
    if cluster.get("node_restarts"):
        rows.append(("nodes that exited on their own (restarted)", str(cluster["node_restarts"])))
    if cluster.get("error"):
        rows.append(("stopped early", cluster["error"][:100]))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    reason = zookeeper_unavailable()
    if reason is not None:
        print(f"failover benchmark skipped: {reason}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(f"gateway failover benchmark: {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load average {loadavg()}; seed {args.seed}, {args.rounds} rounds, "
          f"{args.producers} producers x window {args.window}, ZooKeeper session timeout {args.session_timeout:g} s",
          flush=True)
    folder = Path(tempfile.mkdtemp(prefix="gateway-failover-"))
    print(f"data and logs in {folder} ({'kept' if args.keep else 'removed at the end'})", flush=True)
    result: dict = {"rounds_asked": args.rounds}
    try:
        result["cluster"] = run_cluster(args, folder)
        if not args.no_single:
            result["single"] = run_single(args, folder)
    except (KeyboardInterrupt, SystemExit) as exc:
        print("\ninterrupted; every process this run started has been stopped", file=sys.stderr)
        code = 130 if isinstance(exc, KeyboardInterrupt) else exc.code
        return code if isinstance(code, int) else 1
    finally:
        if args.keep:
            print(f"data and logs kept in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    cluster = result["cluster"]
    ok = bool("error" not in cluster and cluster.get("drained") and cluster.get("lost") == 0
              and cluster.get("acked_then_redelivered") == 0 and len(cluster["rounds"]) == args.rounds
              and "error" not in result.get("single", {}))
    result["ok"] = ok
    print()
    rows = summary(result)
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    if cluster.get("lost") or cluster.get("acked_then_redelivered"):
        print(f"  examples: lost {cluster['lost_examples']}, acked then redelivered "
              f"{cluster['acked_then_redelivered_examples']} (producer, seq, attempt)")
    if cluster.get("client_errors"):
        print(f"  client reconnect reasons: {cluster['client_errors']}")
    print("OK" if ok else "FAILED")
    if args.json:
        result.update(python=platform.python_version(), cpus=os.cpu_count(), time=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        Path(args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"results written to {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
