"""MQTT 5 against MQTT 3.1.1 on the same run, through one Python load generator.

    .venv/bin/python benchmarks/mqtt5.py [--rounds 5] [--qos0-messages 200000]
        [--qos1-messages 100000] [--port 27020] [--brokerbench /tmp/brokerbench/brokerbench]

Shapes, each against a fresh ``gateway serve`` (temporary data folder), one
publisher process -> one subscriber process on one topic, 128-byte payloads:

  3.1.1        the 3.1.1 shape
  5            MQTT 5, PUBLISHes without properties
  5+alias      MQTT 5 with topic aliases both ways: the publisher names the
               topic with alias 1 once and then sends by alias alone; the
               subscriber announces Topic Alias Maximum 16, so the broker's
               deliveries use an alias too

at QoS 0 (the publisher floods) and at QoS 1 (at most 64 unacknowledged, the
subscriber PUBACKs each).  Rounds alternate the shapes (rotated each round,
so drift spreads over all of them); with --brokerbench, its m1 and m2 (the
native 3.1.1 generator, shared/brokerbench) run in the same rounds for
reference.  The generator speaks through the project's sans-IO codec in the
client role over plain sockets, with every PUBLISH encoded before the
release (QoS 1 splices the packet id into a pre-encoded frame), so it is not
what limits the broker.

Numbers: msgs/s = messages received / (last receive - release of the
publisher); broker CPU us/msg = the broker process's utime+stime from
/proc/PID/stat (all its threads) over the run, before the release to after
the last receive and PUBACK, per message received.  The machine is shared:
trust CPU per message over rates, and read the spread (min-max) beside each
median.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.mqtt.codec import packets as p  # noqa: E402
from gateway.mqtt.codec import MqttConnection, Role  # noqa: E402

GATEWAY = str(Path(sys.executable).parent / "gateway")
TOPIC = "bench/v5/t"
BODY = b"x" * 128
WINDOW = 64
BATCH = 1000  # QoS 0 PUBLISHes per write
ALIAS = 1
SUBSCRIBER_ALIASES = 16
TICK_S = os.sysconf("SC_CLK_TCK")
SHAPES = (("3.1.1", 4, False), ("5", 5, False), ("5+alias", 5, True))


class Broker:
    """``gateway serve`` on ``port`` (STOMP and admin on any free port), a
    temporary data folder removed at stop."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.data = tempfile.mkdtemp(prefix="gw-mqtt5-bench-")
        self.proc = subprocess.Popen(
            [GATEWAY, "serve", "--mqtt-port", str(port), "--stomp-port", "0", "--admin-port", "0",
             "--data-dir", self.data, "--log-level", "warning"])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"gateway serve exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise SystemExit("gateway serve did not start listening")

    def cpu_s(self) -> float:
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 3
        return (int(fields[11]) + int(fields[12])) / TICK_S  # utime, stime: fields 14 and 15

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.data, ignore_errors=True)


def connect(port: int, client_id: str, level: int, aliases: int = 0) -> tuple[socket.socket, MqttConnection]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    codec = MqttConnection(Role.CLIENT)
    properties = p.Properties(topic_alias_maximum=aliases) if level == 5 and aliases else None
    sock.sendall(codec.send(p.Connect(client_id, protocol_level=level, properties=properties)))
    packets: list[p.Packet] = []
    while not packets:
        codec.receive_data(sock.recv(4096))
        packets.extend(codec.events())
    ack = packets[0]
    assert isinstance(ack, p.ConnAck) and ack.return_code == 0, ack
    if level == 5 and aliases:  # the broker takes aliases from clients (else this shape is moot)
        assert ack.properties is not None and (ack.properties.topic_alias_maximum or 0) >= ALIAS, ack
    return sock, codec


def subscriber(port: int, level: int, aliases: bool, qos: int, count: int, ready, out) -> None:
    """Receive ``count`` PUBLISHes (PUBACKing QoS 1); report (count, first, last, aliased)."""
    sock, codec = connect(port, "bench-sub", level, SUBSCRIBER_ALIASES if aliases else 0)
    sock.sendall(codec.send(p.Subscribe(1, [(TOPIC, qos)])))
    got = aliased = 0
    first = last = 0.0
    while got < count:
        data = sock.recv(1 << 20)
        if not data:
            break
        now = time.monotonic()
        codec.receive_data(data)
        acks = []
        for packet in codec.events():
            if type(packet) is p.Publish:
                if not got:
                    first = now
                got += 1
                if packet.properties is not None and packet.properties.topic_alias:
                    aliased += 1
                if packet.qos == 1:
                    acks.append(codec.send(p.PubAck(packet.packet_id)))
            elif type(packet) is p.SubAck:
                assert packet.return_codes == [qos], packet
                ready.set()
        if acks:
            sock.sendall(b"".join(acks))
        last = now
    out.put(("sub", got, first, last, aliased))
    sock.close()


def frames(codec: MqttConnection, aliases: bool, qos: int) -> tuple[bytes, bytes, bytes]:
    """(the first PUBLISH, the rest's head, the rest's tail): for QoS 1 the
    packet id goes between head and tail; for QoS 0 the tail is empty."""
    named_props = p.Properties(topic_alias=ALIAS) if aliases else None
    first = codec.send(p.Publish(TOPIC, BODY, qos, packet_id=1 if qos else None, properties=named_props))
    topic = "" if aliases else TOPIC
    if not qos:
        return first, codec.send(p.Publish(topic, BODY, properties=named_props)), b""
    a = codec.send(p.Publish(topic, BODY, 1, packet_id=0x0101, properties=named_props))
    b = codec.send(p.Publish(topic, BODY, 1, packet_id=0x0202, properties=named_props))
    at = next(i for i in range(len(a)) if a[i] != b[i])
    assert a[at:at + 2] == b"\x01\x01" and a[at + 2:] == b[at + 2:]
    return first, a[:at], a[at + 2:]


def publisher(port: int, level: int, aliases: bool, qos: int, count: int, ready, go, out) -> None:
    sock, codec = connect(port, "bench-pub", level)
    first, head, tail = frames(codec, aliases, qos)
    if qos == 0:
        assert count % BATCH == 0
        batches = [first + head * (BATCH - 1)] + [head * BATCH] * (count // BATCH - 1)
    else:  # every packet id's frame, made now: the loop below only joins and writes
        ring = [head + pid.to_bytes(2, "big") + tail for pid in range(1, 65536)]
    ready.set()
    go.wait()
    start = time.monotonic()
    if qos == 0:
        for batch in batches:
            sock.sendall(batch)
    else:
        sent = acked = 0
        while acked < count:
            if sent < count and sent - acked < WINDOW:
                n = min(count, acked + WINDOW) - sent
                out_frames = [ring[(sent + i) % 65535] for i in range(n)]
                if sent == 0:
                    out_frames[0] = first  # packet id 1, naming the topic (and its alias)
                sent += n
                sock.sendall(b"".join(out_frames))
            codec.receive_data(sock.recv(1 << 16))
            for packet in codec.events():
                if type(packet) is p.PubAck:
                    assert packet.reason_code == 0, packet
                    acked += 1
    out.put(("pub", start, time.monotonic()))
    sock.close()


def run_shape(port: int, name: str, level: int, aliases: bool, qos: int, count: int) -> dict:
    broker = Broker(port)
    try:
        out: multiprocessing.Queue = multiprocessing.Queue()
        sub_ready, pub_ready, go = multiprocessing.Event(), multiprocessing.Event(), multiprocessing.Event()
        sub = multiprocessing.Process(target=subscriber, args=(port, level, aliases, qos, count, sub_ready, out))
        sub.start()
        if not sub_ready.wait(30):
            raise SystemExit("the subscriber got no SUBACK")
        pub = multiprocessing.Process(target=publisher, args=(port, level, aliases, qos, count, pub_ready, go, out))
        pub.start()
        if not pub_ready.wait(60):
            raise SystemExit("the publisher did not get ready")
        cpu_before = broker.cpu_s()
        go.set()
        reports = {}
        for _ in range(2):
            report = out.get(timeout=300)
            reports[report[0]] = report
        cpu = broker.cpu_s() - cpu_before
        sub.join(10)
        pub.join(10)
        _, got, _, last, aliased = reports["sub"]
        start = reports["pub"][1]
        return {"shape": f"{name} qos{qos}", "received": got, "expected": count, "aliased": aliased,
                "msgs_per_s": got / (last - start), "cpu_us_per_msg": cpu / max(got, 1) * 1e6}
    finally:
        broker.stop()


def run_brokerbench(path: str, port: int, mode: str, count: int) -> dict:
    broker = Broker(port)
    try:
        result = subprocess.run([path, mode, "--mqtt-port", str(port), "--pid", str(broker.proc.pid),
                                 "--count", str(count)], capture_output=True, text=True, timeout=600)
        line = json.loads(result.stdout.strip().splitlines()[-1])
        got = line["unique"]
        return {"shape": f"brokerbench {mode}", "received": got, "expected": line["expected"], "aliased": 0,
                "msgs_per_s": line["recv_rate"], "cpu_us_per_msg": line["broker_cpu_s"] / max(got, 1) * 1e6}
    finally:
        broker.stop()


def spread(values: list[float], digits: int) -> str:
    return f"{statistics.median(values):,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def table(results: list[dict]) -> str:
    by_shape: dict[str, list[dict]] = {}
    for result in results:
        by_shape.setdefault(result["shape"], []).append(result)
    lines = ["| shape | runs | msgs/s median (min-max) | broker CPU us/msg median (min-max) | CPU vs 3.1.1 |",
             "|---|---|---|---|---|"]
    for shape, runs in by_shape.items():
        cpu = [r["cpu_us_per_msg"] for r in runs]
        base = by_shape.get(f"3.1.1 {shape.rsplit(' ', 1)[-1]}")
        ratio = ""
        if base is not None and not shape.startswith("brokerbench"):
            ratio = f"{statistics.median(cpu) / statistics.median(r['cpu_us_per_msg'] for r in base) - 1:+.0%}"
        lines.append(f"| {shape} | {len(runs)} | {spread([r['msgs_per_s'] for r in runs], 0)} | {spread(cpu, 2)} "
                     f"| {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--qos0-messages", type=int, default=200_000)
    parser.add_argument("--qos1-messages", type=int, default=100_000)
    parser.add_argument("--port", type=int, default=27020, help="the broker's MQTT port (fresh broker per run)")
    parser.add_argument("--brokerbench", help="path of shared/brokerbench's binary: m1 and m2 in the same rounds")
    parser.add_argument("--json", help="write every run's result here")
    args = parser.parse_args(argv)
    print(f"gateway MQTT 5 vs 3.1.1: CPython {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    runs: list[tuple] = [("py", name, level, aliases, qos) for qos in (0, 1) for name, level, aliases in SHAPES]
    if args.brokerbench:
        runs += [("bb", "m1", 0, False, 0), ("bb", "m2", 0, False, 1)]
    results = []
    for round_number in range(args.rounds):
        shift = round_number % len(runs)
        for kind, name, level, aliases, qos in runs[shift:] + runs[:shift]:
            count = args.qos1_messages if qos else args.qos0_messages
            if kind == "py":
                result = run_shape(args.port, name, level, aliases, qos, count)
            else:
                result = run_brokerbench(args.brokerbench, args.port, name, count)
            result["round"] = round_number + 1
            results.append(result)
            print(f"round {round_number + 1} {result['shape']}: {result['received']:,}/{result['expected']:,} "
                  f"({result['aliased']:,} by alias), {result['msgs_per_s']:,.0f} msgs/s, "
                  f"{result['cpu_us_per_msg']:.2f} us/msg broker CPU", flush=True)
    print(table(sorted(results, key=lambda r: (r["shape"].startswith("brokerbench"), r["shape"][-4:], r["shape"]))))
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if all(r["received"] == r["expected"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
