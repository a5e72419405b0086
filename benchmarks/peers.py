"""gateway next to its peers in one sitting, judged by the native load
generator ../shared/brokerbench (stdlib only).

    .venv/bin/python benchmarks/peers.py [--rounds 2] [--scenarios s1,m1,...]
        [--brokers gateway,mosquitto,activemq,rabbitmq] [--json FILE]

Builds brokerbench (``make -C BROKERBENCH_SRC OUT=tmp``) unless --brokerbench
names a binary, then for each round, each scenario and each broker (the broker
order reversed every other round, so no broker always runs first) starts a
fresh broker on free 127.0.0.1 ports with its own config and data in a
temporary folder, runs a short unmeasured warm-up (--warmup) and then one
brokerbench mode against it with ``--pid`` (broker
CPU and RSS from /proc), and stops it.  Brokers: gateway from this checkout
(``python -m gateway serve``), Debian's Mosquitto (MQTT scenarios only;
``persistence false``, no cap on queued QoS 1 messages) and Debian's ActiveMQ
5.17 (``java -jar /usr/share/activemq/bin/activemq.jar`` with a KahaDB store,
STOMP and MQTT connectors, libmqtt-client-java's jars on its classpath, a 1 GiB
heap and a 256 MB memory limit: with Debian's 512 MiB and no limit it runs out of heap in
m1) and Debian's RabbitMQ 3.10 (a node of its own with the STOMP and MQTT
plugins; its Erlang VM is the pid sampled).  Install the peers with ``apt-get
install -y mosquitto activemq libmqtt-client-java rabbitmq-server``; one that is
absent is reported as missing with the reason.  Never a system service: stop any the install started.

The table gives medians over the rounds: msgs/s delivered and, in brackets,
broker CPU microseconds per delivered message; for the paced runs (m4, s4)
latency p50/p99 in us; for m5 the broker's RSS per idle connection and the
connect rate.  The ratio columns are gateway's figure over the peer's.  A run
that lost messages or failed is marked ``!`` and left out of the median.
Every process started is stopped at the end whatever happens, and every wait
is bounded (brokerbench's own --timeout, then a kill).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the checkout, for benchmarks.harness, .load and .scenarios

from benchmarks.harness.broker import ROOT, ScenarioFailed, loadavg, on_sigterm  # noqa: E402
from benchmarks.harness.peer_brokers import ActiveMQ, Gateway, Mosquitto, PeerBroker, RabbitMQ  # noqa: E402

# name -> (label, brokerbench arguments, protocols it needs, kind)
SCENARIOS: dict[str, tuple[str, list[str], set[str], str]] = {
    "m1": ("m1 MQTT QoS0 1->1", ["m1"], {"mqtt"}, "rate"),
    "m2": ("m2 MQTT QoS1 window 64", ["m2"], {"mqtt"}, "rate"),
    "m3": ("m3 MQTT 1->16 deliveries", ["m3"], {"mqtt"}, "rate"),
    "m4": ("m4 MQTT paced 5k/s p50/p99", ["m4"], {"mqtt"}, "paced"),
    "m5": ("m5 5,000 idle MQTT conns", ["m5"], {"mqtt"}, "conns"),
    "s1": ("s1 STOMP queue", ["s1"], {"stomp"}, "rate"),
    "s1w1": ("s1 --window 1 (synchronous producer)", ["s1", "--window", "1"], {"stomp"}, "rate"),
    "s2": ("s2 persistent 8x32 receipted", ["s2"], {"stomp"}, "rate"),
    "s3": ("s3 STOMP topic 1->16", ["s3"], {"stomp"}, "rate"),
    "s4": ("s4 STOMP paced 5k/s p50/p99", ["s4"], {"stomp"}, "paced"),
    "x1": ("x1 MQTT -> STOMP", ["x1"], {"mqtt", "stomp"}, "rate"),
}
BROKERS = ("gateway", "mosquitto", "activemq", "rabbitmq")
# Where the broker and the generator run: (broker CPUs, generator CPUs) for taskset.
# A message that costs one wake-up (s1w1, s4, m4) costs about twice as much when the
# generator runs on another CPU than the broker (a cross-CPU wake-up per message, cold
# caches) as when they share one, for every broker: left free, the scheduler picks
# either, run to run, so compare those scenarios only with a pinned placement.
PLACEMENTS = {"free": (None, None), "same": ("0", "0"), "split": ("0", "1")}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="runs of every scenario per broker (default 2)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated, of {', '.join(SCENARIOS)} (s1w1 = s1 --window 1; default all)")
    parser.add_argument("--brokers", default=",".join(BROKERS), help="comma-separated (default %(default)s)")
    parser.add_argument("--json", metavar="FILE", help="also write every run and the medians as JSON")
    parser.add_argument("--brokerbench", metavar="PATH", help="a built brokerbench binary (default: build one)")
    parser.add_argument("--brokerbench-src", metavar="DIR", default=os.environ.get("BROKERBENCH_SRC"),
                        help="brokerbench's source folder (default: ../shared/brokerbench next to the checkout)")
    parser.add_argument("--bench-args", default="", metavar="ARGS",
                        help="extra brokerbench options for every run, e.g. '--count 50000' for a quick look")
    parser.add_argument("--warmup", type=int, default=20000, metavar="N",
                        help="before each measured run, an unmeasured one of N messages on the same broker "
                             "(the JVM's JIT; paced modes: 2 s; m5: none; 0: off; default %(default)s)")
    parser.add_argument("--gateway-cmd", metavar="CMD",
                        help="gateway's command; {python} {stomp_port} {mqtt_port} {data_dir} are substituted")
    parser.add_argument("--activemq-nio", action="store_true", help="ActiveMQ's stomp+nio / mqtt+nio connectors")
    parser.add_argument("--activemq-heap", default="1G", metavar="SIZE", help="ActiveMQ's -Xms/-Xmx (default 1G)")
    parser.add_argument("--placement", choices=tuple(PLACEMENTS), default="free",
                        help="free: the scheduler's choice; same: broker and generator on CPU 0; "
                             "split: broker on CPU 0, generator on CPU 1 (default %(default)s)")
    parser.add_argument("--start-timeout", type=float, default=60.0, metavar="S",
                        help="a broker must accept connections within S s (default 60)")
    parser.add_argument("--run-timeout", type=float, default=240.0, metavar="S",
                        help="one brokerbench run is killed after S s (default 240)")
    args = parser.parse_args(argv)
    args.scenario_list = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    args.broker_list = [b.strip() for b in args.brokers.split(",") if b.strip()]
    if bad := [s for s in args.scenario_list if s not in SCENARIOS]:
        parser.error(f"unknown scenario(s) {', '.join(bad)}; known: {', '.join(SCENARIOS)}")
    if bad := [b for b in args.broker_list if b not in BROKERS]:
        parser.error(f"unknown broker(s) {', '.join(bad)}; known: {', '.join(BROKERS)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def find_brokerbench_src(given: str | None) -> Path | None:
    candidates = [Path(given)] if given else [ROOT.parent / "shared" / "brokerbench",
                                              ROOT.parent.parent / "shared" / "brokerbench"]
    return next((c for c in candidates if (c / "brokerbench.c").exists()), None)


def build_brokerbench(args: argparse.Namespace, tmp: Path) -> Path:
    if args.brokerbench:
        return Path(args.brokerbench)
    src = find_brokerbench_src(args.brokerbench_src)
    if src is None:
        raise SystemExit("brokerbench's source not found: pass --brokerbench-src DIR or --brokerbench PATH")
    out = tmp / "brokerbench"
    done = subprocess.run(["make", "-C", str(src), f"OUT={out}"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"building brokerbench failed:\n{done.stdout}{done.stderr}")
    return out / "brokerbench"


def make_brokers(args: argparse.Namespace) -> dict[str, PeerBroker]:
    made = {"gateway": lambda: Gateway(args.gateway_cmd), "mosquitto": Mosquitto,
            "activemq": lambda: ActiveMQ(nio=args.activemq_nio, heap=args.activemq_heap), "rabbitmq": RabbitMQ}
    brokers = {name: made[name]() for name in args.broker_list}
    for broker in brokers.values():
        broker.cpus = PLACEMENTS[args.placement][0]
    return brokers


def warmup_args(scenario: str, count: int) -> list[str] | None:
    """brokerbench options for an unmeasured warm-up run (the JVM's JIT), or None."""
    kind, base = SCENARIOS[scenario][3], SCENARIOS[scenario][1]
    if count <= 0 or kind == "conns":
        return None
    if kind == "paced":
        return ["--duration", "2"]
    return ["--count", str(max(1, count // 8) if base[0] == "s2" else count)]  # s2: per publisher, 8 of them


def run_bench(binary: Path, broker: PeerBroker, scenario: str, args: argparse.Namespace,
              extra: list[str] | None = None) -> dict:
    """One brokerbench run against a started broker: its JSON, or an error record."""
    cpus = PLACEMENTS[args.placement][1]
    cmd = ["taskset", "-c", cpus] if cpus else []
    cmd += [str(binary), *SCENARIOS[scenario][1], "--host", "127.0.0.1", "--pid", str(broker.pid)]
    if broker.stomp_port:
        cmd += ["--stomp-port", str(broker.stomp_port)]
    if broker.mqtt_port:
        cmd += ["--mqtt-port", str(broker.mqtt_port)]
    cmd += broker.bench_args + args.bench_args.split() + (extra or [])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout)
    except subprocess.TimeoutExpired:
        return {"ok": 0, "error": f"brokerbench killed after {args.run_timeout:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        return {"ok": 0, "error": f"no JSON from brokerbench (exit {done.returncode}): {done.stderr.strip()[-300:]}"}
    result["command"] = cmd
    return result


def metrics(kind: str, r: dict) -> dict[str, float]:
    """The figures a run contributes to the table."""
    cpu = r.get("broker_cpu_s", -1)
    if kind == "conns":
        return {"kib_per_conn": r.get("broker_rss_kb_per_conn", 0.0), "connect_rate": r.get("connect_rate", 0.0)}
    unique = r.get("unique", 0)
    out = {"cpu_us_per_msg": cpu * 1e6 / unique if unique and cpu >= 0 else float("nan"),
           "rate": r.get("recv_rate", 0.0)}
    if kind == "paced":
        out.update(p50_us=r.get("lat_p50_us", 0.0), p99_us=r.get("lat_p99_us", 0.0))
    return out


def good(kind: str, r: dict) -> bool:
    if not r.get("ok"):
        return False
    if kind == "conns":
        return True
    return not r.get("lost") and not r.get("duplicates")


def one_run(binary: Path, broker: PeerBroker, scenario: str, args: argparse.Namespace) -> dict:
    kind = SCENARIOS[scenario][3]
    record: dict = {"scenario": scenario, "broker": broker.name}
    r: dict = {"ok": 0, "error": "interrupted"}
    try:
        broker.start(args.start_timeout)
        record["broker_command"] = broker.command
        if (warm := warmup_args(scenario, args.warmup)) is not None:
            w = run_bench(binary, broker, scenario, args, warm)
            record["warmup"] = {"ok": w.get("ok"), "error": w.get("error"), "recv_rate": w.get("recv_rate")}
        r = run_bench(binary, broker, scenario, args)
        if broker.proc is not None and broker.proc.poll() is not None:
            r.setdefault("error", "")
            r["ok"] = 0
            r["error"] = (r["error"] + f"; broker exited ({broker.proc.returncode}): {broker.log_tail()}").lstrip("; ")
    except ScenarioFailed as exc:
        r = {"ok": 0, "error": str(exc)}
    finally:
        if not good(kind, r):
            record["broker_log_tail"] = broker.log_tail(20)  # read before stop() removes the folder
        broker.stop()
    record.update(result=r, good=good(kind, r), metrics=metrics(kind, r) if r.get("ok") else {})
    return record


def medians(records: list[dict]) -> dict[str, float]:
    keep = [r["metrics"] for r in records if r["good"]]
    if not keep:
        return {}
    return {k: statistics.median(m[k] for m in keep) for k in keep[0]}


def fmt_k(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def fmt_us(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def cell(kind: str, med: dict[str, float], runs: list[dict], missing: str | None) -> str:
    if missing:
        return "-" if "does not speak" in missing else "missing"
    if not med:
        why = next((r["result"].get("error") or f"lost {r['result'].get('lost')}" for r in runs), "no run")
        return f"failed ({why[:60]})"
    flag = "" if all(r["good"] for r in runs) else " !"
    if kind == "conns":
        return f"{med['kib_per_conn']:.1f} KiB/conn, {fmt_k(med['connect_rate'])} conn/s{flag}"
    if kind == "paced":
        return f"{med['p50_us']:,.0f}/{med['p99_us']:,.0f} us ({fmt_us(med['cpu_us_per_msg'])}){flag}"
    return f"{fmt_k(med['rate'])} ({fmt_us(med['cpu_us_per_msg'])}){flag}"


def ratio(kind: str, g: dict[str, float], p: dict[str, float]) -> str:
    """gateway's figure over the peer's."""
    def r(key: str) -> str:
        return f"{g[key] / p[key]:.2f}x" if p.get(key) and g.get(key) == g.get(key) else "?"
    if not g or not p:
        return "-"
    if kind == "conns":
        return f"KiB/conn {r('kib_per_conn')}, conn/s {r('connect_rate')}"
    if kind == "paced":
        return f"p99 {r('p99_us')}, CPU/msg {r('cpu_us_per_msg')}"
    return f"{r('rate')} msgs/s, CPU/msg {r('cpu_us_per_msg')}"


def table(summary: dict, names: list[str], scenarios: list[str]) -> str:
    peers = [n for n in names if n != "gateway"]
    head = ["scenario", *names, *(f"gateway/{p}" for p in peers if "gateway" in names)]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in scenarios:
        kind = SCENARIOS[s][3]
        row = [SCENARIOS[s][0]] + [summary[s][n]["cell"] for n in names]
        if "gateway" in names:
            row += [ratio(kind, summary[s]["gateway"]["median"], summary[s][p]["median"]) for p in peers]
        rows.append("| " + " | ".join(row) + " |")
    return "\n".join(rows)


def strict(value):
    """``value`` with NaN floats as null, so the JSON file is standard JSON."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strict(v) for v in value]
    return value


def machine() -> dict:
    model = "?"
    try:
        model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("model name")), "?")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version(), "load_average_start": loadavg()}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    brokers = make_brokers(args)
    absent = {n: b.missing() for n, b in brokers.items()}
    info = machine()
    print(f"peers: {info['cpus']} CPUs ({info['cpu_model']}), Linux {info['kernel']}, "
          f"load average {info['load_average_start']}; {args.rounds} round(s); placement {args.placement}")
    for n, b in brokers.items():
        print(f"  {n}: " + (f"MISSING: {absent[n]}" if absent[n] else b.version()))
    records: list[dict] = []
    interrupted = False
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        binary = build_brokerbench(args, Path(tmp))
        try:
            for rnd in range(args.rounds):
                order = list(brokers) if rnd % 2 == 0 else list(reversed(brokers))
                for s in args.scenario_list:
                    for n in order:
                        if absent[n] or brokers[n].missing_for(SCENARIOS[s][2]):
                            continue
                        rec = one_run(binary, brokers[n], s, args)
                        rec["round"] = rnd + 1
                        records.append(rec)
                        m = rec["metrics"]
                        status = "ok" if rec["good"] else f"FAILED: {rec['result'].get('error') or rec['result']}"
                        print(f"  round {rnd + 1} {s:5} {n:10} "
                              + " ".join(f"{k}={v:,.1f}" for k, v in m.items()) + f" [{status}]", flush=True)
        except (KeyboardInterrupt, SystemExit):
            interrupted = True  # one_run's finally has stopped its broker
            print("\ninterrupted: every process this run started has been stopped; partial results follow",
                  file=sys.stderr)
        finally:
            for b in brokers.values():
                b.stop()
    names = list(brokers)
    summary: dict = {}
    for s in args.scenario_list:
        summary[s] = {}
        for n in names:
            runs = [r for r in records if r["scenario"] == s and r["broker"] == n]
            why = absent[n] or brokers[n].missing_for(SCENARIOS[s][2])
            med = medians(runs)
            summary[s][n] = {"median": med, "runs": len(runs), "good_runs": sum(r["good"] for r in runs),
                             "missing": why, "cell": cell(SCENARIOS[s][3], med, runs, why)}
    print(f"\nmedians of {args.rounds} round(s); msgs/s (broker CPU us per delivered message); "
          f"load average at the end {loadavg()}\n")
    print(table(summary, names, args.scenario_list))
    for n in names:
        if absent[n]:
            print(f"\n{n}: missing: {absent[n]}")
    reasons = {summary[s][n]["missing"] for s in args.scenario_list for n in names
               if summary[s][n]["missing"] and not absent[n] and "does not speak" not in summary[s][n]["missing"]}
    for why in sorted(reasons):
        print(f"\nnot run: {why}")
    if args.json:
        doc = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": info, "load_average_end": loadavg(),
               "rounds": args.rounds, "placement": args.placement, "bench_args": args.bench_args, "interrupted": interrupted,
               "brokers": {n: {"missing": absent[n], "version": "" if absent[n] else b.version()}
                           for n, b in brokers.items()},
               "summary": summary, "runs": records}
        Path(args.json).write_text(json.dumps(strict(doc), indent=2, default=str) + "\n")
        print(f"\nresults written to {args.json}")
    if interrupted:
        return 130
    return 0 if all(r["good"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
