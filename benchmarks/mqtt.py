"""MQTT benchmarks against a real broker process.

    .venv/bin/python benchmarks/mqtt.py [--scenario qos0|qos1|fanout|latency|idle|all]
        [--messages N] [--subscribers K] [--rate R] [--seconds S] [--connections C]

Each scenario starts ``gateway serve`` on free loopback ports with a temporary
data folder (default store settings: QoS 1 PUBACKs wait for fdatasync), runs
raw-socket MQTT clients built on the project's codec in the client role with
pre-encoded packets (publisher and subscribers in separate processes), prints
msgs/s, latency percentiles and the broker's RSS, and stops the broker.

qos0     1 publisher -> 1 subscriber, N x 128 B at QoS 0 (default 200,000)
qos1     1 publisher (64 PUBLISHes in flight) -> 1 subscriber (PUBACKs each),
         QoS 1, N messages (default 100,000)
fanout   1 publisher -> K subscribers (default 16) at QoS 0, N messages (50,000)
latency  a publisher paced at R msgs/s (5,000) for S s (10), QoS 0; each
         payload carries its send time; percentiles at the subscriber
idle     C idle connections (5,000): connects/s and the broker's RSS
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.harness.broker import free_port  # noqa: E402
from gateway.mqtt.codec import packets as p  # noqa: E402
from gateway.mqtt.codec import MqttConnection, Role  # noqa: E402

GATEWAY = str(Path(sys.executable).parent / "gateway")
TOPIC = "bench/t"
BODY = b"x" * 128


class Broker:
    def __init__(self) -> None:
        self.port = free_port()
        self.data = tempfile.mkdtemp(prefix="gw-mqtt-bench-")
        self.proc = subprocess.Popen(
            [GATEWAY, "serve", "--stomp-port", "0", "--mqtt-port", str(self.port), "--admin-port", "0", "--data-dir", self.data,
             "--log-level", "warning"],
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            self.stop()
            raise SystemExit("broker did not start")
        self.idle_rss = self.rss()

    def rss(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def peak_rss(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def connect(port: int, client_id: str, keep_alive: int = 0) -> tuple[socket.socket, MqttConnection]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    codec = MqttConnection(Role.CLIENT)
    sock.sendall(codec.send(p.Connect(client_id, keep_alive=keep_alive)))
    codec.receive_data(sock.recv(4))
    (ack,) = list(codec.events())
    assert isinstance(ack, p.ConnAck) and ack.return_code == 0, ack
    return sock, codec


def subscriber(port: int, name: str, qos: int, count: int, ready: multiprocessing.Event, out: multiprocessing.Queue) -> None:
    """Receive ``count`` PUBLISHes (acking QoS 1), report (count, first, last, latencies)."""
    sock, codec = connect(port, name)
    sock.sendall(codec.send(p.Subscribe(1, [(TOPIC, qos)])))
    got = 0
    latencies: list[float] = []
    first = last = 0.0
    subscribed = False
    ready_set = False
    sock.settimeout(60)
    while got < count:
        data = sock.recv(1 << 20)
        if not data:
            break
        now = time.monotonic()
        codec.receive_data(data)
        acks = []
        for packet in codec.events():
            if isinstance(packet, p.SubAck):
                subscribed = True
            elif isinstance(packet, p.Publish):
                if not got:
                    first = now
                got += 1
                if packet.payload[:1] == b"T":
                    latencies.append(now - struct.unpack_from(">d", packet.payload, 1)[0])
                if packet.qos == 1:
                    acks.append(codec.send(p.PubAck(packet.packet_id)))
        if acks:
            sock.sendall(b"".join(acks))
        if subscribed and not ready_set:
            ready.set()
            ready_set = True
        last = now
    out.put((got, first, last, latencies))
    sock.close()


def start_subscribers(port: int, qos: int, count: int, k: int) -> tuple[list[multiprocessing.Process], multiprocessing.Queue]:
    out: multiprocessing.Queue = multiprocessing.Queue()
    procs = []
    for i in range(k):
        ready = multiprocessing.Event()
        proc = multiprocessing.Process(target=subscriber, args=(port, f"sub-{i}", qos, count, ready, out), daemon=True)
        proc.start()
        if not ready.wait(15):
            raise SystemExit("subscriber did not get its SUBACK")
        procs.append(proc)
    return procs, out


def collect(procs: list[multiprocessing.Process], out: multiprocessing.Queue, timeout: float) -> list[tuple]:
    results = []
    for _ in procs:
        results.append(out.get(timeout=timeout))
    for proc in procs:
        proc.join(5)
    return results


def publish_qos0(port: int, count: int) -> float:
    sock, codec = connect(port, "pub")
    batch = codec.send(p.Publish(TOPIC, BODY)) * 1000
    start = time.monotonic()
    for _ in range(count // 1000):
        sock.sendall(batch)
    sock.close()
    return start


def publish_qos1(port: int, count: int, window: int = 64) -> tuple[float, float]:
    sock, codec = connect(port, "pub")
    sent = acked = 0
    start = time.monotonic()
    while acked < count:
        out = []
        while sent < count and sent - acked < window:
            sent += 1
            out.append(codec.send(p.Publish(TOPIC, BODY, 1, packet_id=sent % 65535 + 1)))
        if out:
            sock.sendall(b"".join(out))
        codec.receive_data(sock.recv(1 << 16))
        acked += sum(1 for packet in codec.events() if isinstance(packet, p.PubAck))
    end = time.monotonic()
    sock.close()
    return start, end


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


def run_throughput(name: str, qos: int, count: int, k: int) -> dict:
    broker = Broker()
    try:
        procs, out = start_subscribers(broker.port, qos, count, k)
        if qos == 0:
            start = publish_qos0(broker.port, count)
            publish_end = None
        else:
            start, publish_end = publish_qos1(broker.port, count)
        results = collect(procs, out, 120)
        delivered = sum(r[0] for r in results)
        last = max(r[2] for r in results)
        elapsed = last - start
        line = {
            "scenario": name, "delivered": delivered, "expected": count * k,
            "msgs_per_s": delivered / elapsed, "rss_mib": broker.rss(), "peak_rss_mib": broker.peak_rss(),
        }
        if publish_end is not None:
            line["acked_publish_per_s"] = count / (publish_end - start)
        return line
    finally:
        broker.stop()


def run_latency(rate: int, seconds: float) -> dict:
    broker = Broker()
    try:
        count = int(rate * seconds)
        procs, out = start_subscribers(broker.port, 0, count, 1)
        sock, codec = connect(broker.port, "pub")
        tick = 0.001
        per_tick = rate * tick
        sent = 0
        start = time.monotonic()
        while sent < count:
            due = min(count, int((time.monotonic() - start) / tick * per_tick) + 1)
            frames = []
            while sent < due:
                payload = b"T" + struct.pack(">d", time.monotonic()) + BODY[9:]
                frames.append(codec.send(p.Publish(TOPIC, payload)))
                sent += 1
            if frames:
                sock.sendall(b"".join(frames))
            time.sleep(tick / 2)
        (got, _, _, latencies), = collect(procs, out, 60)
        sock.close()
        return {
            "scenario": "latency", "delivered": got, "expected": count, "msgs_per_s": rate,
            "p50_ms": percentile(latencies, 0.50), "p99_ms": percentile(latencies, 0.99),
            "p999_ms": percentile(latencies, 0.999), "rss_mib": broker.rss(), "peak_rss_mib": broker.peak_rss(),
        }
    finally:
        broker.stop()


def run_idle(connections: int) -> dict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, connections * 2 + 200)), hard))
    broker = Broker()  # inherits the raised limit
    socks = []
    try:
        codec = MqttConnection(Role.CLIENT)
        start = time.monotonic()
        for i in range(connections):
            sock = socket.create_connection(("127.0.0.1", broker.port), timeout=30)
            sock.sendall(codec.send(p.Connect(f"idle-{i}", keep_alive=600)))
            socks.append(sock)
        for sock in socks:
            assert sock.recv(4)[:1] == b"\x20", "no CONNACK"
        elapsed = time.monotonic() - start
        time.sleep(1.0)
        return {
            "scenario": "idle", "connections": connections, "connects_per_s": connections / elapsed,
            "rss_mib": broker.rss(), "idle_rss_mib": broker.idle_rss,
        }
    finally:
        for sock in socks:
            sock.close()
        broker.stop()


def show(result: dict) -> None:
    name = result["scenario"]
    if name == "idle":
        print(f"== idle: {result['connections']:,} MQTT connections: {result['connects_per_s']:,.0f} connects/s, "
              f"broker RSS {result['rss_mib']:.0f} MiB (idle at start {result['idle_rss_mib']:.0f} MiB)")
        return
    ok = "OK" if result["delivered"] == result["expected"] else f"LOST {result['expected'] - result['delivered']:,}"
    extra = ""
    if "acked_publish_per_s" in result:
        extra = f"; publisher saw {result['acked_publish_per_s']:,.0f} PUBACKs/s"
    if "p50_ms" in result:
        extra = f"; latency ms p50 {result['p50_ms']:.3f} p99 {result['p99_ms']:.3f} p99.9 {result['p999_ms']:.3f}"
    print(f"== {name}: {ok}: {result['delivered']:,} delivered, {result['msgs_per_s']:,.0f} msgs/s{extra}; "
          f"broker RSS {result['rss_mib']:.0f} MiB (peak {result['peak_rss_mib']:.0f})")


SCENARIOS = ("qos0", "qos1", "fanout", "latency", "idle")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # benchmarks/run.py passes its own names through: mqtt-qos0 is qos0, mqtt-all is all.
    parser.add_argument("--scenario", default="all", type=lambda name: name.removeprefix("mqtt-"),
                        choices=[*SCENARIOS, "all"])
    parser.add_argument("--messages", type=int, default=0, help="messages per throughput scenario")
    parser.add_argument("--subscribers", type=int, default=16)
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=5000)
    args = parser.parse_args(argv)
    print(f"gateway MQTT benchmark: CPython {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    chosen = SCENARIOS if args.scenario == "all" else (args.scenario,)
    complete = True
    for name in chosen:
        if name == "qos0":
            result = run_throughput("qos0", 0, args.messages or 200_000, 1)
        elif name == "qos1":
            result = run_throughput("qos1", 1, args.messages or 100_000, 1)
        elif name == "fanout":
            result = run_throughput("fanout", 0, args.messages or 50_000, args.subscribers)
        elif name == "latency":
            result = run_latency(args.rate, args.seconds)
        else:
            result = run_idle(args.connections)
        show(result)
        sys.stdout.flush()
        complete = complete and result.get("delivered", 0) == result.get("expected", 0)
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
