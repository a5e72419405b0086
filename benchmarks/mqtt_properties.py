"""What MQTT 5 properties cost the broker's loop (issue 29, item 1).

    .venv/bin/python benchmarks/mqtt_properties.py [--seconds 10] [--attackers 2]
        [--attack dense,wide,over,connect] [--repeats 15] [--skip-flood] [--json FILE]

Two parts (targets: each under 50 ms):

1. In process, sans-IO: the loop CPU of the worst packets within the limits
   of ``[mqtt]`` (defaults), timed from its bytes into the session to its
   deliveries encoded in the subscribers' outboxes (one MQTT 5 and one 3.1.1
   subscriber), median and max of ``--repeats``.  ``publish-at-limits``: 1,024
   properties, 65,536 bytes of User Properties with repeated names (their
   exact list travels as JSON too), every other PUBLISH property, a UTF-8
   payload up to max_packet_bytes (4 MiB); ``publish-dense``: 1,024 User
   Properties of one byte each (the most properties per byte);
   ``connect-at-limits``: a CONNECT without credentials at the preconnect
   limits, its will's properties included, 64 KiB; ``read-of-dense``: one
   read (the transport's RECEIVE_BYTES) of publish-dense packets, the longest
   one connection's pass holds the loop; ``subscribe-at-limits``: a SUBSCRIBE
   of max_topic_filters filters.  Then the attack packets
   of the issue (a 59 KiB CONNECT and a 234 KiB PUBLISH of User Properties,
   and, unless --skip-flood, a 4 MiB one), each refused (0x95) once past a
   limit.  With the code before the fix on PYTHONPATH the same packets show
   what it cost (run that with --skip-flood: the 4 MiB one took minutes).

2. Out of process: ``gateway serve`` (defaults, a temporary data folder),
   ``--attackers`` processes flooding it for ``--seconds``, and a bystander
   client (MQTT 5, QoS 1, publishing every 10 ms to a topic it subscribes to)
   whose round trips (PUBLISH sent -> its copy back) give p50/p99/max, first
   without attackers, then under them.  Attack shapes, taken in turn by each
   attacker: ``dense`` (QoS 0 PUBLISHes of 1,024 one-byte User Properties,
   written as fast as the broker reads), ``wide`` (publish-at-limits without
   the 4 MiB payload), ``over`` (a 4 MiB PUBLISH of User Properties: DISCONNECT
   0x95, then a new connection), ``connect`` (a 59 KiB CONNECT without
   credentials: CONNACK 0x95).

The machine is shared: read the spread beside each median, and the bystander's
round trips beside the baseline's.  Every wait is bounded.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.harness.broker import Broker as BrokerProcess, loadavg  # noqa: E402
from core.broker import Broker  # noqa: E402
from gateway.mqtt.codec import packets as p  # noqa: E402
from gateway.mqtt.codec import MqttConnection, RemoteProtocolError, Role  # noqa: E402
from gateway.mqtt.session import MqttSession, MqttSettings, Registry  # noqa: E402
from gateway.mqtt.codec.wire import remaining_length  # noqa: E402
from gateway.transports.connection import RECEIVE_BYTES  # noqa: E402

SETTINGS = MqttSettings()
# The limits (getattr: the same packets run against the code before them, for contrast).
MAX_PROPERTIES = getattr(SETTINGS, "max_properties", 1024)
MAX_USER_BYTES = getattr(SETTINGS, "max_user_property_bytes", 64 * 1024)
PRE_MAX_PROPERTIES = getattr(SETTINGS, "preconnect_max_properties", 64)
PRE_MAX_USER_BYTES = getattr(SETTINGS, "preconnect_max_user_property_bytes", 8 * 1024)
TOPIC = "bench/props"
TINY = b"\x26\x00\x01k\x00\x01v"  # a User Property ("k", "v"): 7 bytes
ONE_BYTE = b"\x26\x00\x01k\x00\x00"  # ("k", ""): 6 bytes, one byte of name and value
GATEWAY_CMD = f"{sys.executable} -m gateway serve --mqtt-port {{port}} --stomp-port 0 --admin-port 0 " \
              "--data-dir {data_dir} --log-level warning"


# -- packets -------------------------------------------------------------------------


def user(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return b"\x26" + len(raw_name).to_bytes(2, "big") + raw_name + len(raw_value).to_bytes(2, "big") + raw_value


def publish_wire(items: bytes, payload: bytes = b"x", qos: int = 0, topic: str = TOPIC) -> bytes:
    name = topic.encode()
    body = len(name).to_bytes(2, "big") + name + (b"\x00\x01" if qos else b"")
    body += remaining_length(len(items)) + items + payload
    return bytes((0x30 | qos << 1,)) + remaining_length(len(body)) + body


def connect_wire(items: bytes, will_items: bytes | None = None, will_payload: bytes = b"") -> bytes:
    """A v5 CONNECT without user name or password; an empty client id."""
    flags = 0x02 | (0x04 if will_items is not None else 0)
    body = b"\x00\x04MQTT\x05" + bytes((flags,)) + b"\x00\x3c" + remaining_length(len(items)) + items + b"\x00\x00"
    if will_items is not None:
        body += remaining_length(len(will_items)) + will_items + b"\x00\x04will"
        body += len(will_payload).to_bytes(2, "big") + will_payload
    return b"\x10" + remaining_length(len(body)) + body


def at_limits_items() -> bytes:
    """1,024 properties: the five other PUBLISH properties and 1,019 User
    Properties of 65,536 bytes, names repeating."""
    others = (b"\x01\x01" + b"\x02\x00\x00\x0e\x10" + b"\x03\x00\x10application/json"
              + b"\x08\x00\x09replies/1" + b"\x09\x00\x04\x00\xffid")
    n = MAX_PROPERTIES - 5
    each = MAX_USER_BYTES // n
    pairs = [(f"h{i % 10}", "v" * (each - 2)) for i in range(n)]
    spare = MAX_USER_BYTES - sum(len(k) + len(v) for k, v in pairs)
    pairs[-1] = (pairs[-1][0], pairs[-1][1] + "v" * spare)
    assert sum(len(k) + len(v) for k, v in pairs) == MAX_USER_BYTES
    return others + b"".join(user(k, v) for k, v in pairs)


def publish_at_limits(full_payload: bool = True) -> bytes:
    items = at_limits_items()
    head = len(publish_wire(items, b"", qos=1)) + 8  # the remaining length may grow by a byte or two
    size = SETTINGS.max_packet_bytes - head if full_payload else 1024
    return publish_wire(items, b"u" * size, qos=1)


def publish_dense() -> bytes:
    return publish_wire(ONE_BYTE * MAX_PROPERTIES)


def connect_at_limits() -> bytes:
    n = PRE_MAX_PROPERTIES
    own, will = n // 2, n - n // 2
    budget = PRE_MAX_USER_BYTES
    big = budget - 2 * (n - 2)  # two properties carry what the one-byte ones leave
    items = user("a", "v" * (big // 2 - 1)) + TINY * (own - 1)
    will_items = user("b", "v" * (big - big // 2 - 1)) + TINY * (will - 1)
    head = len(connect_wire(items, will_items)) + 4
    return connect_wire(items, will_items, b"w" * (SETTINGS.preconnect_max_packet_bytes - head))


# -- part 1: in process ----------------------------------------------------------------


class Clock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall_ms(self) -> int:
        return int(time.time() * 1000)


class Log:
    def bind(self, **_: Any) -> Log:
        return self

    def info(self, *_: Any, **__: Any) -> None:
        pass

    warning = error = debug = info


class World:
    """A core broker (no store) and MQTT sessions on it, sans-IO."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.broker = Broker(self.clock)
        self.registry = Registry()
        self.made = 0

    def session(self) -> MqttSession:
        self.made += 1
        return MqttSession(self.broker, self.clock, SETTINGS, self.registry, conn_id=f"m{self.made}", log=Log())

    def connected(self, level: int, topic: str | None = None) -> tuple[MqttSession, MqttConnection]:
        session, client = self.session(), MqttConnection(Role.CLIENT)
        session.skeleton.receive_data(client.send(p.Connect(f"c{self.made}", protocol_level=level)))
        if topic is not None:
            session.skeleton.receive_data(client.send(p.Subscribe(1, [(topic, 0)])))
        self.drain(session)
        return session, client

    @staticmethod
    def drain(session: MqttSession) -> int:
        n = 0
        while data := session.outbox.drain(1 << 62):
            session.skeleton.on_drained()
            n += len(data)
        return n


def timed(world: World, publisher: MqttSession, wire: bytes, readers: list[MqttSession]) -> float:
    start = time.process_time()
    publisher.skeleton.receive_data(wire)
    spent = time.process_time() - start
    for reader in readers:
        world.drain(reader)
    world.drain(publisher)
    return spent


def in_process(repeats: int, flood: bool) -> dict[str, Any]:
    world = World()
    readers = [world.connected(5, TOPIC)[0], world.connected(4, TOPIC)[0]]
    results: dict[str, Any] = {}

    def report(name: str, samples: list[float], outcome: str) -> None:
        ms = sorted(s * 1000 for s in samples)
        results[name] = {"median_ms": round(statistics.median(ms), 2), "max_ms": round(ms[-1], 2), "runs": len(ms),
                         "outcome": outcome}
        print(f"  {name:<22} median {results[name]['median_ms']:8.2f} ms   max {results[name]['max_ms']:8.2f} ms"
              f"   ({len(ms)} runs; {outcome})", flush=True)

    print("worst packets within the limits (decode + handle + deliveries encoded):")
    for name, wire in (("publish-at-limits", publish_at_limits()), ("publish-dense", publish_dense())):
        publisher, _ = world.connected(5)
        samples = []
        for _ in range(repeats):
            samples.append(timed(world, publisher, wire, readers))
            assert not publisher.closed, publisher.close_reason
        report(name, samples, f"{len(wire):,} bytes, delivered")
    # One read's worth of the densest packets: what one pass of one connection
    # holds the loop for, however many packets it brings (no subscriber).
    publisher, _ = world.connected(5)
    dense = publish_wire(ONE_BYTE * MAX_PROPERTIES, topic="bench/nobody")
    wire = dense * (RECEIVE_BYTES // len(dense))
    samples = [timed(world, publisher, wire, []) for _ in range(repeats)]
    report("read-of-dense", samples, f"one {RECEIVE_BYTES // 1024} KiB read: {len(wire) // len(dense)} packets")
    # A SUBSCRIBE of max_topic_filters filters, made anew each time (the
    # first 1,000 become subscriptions, max_subscriptions_per_client).
    limit = getattr(SETTINGS, "max_topic_filters", 1024)
    samples = []
    for run in range(repeats):
        session, _ = world.connected(5)
        filters = b"".join(len(f).to_bytes(2, "big") + f + b"\x01"
                           for f in (f"bench/{run}/{i}/+".encode() for i in range(limit)))
        body = b"\x00\x01\x00" + filters
        samples.append(timed(world, session, b"\x82" + remaining_length(len(body)) + body, []))
        assert not session.closed, session.close_reason
        session.close("done")
    report("subscribe-at-limits", samples, f"{limit} filters, answered")
    samples = []
    wire = connect_at_limits()
    for _ in range(repeats):
        session = world.session()
        samples.append(timed(world, session, wire, []))
        assert session.client is not None, session.close_reason  # accepted
        session.close("done")
    report("connect-at-limits", samples, f"{len(wire):,} bytes, accepted")

    print("attack packets:")
    attacks = [("connect-59KiB", connect_wire(TINY * 8600), True),
               ("publish-234KiB", publish_wire(TINY * (234 * 1024 // 7)), False)]
    if flood:
        attacks.append(("publish-4MiB", publish_wire(TINY * 580_000), False))
    for name, wire, is_connect in attacks:
        samples = []
        outcome = ""
        for _ in range(max(3, repeats // 3)):
            session = world.session() if is_connect else world.connected(5)[0]
            samples.append(timed(world, session, wire, []))
            outcome = f"{len(wire):,} bytes, " + (f"refused: {session.close_reason}" if session.closed else "accepted")
            session.close("done")
        report(name, samples, outcome)
    return results


# -- part 2: out of process --------------------------------------------------------------


class Client:
    """A raw MQTT 5 socket on the project's codec (client role)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.codec = MqttConnection(Role.CLIENT)
        self.packets: list[p.Packet] = []

    def connect(self, client_id: str) -> None:
        self.sock.sendall(self.codec.send(p.Connect(client_id, protocol_level=5)))
        ack = self.next()
        assert isinstance(ack, p.ConnAck) and ack.return_code == 0, ack

    def next(self, timeout: float = 10.0) -> p.Packet | None:
        """The next packet, or None at EOF (or a refusal the codec raised)."""
        deadline = time.monotonic() + timeout
        while not self.packets:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no packet in time")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 16)
            except ConnectionResetError:
                data = b""
            if not data:
                return None
            self.codec.receive_data(data)
            try:
                self.packets.extend(self.codec.events())
            except RemoteProtocolError:
                return None
        return self.packets.pop(0)

    def close(self) -> None:
        self.sock.close()


def attacker(port: int, shapes: list[str], until: float, index: int, out: Any) -> None:
    counts = dict.fromkeys(shapes, 0)  # connections made for each shape
    refused = 0
    dense, wide, over = publish_dense(), publish_at_limits(full_payload=False), publish_wire(TINY * 580_000)
    connect = connect_wire(TINY * 8600)
    turn = 0
    while time.monotonic() < until:
        shape = shapes[turn % len(shapes)]
        turn += 1
        stop = min(until, time.monotonic() + 1.0)  # each shape for a second, then the next
        while time.monotonic() < stop:
            try:
                client = Client(port)
                if shape == "connect":
                    client.sock.sendall(connect)
                    client.codec.protocol_level = 5  # sent by hand: a v5 CONNACK comes back
                    ack = client.next()
                    refused += isinstance(ack, p.ConnAck) and ack.return_code == 0x95
                else:
                    client.connect(f"attacker-{index}-{turn}")
                    if shape == "over":
                        client.sock.sendall(over)
                        while (packet := client.next()) is not None:
                            refused += isinstance(packet, p.Disconnect) and packet.reason_code == 0x95
                    else:
                        burst = (dense if shape == "dense" else wide) * 20
                        while time.monotonic() < stop:
                            client.sock.sendall(burst)
                counts[shape] += 1
                client.close()
            except OSError:
                pass
    out.put({"attacker": index, "rounds": counts, "refused_0x95": refused})


def round_trips(port: int, seconds: float) -> list[float]:
    client = Client(port)
    client.connect("bystander")
    client.sock.sendall(client.codec.send(p.Subscribe(1, [("calm", 1)])))
    assert isinstance(client.next(), p.SubAck)
    out: list[float] = []
    until = time.monotonic() + seconds
    packet_id = 0
    while time.monotonic() < until:
        packet_id = packet_id % 65535 + 1
        start = time.monotonic()
        client.sock.sendall(client.codec.send(p.Publish("calm", str(packet_id).encode(), 1, packet_id=packet_id)))
        back = acked = False
        while not (back and acked):
            packet = client.next()
            if isinstance(packet, p.Publish):
                back = True
                client.sock.sendall(client.codec.send(p.PubAck(packet.packet_id)))  # type: ignore[arg-type]
            elif isinstance(packet, p.PubAck):
                acked = True
            elif packet is None:
                raise SystemExit("the broker closed the bystander's connection")
        out.append(time.monotonic() - start)
        time.sleep(0.01)
    client.close()
    return out


def summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {"n": len(ms), "p50_ms": round(ms[len(ms) // 2], 2), "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
            "max_ms": round(ms[-1], 2)}


def out_of_process(seconds: float, attackers: int, shapes: list[str]) -> dict[str, Any]:
    broker = BrokerProcess(GATEWAY_CMD)
    results: dict[str, Any] = {}
    procs: list[multiprocessing.Process] = []
    try:
        broker.start(time.monotonic() + 30)
        baseline = summary(round_trips(broker.port, min(3.0, seconds)))
        print(f"bystander round trip, no attackers: {baseline}", flush=True)
        queue: Any = multiprocessing.Queue()
        until = time.monotonic() + seconds
        cpu0 = broker.cpu()
        for i in range(attackers):
            proc = multiprocessing.Process(target=attacker, args=(broker.port, shapes, until, i, queue), daemon=True)
            proc.start()
            procs.append(proc)
        time.sleep(0.2)  # the attackers under way
        flooded = summary(round_trips(broker.port, seconds - 0.4))
        reports = [queue.get(timeout=30) for _ in procs]
        cpu = broker.cpu() - cpu0
        print(f"bystander round trip, {attackers} attackers ({','.join(shapes)}): {flooded}", flush=True)
        print(f"attackers: {reports}; broker CPU {cpu:.1f} s over {seconds:.0f} s; load {loadavg()}", flush=True)
        results = {"baseline": baseline, "flooded": flooded, "attackers": reports, "broker_cpu_s": round(cpu, 1)}
    finally:
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
        broker.stop()
        broker.cleanup()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--attackers", type=int, default=2)
    parser.add_argument("--attack", default="dense,wide,over,connect")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--skip-flood", action="store_true", help="no 4 MiB PUBLISH in part 1")
    parser.add_argument("--in-process-only", action="store_true")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    results: dict[str, Any] = {"in_process": in_process(args.repeats, not args.skip_flood)}
    if not args.in_process_only:
        results["out_of_process"] = out_of_process(args.seconds, args.attackers, args.attack.split(","))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
