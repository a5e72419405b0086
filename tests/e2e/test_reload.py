"""Reloading the configuration of a running ``gateway serve`` without a
restart: SIGHUP (as mosquitto reloads) and ``POST /api/v1/reload`` read the
file again.  A new user can then log in; an authorization change decides
the next SUBSCRIBE, on a connection opened before it too; a new admin user
can use the API; a key that needs a restart is named as such; a file that
does not load is refused with its key while the broker keeps serving with
what it had; and the process never dies of SIGHUP."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gateway.auth import hash_password
from tests.support import ha_nodes
from tests.support.auth_helpers import ITER
from tests.support.helpers import RawClient, unique, wait_for
from tests.support.processes import GATEWAY, HOST, BrokerProcess, free_port

OPS = ("ops", "ops-pw")  # admin, write
VIEWER = ("viewer", "viewer-pw")  # admin, read


def entry(name: str, password: str, **extra: object) -> str:
    fields = "".join(f", {k} = {json.dumps(v)}" for k, v in extra.items())
    return f'{{ name = "{name}", password_hash = "{hash_password(password, iterations=ITER)}"{fields} }}'


def config_text(*, users: list[str], grants: str, admins: list[str], max_connections: int = 20000) -> str:
    return f"""
max_connections = {max_connections}

[auth]
users = [{", ".join(users)}]
acl = [
  {grants}
  {{ destination = "/topic/barrier.>", write = ["*"] }},
]

[admin]
users = [{", ".join(admins)}]
"""


ALICE = entry("alice", "alice-pw", groups=["readers"])
BOB = entry("bob", "bob-pw", groups=["readers"])
ADMINS = [entry(*OPS, role="write"), entry(*VIEWER, role="read")]
READ_ORDERS = '{ destination = "/queue/orders.>", read = ["readers"], admin = ["readers"] },'
READ_SECRETS = '{ destination = "/queue/secret.>", read = ["readers"], admin = ["readers"] },'


class Broker:
    def __init__(self, tmp_path: Path) -> None:
        self.config = tmp_path / "gateway.toml"
        self.config.write_text(config_text(users=[ALICE], grants=READ_ORDERS, admins=ADMINS))
        self.admin_port = free_port()
        self.process = BrokerProcess(tmp_path, "--config", str(self.config), "--admin-port", str(self.admin_port),
                                     "--log-format", "json")
        self.process.start()  # the STOMP port; the admin port opens right after

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://{HOST}:{self.admin_port}/readyz", timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        wait_for(ready, timeout=20, what="/readyz")

    def events(self, name: str) -> list[dict]:
        text = self.process.log_path.read_text(errors="replace")
        found = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        return [e for e in found if e.get("event") == name]

    def sighup(self, expect: str) -> dict:
        """SIGHUP, and the reload's log line (``expect``: its event)."""
        before = len(self.events(expect))
        self.process.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: len(self.events(expect)) > before, timeout=10, what=f"{expect} after SIGHUP")
        assert self.process.proc.poll() is None, f"SIGHUP ended the broker:\n{self.process.log_tail()}"
        return self.events(expect)[-1]

    def post_reload(self, auth: tuple[str, str]) -> tuple[int, dict]:
        request = urllib.request.Request(f"http://{HOST}:{self.admin_port}/api/v1/reload", method="POST", data=b"",
                                         headers={"Content-Type": "application/json"})
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, json.loads(exc.read())

    def post(self, path: str, auth: tuple[str, str], document: dict) -> tuple[int, dict]:
        request = urllib.request.Request(f"http://{HOST}:{self.admin_port}{path}", method="POST",
                                         data=json.dumps(document).encode(), headers={"Content-Type": "application/json"})
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, json.loads(exc.read())

    def depth(self, name: str) -> int | None:
        request = urllib.request.Request(f"http://{HOST}:{self.admin_port}/api/v1/destinations/{name}")
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(OPS).encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return json.loads(response.read())["depth"]
        except urllib.error.HTTPError as exc:
            with exc:
                return None

    def get(self, path: str, auth: tuple[str, str]) -> int:
        request = urllib.request.Request(f"http://{HOST}:{self.admin_port}{path}")
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code

    def login(self, name: str) -> str:
        """CONNECT as ``name`` (password ``<name>-pw``): CONNECTED or ERROR."""
        client = RawClient((HOST, self.process.port))
        try:
            client.send_frame("CONNECT", {"accept-version": "1.2", "host": "h", "login": name, "passcode": f"{name}-pw"})
            return client.next_frame().command
        finally:
            client.close()

    def session(self, name: str) -> RawClient:
        client = RawClient((HOST, self.process.port))
        client.connect(login=name, passcode=f"{name}-pw")
        return client


def subscribe(client: RawClient, destination: str) -> str:
    """SUBSCRIBE with a receipt: RECEIPT, or the ERROR that refused it."""
    receipt = unique("r")
    client.send_frame("SUBSCRIBE", {"destination": destination, "id": unique("s"), "receipt": receipt})
    frame = client.next_frame()
    return frame.command if frame.command == "RECEIPT" else f"ERROR: {frame.headers.get('message')}"


def subscribe_as(broker: Broker, user: str, destination: str) -> str:
    """:func:`subscribe` on a connection of its own, logged in as ``user``."""
    client = broker.session(user)
    try:
        return subscribe(client, destination)
    finally:
        client.close()


@pytest.fixture
def broker(tmp_path):
    running = Broker(tmp_path)
    yield running
    assert running.process.terminate() == 0


def test_sighup_adds_a_user_changes_the_acl_and_refuses_a_bad_file(broker):
    assert broker.login("bob") == "ERROR"
    alice = broker.session("alice")
    try:
        assert subscribe(alice, f"/queue/orders.{unique()}") == "RECEIPT"  # decided, and remembered by the connection
        assert subscribe(alice, f"/queue/secret.{unique()}").startswith("ERROR")
    finally:
        alice.close()
    alice = broker.session("alice")  # open across the reload
    try:
        orders = f"/queue/orders.{unique()}"
        sub_id = unique("s")
        alice.send_frame("SUBSCRIBE", {"destination": orders, "id": sub_id, "receipt": "subscribed"})
        assert alice.next_frame().command == "RECEIPT"
        # The decision stays remembered; the subscription ends before the
        # reload, or the reload's re-check would end it and the connection
        # with it (tests/e2e/test_revocation.py).
        alice.send_frame("UNSUBSCRIBE", {"id": sub_id, "receipt": "unsubscribed"})
        assert alice.next_frame().command == "RECEIPT"

        broker.config.write_text(config_text(users=[ALICE, BOB], grants=READ_SECRETS, admins=ADMINS,
                                             max_connections=500))
        done = broker.sighup("config_reloaded")
        assert done["trigger"] == "SIGHUP"
        assert "auth.users +bob" in done["changed"] and "auth.acl" in done["changed"]
        assert done["restart_needed"] == ["max_connections"]
        needs = broker.events("config_reload_needs_restart")[-1]
        assert needs["keys"] == ["max_connections"] and needs["level"] == "warning"

        assert broker.login("bob") == "CONNECTED"
        # The new map decides the next SUBSCRIBE, on the connection opened before the reload too,
        # to the very queue it was allowed to read before.
        assert "may not read" in subscribe(alice, orders)
    finally:
        alice.close()
    assert subscribe_as(broker, "bob", f"/queue/secret.{unique()}") == "RECEIPT"

    broker.config.write_text("[auth]\nusers = []\nno_such_setting = 1\n")
    failed = broker.sighup("config_reload_failed")
    assert failed["reason"] == "unknown setting auth.'no_such_setting'" and failed["level"] == "warning"
    # Still serving, with what it had: bob still logs in, the map still grants him secrets.
    assert broker.login("bob") == "CONNECTED"
    assert subscribe_as(broker, "bob", f"/queue/secret.{unique()}") == "RECEIPT"

    broker.config.write_text("[auth\nnot toml")
    failed = broker.sighup("config_reload_failed")
    assert "gateway.toml" in failed["reason"]
    assert broker.login("bob") == "CONNECTED"


def test_post_reload_needs_the_write_role_and_applies_admin_users(broker):
    newcomer = ("newcomer", "newcomer-pw")
    assert broker.get("/api/v1/destinations", newcomer) == 401
    broker.config.write_text(config_text(users=[ALICE], grants=READ_ORDERS,
                                         admins=[*ADMINS, entry(*newcomer, role="read")]))
    status, body = broker.post_reload(VIEWER)
    assert status == 403, body
    assert broker.get("/api/v1/destinations", newcomer) == 401  # a read-only user reloaded nothing

    status, body = broker.post_reload(OPS)
    assert status == 200, body
    assert body == {"changed": ["admin users +newcomer"], "restart_needed": []}
    assert broker.get("/api/v1/destinations", newcomer) == 200
    assert broker.events("config_reloaded")[-1]["trigger"] == "api"

    broker.config.write_text(config_text(users=[ALICE], grants='{ destination = "not-a-destination", read = ["x"] },',
                                         admins=ADMINS))
    status, body = broker.post_reload(OPS)
    assert status == 409 and "not reloaded" in body["reason"] and "auth.acl[0].destination" in body["reason"], body
    assert broker.get("/api/v1/destinations", newcomer) == 200  # the running config stayed whole

    # Removing a user takes it away at once, even with a cached good password.
    broker.config.write_text(config_text(users=[ALICE], grants=READ_ORDERS, admins=ADMINS))
    status, body = broker.post_reload(OPS)
    assert status == 200 and body["changed"] == ["admin users -newcomer"], body
    assert broker.get("/api/v1/destinations", newcomer) == 401


def test_a_policy_change_applies_to_the_queue_there_already(broker):
    """max_redeliveries from 6 to 0 for a queue that exists: a NACK that
    brought its message back before the reload sends it to the dead-letter
    queue after it."""
    queue = f"/queue/orders.{unique()}"
    text = broker.config.read_text()
    alice = broker.session("alice")
    try:
        assert subscribe_acking(alice, queue) == "RECEIPT"
        status, _ = broker.post(f"/api/v1/destinations/{queue[1:]}/messages", OPS, {"body": "order"})
        assert status == 201
        first = alice.next_frame()
        assert first.command == "MESSAGE" and first.body == b"order"
        alice.send_frame("NACK", {"id": first.headers["ack"]})
        again = alice.next_frame()
        assert again.command == "MESSAGE" and again.headers.get("redelivered") == "true"

        broker.config.write_text(text + f'\n[[broker.policies]]\ndestination = "{queue}"\nmax_redeliveries = 0\n')
        assert broker.sighup("config_reloaded")["changed"] == ["broker.policies"]
        alice.send_frame("NACK", {"id": again.headers["ack"]})
        wait_for(lambda: broker.depth("queue/DLQ") == 1, timeout=10, what="the message in the DLQ")
        assert broker.depth(queue[1:]) == 0
    finally:
        alice.close()
    status, body = broker.post_reload(OPS)
    assert status == 200 and body == {"changed": [], "restart_needed": []}, body  # nothing new the second time


def subscribe_acking(client: RawClient, destination: str) -> str:
    receipt = unique("r")
    client.send_frame("SUBSCRIBE", {"destination": destination, "id": unique("s"), "receipt": receipt,
                                    "ack": "client-individual"})
    return client.next_frame().command


def test_a_user_made_with_gateway_passwd_logs_in_after_a_reload(broker):
    """The README's "How do I create a user": `gateway passwd` prints the
    entries (a client's with its groups, an admin's with its role), they go
    into the file, a reload makes them real."""
    def passwd(*args: str, password: str) -> str:
        done = subprocess.run([GATEWAY, "passwd", *args], input=password + "\n", capture_output=True, text=True,
                              timeout=30, check=True)
        return done.stdout.strip()

    client = passwd("--client", "--name", "carol", "--group", "readers", password="carol-pw")
    admin = passwd("--name", "auditor", "--role", "read", password="auditor-pw")
    assert '"readers"' in client and "role" not in client and 'role = "read"' in admin
    assert broker.login("carol") == "ERROR"
    broker.config.write_text(config_text(users=[ALICE, client], grants=READ_ORDERS, admins=[*ADMINS, admin]))
    status, body = broker.post_reload(OPS)
    assert status == 200 and body["changed"] == ["auth.users +carol", "admin users +auditor"], body
    carol = broker.session("carol")
    try:
        assert subscribe(carol, f"/queue/orders.{unique()}") == "RECEIPT"  # her group's grant
    finally:
        carol.close()
    assert broker.get("/api/v1/destinations", ("auditor", "auditor-pw")) == 200
    assert broker.post_reload(("auditor", "auditor-pw"))[0] == 403  # read only


def test_an_ha_node_says_it_does_not_reload_and_keeps_serving(tmp_path, zookeeper):
    """A group runs one configuration: an [ha] node answers SIGHUP with a
    warning and POST /api/v1/reload with 409, naming what to do, and serves on."""
    node = ha_nodes.Node(tmp_path, "gw-0", zookeeper, replicas=2)
    node.config.write_text(node.config.read_text().replace("users = [", f"users = [{entry(*OPS, role='write')}, "))
    node.start()
    try:
        assert ha_nodes.wait_ready([node]) is node
        node.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "config_reload_failed" in node.log_path.read_text(), what="the SIGHUP answered")
        assert "an HA node does not reload" in node.log_path.read_text()
        request = urllib.request.Request(f"http://{HOST}:{node.admin_port}/api/v1/reload", method="POST", data=b"",
                                         headers={"Content-Type": "application/json"})
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(OPS).encode()).decode())
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        with refused.value as answer:
            assert answer.code == 409 and "restart" in json.loads(answer.read())["reason"]
        assert node.alive() and node.readyz() == 200
    finally:
        node.kill()
