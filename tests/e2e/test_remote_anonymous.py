"""A broker with no users is closed to the network: it admits anonymous
clients from this machine (loopback) and refuses them from any other
address, over STOMP, MQTT 3.1.1 and 5 and STOMP over WebSocket, and says so
once at start (TLS changes nothing); credentials or ``[auth] anonymous = "true"`` let a remote
client in, and the latter says at start that the broker is open to anyone.

"Another machine" is a network namespace: the broker runs in one, bound to
all its addresses; the remote client runs in a second, joined to the first
by a veth pair on a private /30 that exists only between the two and goes
with them.  Needs root (``ip netns``); skipped with the reason otherwise."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import GATEWAY

STOMP_PORT, MQTT_PORT, ADMIN_PORT, STOMP_TLS_PORT = 61613, 1883, 8161, 61614
STARTUP_TIMEOUT = 30.0

# Run by the client (python -c) inside a namespace: one CONNECT per line of
# argv[1] (JSON: [kind, host, login, password]), what the broker answered as
# one JSON line per attempt.
CLIENT = r'''
import json, socket, ssl, sys
import wsproto
from wsproto import events as ev

def stomp_frame(login, password):
    headers = "accept-version:1.2\nhost:gateway\n"
    if login is not None:
        headers += f"login:{login}\npasscode:{password}\n"
    return f"CONNECT\n{headers}\n\x00".encode()

def read_stomp(read):
    data = b""
    while b"\x00" not in data:
        chunk = read()
        if not chunk:
            break
        data += chunk
    command, _, rest = data.partition(b"\n")
    headers = dict(line.split(":", 1) for line in rest.split(b"\n\n")[0].decode().splitlines() if ":" in line)
    return {"command": command.decode(), "message": headers.get("message", "")}

def mqtt_connect(level, login, password):
    flags = 0x02 | (0xC0 if login is not None else 0)
    def s(text):
        b = text.encode()
        return len(b).to_bytes(2, "big") + b
    body = s("MQTT") + bytes([level, flags]) + (60).to_bytes(2, "big") + (b"\x00" if level == 5 else b"")
    body += s("netns-client") + (s(login) + s(password) if login is not None else b"")
    return bytes([0x10, len(body)]) + body

def attempt(kind, host, login, password):
    port = {"stomp": %(stomp)d, "stomp-tls": %(tls)d, "mqtt3": %(mqtt)d, "mqtt5": %(mqtt)d, "stomp-ws": %(admin)d}[kind]
    with socket.create_connection((host, port), timeout=10) as plain:
        sock = plain
        if kind == "stomp-tls":  # the test's own certificate: encryption is all that matters here
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            sock = context.wrap_socket(plain)
        if kind in ("stomp", "stomp-tls"):
            sock.sendall(stomp_frame(login, password))
            return read_stomp(lambda: sock.recv(65536))
        if kind.startswith("mqtt"):
            sock.sendall(mqtt_connect(5 if kind == "mqtt5" else 4, login, password))
            data = b""
            # The remaining length is a variable byte integer: a v5 refusal's
            # reason string makes it two bytes.
            def code_at():
                if len(data) < 2:
                    return None
                at = 3 if data[1] & 0x80 else 2  # past the type and the length
                return at + 1 if len(data) > at + 1 else None  # past the acknowledge flags
            while code_at() is None:
                chunk = sock.recv(65536)
                if not chunk:
                    return {"connack": None}
                data += chunk
            return {"connack": data[code_at()] if data[0] == 0x20 else None}
        ws = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        sock.sendall(ws.send(ev.Request(host=host, target="/stomp", subprotocols=["v12.stomp"])))
        pending = []
        def read():
            while not pending:
                data = sock.recv(65536)
                if not data:
                    return b""
                ws.receive_data(data)
                for event in ws.events():
                    if isinstance(event, ev.AcceptConnection):
                        sock.sendall(ws.send(ev.TextMessage(data=stomp_frame(login, password).decode())))
                    elif isinstance(event, (ev.TextMessage, ev.BytesMessage)):
                        pending.append(event.data.encode() if isinstance(event.data, str) else bytes(event.data))
                    elif isinstance(event, ev.CloseConnection):
                        return b""
            return pending.pop(0)
        return read_stomp(read)

for spec in json.loads(sys.argv[1]):
    print(json.dumps(attempt(*spec)), flush=True)
''' % {"stomp": STOMP_PORT, "mqtt": MQTT_PORT, "admin": ADMIN_PORT, "tls": STOMP_TLS_PORT}


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Namespaces:
    """Two network namespaces joined by a veth pair: the broker's (``.1``)
    and a remote client's (``.2``), on a /30 that exists only between them."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 10000}{secrets.token_hex(2)}"
        self.broker, self.client = f"gwb{tag}", f"gwc{tag}"
        third = secrets.randbelow(250) + 1
        self.broker_address, self.client_address = f"10.251.{third}.1", f"10.251.{third}.2"
        self.made: list[str] = []
        try:
            for ns in (self.broker, self.client):
                ip("netns", "add", ns)
                self.made.append(ns)
            ip("link", "add", f"vb{tag}", "type", "veth", "peer", "name", f"vc{tag}")
            ip("link", "set", f"vb{tag}", "netns", self.broker)
            ip("link", "set", f"vc{tag}", "netns", self.client)
            for ns, dev, address in ((self.broker, f"vb{tag}", self.broker_address),
                                     (self.client, f"vc{tag}", self.client_address)):
                ip("-n", ns, "addr", "add", f"{address}/30", "dev", dev)
                ip("-n", ns, "link", "set", dev, "up")
                ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        for ns in self.made:  # the veth pair goes with its namespaces
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.made.clear()

    def connect(self, ns: str, *attempts: tuple[str, str, str | None, str | None]) -> list[dict]:
        """Run CONNECTs from inside ``ns``; what the broker answered to each."""
        done = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", CLIENT, json.dumps(attempts)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture(scope="module")
def namespaces() -> Iterator[Namespaces]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (ip netns) to put a client on another address")
    try:
        made = Namespaces()
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"ip netns unavailable here: {exc.stderr.decode(errors='replace').strip()}")
    yield made
    made.remove()


class NamespacedBroker:
    """``gateway serve --bind 0.0.0.0`` inside the broker's namespace."""

    def __init__(self, namespaces: Namespaces, tmp_path: Path, pki: dict[str, str], config: str = "",
                 env: dict[str, str] | None = None) -> None:
        self.log_path = tmp_path / "broker.log"
        # STOMP over TLS too (the MQTT and admin TLS ports on ports of their own).
        (tmp_path / "gateway.toml").write_text(
            f"stomp_tls_port = {STOMP_TLS_PORT}\nmqtt_tls_port = 8883\nadmin_tls_port = 8162\n{config}\n"
            f'[tls]\ncert = "{pki["server"]}"\nkey = "{pki["server"]}"\n')
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", namespaces.broker, GATEWAY, "serve", "--config", str(tmp_path / "gateway.toml"),
                 "--bind", "0.0.0.0", "--stomp-port", str(STOMP_PORT), "--mqtt-port", str(MQTT_PORT),
                 "--admin-port", str(ADMIN_PORT), "--data-dir", str(tmp_path / "data"), "--log-format", "json"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not self.events("broker_started"):
            assert self.proc.poll() is None, f"broker exited at start:\n{self.log_path.read_text()}"
            assert time.monotonic() < deadline, f"broker not started:\n{self.log_path.read_text()}"
            time.sleep(0.05)

    def events(self, name: str) -> list[dict]:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return [e for e in (json.loads(line) for line in lines if line.startswith("{")) if e.get("event") == name]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def start_broker(namespaces: Namespaces, tmp_path: Path, pki: dict[str, str]) -> Iterator:
    started: list[NamespacedBroker] = []

    def start(config: str = "", env: dict[str, str] | None = None) -> NamespacedBroker:
        broker = NamespacedBroker(namespaces, tmp_path, pki, config, env)
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.stop()


EVERY_DOOR = ("stomp", "mqtt3", "mqtt5", "stomp-ws", "stomp-tls")


def test_with_no_users_remote_anonymous_clients_are_refused_and_local_ones_admitted(namespaces, start_broker):
    broker = start_broker()
    (announced,) = broker.events("remote_anonymous_refused")  # one line at start, with what to do
    assert announced["bind"] == "0.0.0.0"
    assert '[auth] anonymous = \\"true\\"' in json.dumps(announced["detail"]) and "GATEWAY_USER" in announced["detail"]
    assert not broker.events("broker_open_to_network")

    remote = namespaces.connect(namespaces.client, *[(door, namespaces.broker_address, None, None) for door in EVERY_DOOR],
                                ("stomp", namespaces.broker_address, "guest", "guest"),  # a default login changes nothing
                                ("mqtt5", namespaces.broker_address, "guest", "guest"))
    stomp, mqtt3, mqtt5, websocket, tls, stomp_guest, mqtt5_guest = remote
    for refused in (stomp, websocket, tls, stomp_guest):
        assert refused["command"] == "ERROR"
        assert "anonymous access from remote addresses is off" in refused["message"]
        assert '[auth] anonymous = "true"' in refused["message"]
    assert mqtt3 == {"connack": 0x05}  # not authorized
    assert mqtt5 == mqtt5_guest == {"connack": 0x87}  # Not authorized
    logged = broker.events("login_refused")
    assert len(logged) == len(remote) and all(e["kind"] == "remote_anonymous" for e in logged)
    assert all(e["peer"].startswith(namespaces.client_address + ":") for e in logged)

    # This machine's clients (the broker namespace's loopback) need no set-up.
    local = namespaces.connect(namespaces.broker, *[(door, "127.0.0.1", None, None) for door in EVERY_DOOR])
    assert [r.get("command", r.get("connack")) for r in local] == ["CONNECTED", 0, 0, "CONNECTED", "CONNECTED"]


def test_a_remote_client_with_credentials_is_admitted(namespaces, start_broker):
    broker = start_broker(env={"GATEWAY_USER": "app", "GATEWAY_PASSWORD": "client-pass-1"})
    assert not broker.events("remote_anonymous_refused")  # users: nothing anonymous to announce
    address = namespaces.broker_address
    answers = namespaces.connect(namespaces.client, *[(door, address, "app", "client-pass-1") for door in EVERY_DOOR],
                                 ("stomp", address, None, None))
    assert [r.get("command", r.get("connack")) for r in answers] == ["CONNECTED", 0, 0, "CONNECTED", "CONNECTED", "ERROR"]
    assert answers[-1]["message"] == "authentication failed"  # anonymous is off with users, everywhere


def test_anonymous_true_admits_remote_clients_and_says_the_broker_is_open(namespaces, start_broker):
    broker = start_broker('[auth]\nanonymous = "true"\n')
    (announced,) = broker.events("broker_open_to_network")
    assert "ANYONE" in announced["detail"] and announced["bind"] == "0.0.0.0"
    assert not broker.events("remote_anonymous_refused")
    answers = namespaces.connect(namespaces.client, *[(door, namespaces.broker_address, None, None) for door in EVERY_DOOR])
    assert [r.get("command", r.get("connack")) for r in answers] == ["CONNECTED", 0, 0, "CONNECTED", "CONNECTED"]
