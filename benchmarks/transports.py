"""STOMP and MQTT over each transport the broker offers: plain TCP, TLS,
WebSocket (the admin port's ``/stomp`` and ``/mqtt``) and WebSocket over TLS.

    .venv/bin/python benchmarks/transports.py [--messages N] [--rate R] [--seconds S]
        [--transport tcp,tls,ws,wss] [--protocol stomp,mqtt] [--json FILE]
    .venv/bin/python benchmarks/run.py --scenario transports [...]

For every protocol x transport pair, on a fresh ``gateway serve`` (free
loopback ports, temporary data folder, default settings; TLS with a throwaway
trustme certificate for 127.0.0.1, TLS 1.3 as negotiated by default):

flood    one producer -> one consumer (topic, QoS 0 / no receipts), N x 128 B
         (default 100,000) sent as pre-encoded batches of 500 frames per
         sendall; over WebSocket each STOMP frame / MQTT packet is its own
         masked client message (as stomp.js and MQTT.js send them), STOMP as
         text, MQTT as binary.  msgs/s = delivered / (last receive - first send),
         the median of --repeat floods (default 3; each on a fresh broker).
latency  a producer paced at R msgs/s (default 2,000) for S s (default 3) in
         1 ms ticks, each body carrying time.monotonic() at send; p50 / p99 /
         max of receive - send at the consumer (a separate process; the clock
         is system-wide).

Also the broker's RSS and peak RSS (VmRSS / VmHWM) after the flood.  Clients
are raw sockets with the project's codecs (client role) and, for WebSocket,
wsproto, with producer and consumer in separate processes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.harness.broker import free_port  # noqa: E402
import wsproto  # noqa: E402
from wsproto import events as ws  # noqa: E402

from gateway.mqtt.codec import packets as p  # noqa: E402
from gateway.mqtt.codec import MqttConnection, Role as MqttRole  # noqa: E402
from gateway.stomp import codec as stomp_codec, frames  # noqa: E402

GATEWAY = str(Path(sys.executable).parent / "gateway")
BODY = b"x" * 128
BATCH = 500  # frames per sendall in the flood
TRANSPORTS = ("tcp", "tls", "ws", "wss")
LISTENERS = ("stomp", "mqtt", "admin", "stomp-tls", "mqtt-tls", "admin-tls")
PROTOCOLS = ("stomp", "mqtt")
WAIT_S = 120.0  # every wait on the broker or a client is bounded by this


class Broker:
    """``gateway serve`` on three free loopback ports and a temporary data folder."""

    def __init__(self, tls: Certificates) -> None:
        self.ports = {name: free_port() for name in LISTENERS}
        self.data = tempfile.mkdtemp(prefix="gw-transport-bench-")
        self.log = Path(self.data) / "broker.log"
        config = Path(self.data) / "gateway.toml"
        config.write_text(
            "".join(f"{name.replace('-', '_')}_port = {port}\n" for name, port in self.ports.items())
            + f'[tls]\ncert = "{tls.cert}"\nkey = "{tls.key}"\n'
        )
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [GATEWAY, "serve", "--config", str(config), "--data-dir", str(Path(self.data) / "data"),
                 "--log-level", "warning"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 15
        for port in self.ports.values():
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        self.stop()
                        raise SystemExit(f"broker did not start: {self.log.read_text(errors='replace')[-2000:]}")
                    time.sleep(0.05)

    def memory_mib(self, field: str) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.data, ignore_errors=True)


# -- links: a blocking byte pipe to the broker over one transport --------------


class Certificates:
    """A throwaway CA (trustme, a test dependency) and its certificate for 127.0.0.1."""

    def __init__(self, folder: Path) -> None:
        import trustme

        ca = trustme.CA()
        issued = ca.issue_cert("127.0.0.1")
        self.cert, self.key = folder / "server.pem", folder / "server.key"
        issued.cert_chain_pems[0].write_to_path(self.cert)
        issued.private_key_pem.write_to_path(self.key)
        self.cafile = folder / "ca.pem"  # for the consumer process
        ca.cert_pem.write_to_path(self.cafile)
        self.client = ssl.create_default_context(cafile=str(self.cafile))


class TcpLink:
    def __init__(self, port: int, tls: ssl.SSLContext | None = None) -> None:
        plain = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        plain.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = tls.wrap_socket(plain, server_hostname="127.0.0.1") if tls is not None else plain

    def wire(self, chunks: list[bytes]) -> bytes:
        return b"".join(chunks)

    def send_wire(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> bytes:
        return self.sock.recv(1 << 20)

    def close(self) -> None:
        self.sock.close()


class WebSocketLink(TcpLink):
    """The admin port's /stomp or /mqtt; each chunk is one client message."""

    def __init__(self, port: int, path: str, subprotocol: str, text: bool, tls: ssl.SSLContext | None) -> None:
        super().__init__(port, tls)
        self.text = text
        self.ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        self.sock.sendall(self.ws.send(ws.Request(host=f"127.0.0.1:{port}", target=path, subprotocols=[subprotocol])))
        self.pending = bytearray()
        while True:
            data = self.sock.recv(65536)
            if not data:
                raise SystemExit(f"{path}: the broker closed during the WebSocket handshake")
            self.ws.receive_data(data)
            events = list(self.ws.events())
            if any(isinstance(e, ws.AcceptConnection) for e in events):
                break
            if any(isinstance(e, ws.RejectConnection) for e in events):
                raise SystemExit(f"{path}: the broker refused the WebSocket upgrade")

    def wire(self, chunks: list[bytes]) -> bytes:
        if self.text:
            return b"".join(self.ws.send(ws.TextMessage(data=chunk.decode())) for chunk in chunks)
        return b"".join(self.ws.send(ws.BytesMessage(data=chunk)) for chunk in chunks)

    def recv(self) -> bytes:
        while True:
            data = self.sock.recv(1 << 20)
            if not data:
                return b""
            self.ws.receive_data(data)
            out = bytearray()
            for event in self.ws.events():
                if isinstance(event, ws.TextMessage):
                    out += event.data.encode()
                elif isinstance(event, ws.BytesMessage):
                    out += event.data
                elif isinstance(event, ws.CloseConnection):
                    return bytes(out)
            if out:
                return bytes(out)


def open_link(transport: str, protocol: str, ports: dict[str, int], tls: ssl.SSLContext) -> TcpLink:
    secure = tls if transport in ("tls", "wss") else None
    suffix = "-tls" if secure is not None else ""
    if transport in ("tcp", "tls"):
        return TcpLink(ports[protocol + suffix], secure)
    if protocol == "stomp":
        return WebSocketLink(ports["admin" + suffix], "/stomp", "v12.stomp", True, secure)
    return WebSocketLink(ports["admin" + suffix], "/mqtt", "mqtt", False, secure)


# -- the protocols: connect, subscribe, encode, count -------------------------


class StompClient:
    destination = "/topic/bench.transport"

    def __init__(self, link: TcpLink) -> None:
        self.link = link
        self.codec = stomp_codec.StompConnection(stomp_codec.Role.CLIENT, max_frame_bytes=64 * 1024 * 1024)
        self._request(frames.Connect({"accept-version": "1.2", "host": "localhost", "heart-beat": "0,0"}),
                      frames.Connected)
        self.codec.set_version("1.2")

    def _request(self, frame: frames.Frame, reply: type) -> None:
        self.link.send_wire(self.link.wire([self.codec.send(frame)]))
        while True:
            self.codec.receive_data(self.link.recv())
            if any(isinstance(f, reply) for f in self.codec.events()):
                return

    def subscribe(self) -> None:
        self._request(frames.Subscribe({"id": "1", "destination": self.destination, "ack": "auto", "receipt": "s"}),
                      frames.Receipt)

    def publish(self, body: bytes) -> bytes:
        return self.codec.send(frames.Send({"destination": self.destination}, body))

    def bodies(self, data: bytes) -> list[bytes]:
        self.codec.receive_data(data)
        return [f.body for f in self.codec.events() if isinstance(f, frames.Message)]

    @staticmethod
    def count(data: bytes) -> int:
        # After the subscription's receipt only MESSAGE frames arrive (no
        # heart-beats); each ends in the one NUL byte it carries.
        return data.count(0)


class MqttClient:
    topic = "bench/transport"

    def __init__(self, link: TcpLink) -> None:
        self.link = link
        self.codec = MqttConnection(MqttRole.CLIENT)
        self._request(p.Connect(f"bench-{os.getpid()}"), p.ConnAck)

    def _request(self, packet: p.Packet, reply: type) -> None:
        self.link.send_wire(self.link.wire([self.codec.send(packet)]))
        while True:
            self.codec.receive_data(self.link.recv())
            if any(isinstance(x, reply) for x in self.codec.events()):
                return

    def subscribe(self) -> None:
        self._request(p.Subscribe(1, [(self.topic, 0)]), p.SubAck)

    def publish(self, body: bytes) -> bytes:
        return self.codec.send(p.Publish(self.topic, body))

    def bodies(self, data: bytes) -> list[bytes]:
        self.codec.receive_data(data)
        return [x.payload for x in self.codec.events() if isinstance(x, p.Publish)]

    def count(self, data: bytes) -> int:
        return len(self.bodies(data))


CLIENTS: dict[str, Callable[[TcpLink], StompClient | MqttClient]] = {"stomp": StompClient, "mqtt": MqttClient}


def consumer(transport: str, protocol: str, ports: dict[str, int], cafile: str, count: int, timed: bool,
             ready: multiprocessing.Event, out: multiprocessing.Queue) -> None:
    """Receive ``count`` messages; report (received, first, last, latencies)."""
    link = open_link(transport, protocol, ports, ssl.create_default_context(cafile=cafile))
    client = CLIENTS[protocol](link)
    client.subscribe()
    ready.set()
    got, first, last, latencies = 0, 0.0, 0.0, []
    while got < count:
        data = link.recv()
        if not data:
            break
        now = time.monotonic()
        if timed:
            for body in client.bodies(data):
                latencies.append(now - float(body[1:].split(b"x", 1)[0]))
                got += 1
        else:
            got += client.count(data)
        first = first or now
        last = now
    out.put((got, first, last, latencies))
    link.close()


def run_pair(transport: str, protocol: str, count: int, timed: bool, rate: int, tls: Certificates) -> dict:
    broker = Broker(tls)
    try:
        out: multiprocessing.Queue = multiprocessing.Queue()
        ready = multiprocessing.Event()
        proc = multiprocessing.Process(target=consumer, daemon=True, args=(
            transport, protocol, broker.ports, str(tls.cafile), count, timed, ready, out))
        proc.start()
        if not ready.wait(15):
            raise SystemExit("the consumer did not subscribe")
        link = open_link(transport, protocol, broker.ports, tls.client)
        client = CLIENTS[protocol](link)
        start = time.monotonic()
        if timed:
            tick, sent = 0.001, 0
            while sent < count:
                due = min(count, int((time.monotonic() - start) * rate) + 1)
                chunks = []
                while sent < due:
                    # The send time in ASCII, so a STOMP frame stays a text message.
                    chunks.append(client.publish(f"T{time.monotonic():.9f}".encode().ljust(len(BODY), b"x")))
                    sent += 1
                if chunks:
                    link.send_wire(link.wire(chunks))
                time.sleep(tick / 2)
        else:
            batch = link.wire([client.publish(BODY)] * BATCH)  # masked once: the same bytes resent
            for _ in range(count // BATCH):
                link.send_wire(batch)
        got, _first, last, latencies = out.get(timeout=WAIT_S)
        proc.join(5)
        link.close()
        result = {"transport": transport, "protocol": protocol, "delivered": got, "expected": count,
                  "rss_mib": broker.memory_mib("VmRSS"), "peak_rss_mib": broker.memory_mib("VmHWM")}
        if timed:
            ordered = sorted(latencies)

            def pct(q: float) -> float:
                return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")

            result.update(rate=rate, p50_ms=pct(0.5), p99_ms=pct(0.99), max_ms=pct(1.0))
        else:
            result["msgs_per_s"] = got / (last - start) if last > start else float("nan")
        return result
    finally:
        broker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default="transports", help=argparse.SUPPRESS)  # when run through run.py
    parser.add_argument("--messages", type=int, default=100_000, help="flood messages per pair (default 100,000)")
    parser.add_argument("--rate", type=int, default=2000, help="latency run send rate, msgs/s (default 2,000)")
    parser.add_argument("--seconds", type=float, default=3.0, help="latency run length (default 3)")
    parser.add_argument("--transport", default=",".join(TRANSPORTS), help="comma-separated: tcp,tls,ws,wss")
    parser.add_argument("--protocol", default=",".join(PROTOCOLS), help="comma-separated: stomp,mqtt")
    parser.add_argument("--repeat", type=int, default=3, help="floods per pair; the median is reported (default 3)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args, _ = parser.parse_known_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    count = max(BATCH, args.messages // BATCH * BATCH)
    print(f"gateway transports benchmark: {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; flood {count:,} x {len(BODY)} B, "
          f"latency at {args.rate:,} msgs/s for {args.seconds:g} s")
    print(f"{'protocol':<8} {'transport':<9} {'msgs/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'RSS MiB':>8} {'peak MiB':>9}  delivered")
    results, ok = [], True
    folder = Path(tempfile.mkdtemp(prefix="gw-transport-certs-"))
    try:
        tls = Certificates(folder)
        for protocol in args.protocol.split(","):
            for transport in args.transport.split(","):
                # Several floods on a shared machine: the median run is reported.
                floods = sorted((run_pair(transport, protocol, count, False, args.rate, tls)
                                 for _ in range(args.repeat)), key=lambda r: r["msgs_per_s"])
                flood = floods[len(floods) // 2]
                flood["runs_msgs_per_s"] = [round(r["msgs_per_s"]) for r in floods]
                ok = ok and all(r["delivered"] == r["expected"] for r in floods)
                latency = run_pair(transport, protocol, int(args.rate * args.seconds), True, args.rate, tls)
                ok = ok and flood["delivered"] == flood["expected"] and latency["delivered"] == latency["expected"]
                results.append({"flood": flood, "latency": latency})
                print(f"{protocol:<8} {transport:<9} {flood['msgs_per_s']:>10,.0f} {latency['p50_ms']:>8.2f} "
                      f"{latency['p99_ms']:>8.2f} {latency['max_ms']:>8.2f} {flood['rss_mib']:>8.1f} "
                      f"{flood['peak_rss_mib']:>9.1f}  {flood['delivered']:,}/{flood['expected']:,}, "
                      f"{latency['delivered']:,}/{latency['expected']:,}")
                sys.stdout.flush()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"python": platform.python_version(), "results": results}, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
