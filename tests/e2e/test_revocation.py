"""Revoked rights stop flowing: a ``gateway serve`` started from a config
file whose map lets alice read ``/topic/plant.>`` (and a queue); her STOMP
(stomp.py), MQTT 3.1.1 and MQTT 5 (paho) subscribers get messages; the file
is changed to revoke that and reloaded (SIGHUP, or ``POST
/api/v1/reload``).  From then on they get nothing: the STOMP client gets an
ERROR naming the user and the destination, MQTT 5 a DISCONNECT 0x87, MQTT
3.1.1 a close, each logged; what alice held unacknowledged goes to a reader
still allowed; her durable subscriptions stay but do not resume.  A user
removed from the file loses every connection (TCP and WebSocket)."""

from __future__ import annotations

import base64
import json
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gateway.auth import hash_password
from tests.support.auth_helpers import ITER
from tests.support.helpers import TIMEOUT, Client, RawClient, unique, wait_for
from tests.support.mqtt5_helpers import Paho5
from tests.support.mqtt_helpers import Paho
from tests.support.processes import HOST, BrokerProcess, free_port
from tests.support.ws_helpers import WebSocketSocket

OPS = ("ops", "ops-pw")  # an admin with the write role: publishes through the API and reloads
NOT_AUTHORIZED = 0x87


def entry(name: str, password: str, **extra: object) -> str:
    fields = "".join(f", {k} = {json.dumps(v)}" for k, v in extra.items())
    return f'{{ name = "{name}", password_hash = "{hash_password(password, iterations=ITER)}"{fields} }}'


ALICE = entry("alice", "alice-pw", groups=["readers"])
BOB = entry("bob", "bob-pw", groups=["readers"])
CAROL = entry("carol", "carol-pw", groups=["auditors"])
GRANTED = """
  { destination = "/topic/plant.>", read = ["readers"] },
  { destination = "/topic/other.>", read = ["readers"] },
  { destination = "/queue/orders.>", read = ["readers", "auditors"], admin = ["readers", "auditors"] },
"""
REVOKED = """
  { destination = "/topic/other.>", read = ["readers"] },
  { destination = "/queue/orders.>", read = ["auditors"], admin = ["auditors"] },
"""


def config_text(users: list[str], grants: str, anonymous: str = "auto") -> str:
    return f"""
[auth]
anonymous = "{anonymous}"
users = [{", ".join(users)}]
acl = [
{grants}
  {{ destination = "/topic/barrier.>", write = ["*"] }},
]

[admin]
users = [{entry(*OPS, role="write")}]
"""


class Broker:
    """``gateway serve --config`` with its STOMP, MQTT and admin ports."""

    def __init__(self, tmp_path: Path, users: list[str], grants: str = GRANTED, anonymous: str = "auto") -> None:
        self.config = tmp_path / "gateway.toml"
        self.config.write_text(config_text(users, grants, anonymous))
        self.admin_port, self.mqtt_port = free_port(), free_port()
        self.process = BrokerProcess(tmp_path, "--config", str(self.config), "--admin-port", str(self.admin_port),
                                     "--mqtt-port", str(self.mqtt_port), "--log-format", "json")
        self.process.start()
        wait_for(lambda: self.request("GET", "/readyz")[0] == 200, timeout=20, what="/readyz")

    def request(self, method: str, path: str, document: dict | None = None) -> tuple[int, Any]:
        data = json.dumps(document).encode() if document is not None else (b"" if method == "POST" else None)
        request = urllib.request.Request(f"http://{HOST}:{self.admin_port}{path}", method=method, data=data,
                                         headers={"Content-Type": "application/json"})
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(OPS).encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                text = response.read()
                return response.status, json.loads(text) if text.startswith((b"{", b"[")) else {}
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, {}
        except OSError:
            return 0, {}

    def publish(self, destination: str, body: str) -> None:
        """An administrator's send (not checked against the map)."""
        status, _ = self.request("POST", f"/api/v1/destinations/{destination[1:]}/messages", {"body": body})
        assert status == 201, status

    def events(self, name: str) -> list[dict]:
        text = self.process.log_path.read_text(errors="replace")
        found = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        return [e for e in found if e.get("event") == name]

    def reload(self, users: list[str], grants: str, *, signal_it: bool = True, anonymous: str = "auto") -> dict:
        """Rewrite the file and reload it (SIGHUP, or the API); the re-check's
        summary line (logged before ``config_reloaded``), or {} if none."""
        before = len(self.events("config_reloaded"))
        self.config.write_text(config_text(users, grants, anonymous))
        if signal_it:
            assert self.process.proc is not None
            self.process.proc.send_signal(signal.SIGHUP)
        else:
            assert self.request("POST", "/api/v1/reload")[0] == 200
        wait_for(lambda: len(self.events("config_reloaded")) > before, timeout=10, what="config_reloaded")
        summaries = self.events("access_rechecked")
        return summaries[-1] if summaries else {}

@pytest.fixture
def broker(tmp_path):
    running = Broker(tmp_path, [ALICE, BOB, CAROL])
    yield running
    assert running.process.terminate() == 0


@pytest.fixture
def clients():
    """Every client a test opens, closed after it whatever happened."""
    made: list = []
    yield made
    for client in made:
        try:
            client.close()
        except Exception:  # already closed by the broker: nothing left to release
            pass


def stomp(broker: Broker, clients: list, user: str, **headers: str) -> Client:
    client = Client((HOST, broker.process.port))
    clients.append(client)
    return client.connect(login=user, passcode=f"{user}-pw", **headers)


def mqtt3(broker: Broker, clients: list, user: str, client_id: str = "", clean: bool = True) -> Paho:
    client = Paho(broker.mqtt_port, client_id or unique("v3-"), clean=clean, username=user, password=f"{user}-pw")
    clients.append(client)
    client.client._reconnect_on_failure = False  # a close is the answer: paho must not quietly reconnect
    client.closed = threading.Event()  # type: ignore[attr-defined]
    client.client.on_disconnect = lambda *args: client.closed.set()  # type: ignore[attr-defined]
    return client


def mqtt5(broker: Broker, clients: list, user: str) -> Paho5:
    client = Paho5(broker.mqtt_port, unique("v5-"), username=user, password=f"{user}-pw")
    clients.append(client)
    client.client._reconnect_on_failure = False
    return client


def test_a_sighup_that_revokes_a_read_ends_those_subscriptions_and_nothing_more_flows(broker, clients):
    queue = f"/queue/orders.{unique()}"
    alice = stomp(broker, clients, "alice")
    alice.subscribe("/topic/plant.>", "plant")
    alice.subscribe(queue, "orders", ack="client-individual")
    v3 = mqtt3(broker, clients, "alice")
    assert v3.subscribe(("plant/#", 1)) == [1]
    v5 = mqtt5(broker, clients, "alice")
    assert v5.subscribe("plant/#", 1) == [1]
    elsewhere = stomp(broker, clients, "alice")  # reads only what stays granted
    elsewhere.subscribe("/topic/other.>")

    broker.publish("/topic/plant.1", "before")
    broker.publish(queue, "order")
    alice.wait_messages(2)
    assert v3.wait(1)[0].payload == b"before" and v5.wait(1)[0].payload == b"before"

    done = broker.reload([ALICE, BOB, CAROL], REVOKED)

    error = alice.wait_error()
    message = error.headers["message"]
    assert "user 'alice' may not read" in message and "'/topic/plant.>'" in message and repr(queue) in message, message
    assert b"subscription plant to /topic/plant.> ended" in error.body
    code, properties = v5.wait_disconnect()
    assert code == NOT_AUTHORIZED
    assert properties.ReasonString == "user 'alice' may not read 'plant/#' any more: the authorization map was reloaded"
    assert v3.closed.wait(TIMEOUT)  # type: ignore[attr-defined]
    assert done["connections_closed"] == 3 and done["subscriptions_ended"] == 4, done
    revoked = {(e["user"], e.get("client_id") is None, tuple(e["subscriptions"])) for e in broker.events("access_revoked")}
    assert ("alice", True, ("/topic/plant.>", queue)) in revoked  # STOMP: destinations
    assert ("alice", False, ("plant/#",)) in revoked  # MQTT: filters

    # The order alice held unacknowledged goes to a reader the new map allows.
    carol = stomp(broker, clients, "carol")
    carol.subscribe(queue, ack="client-individual")
    (order,) = carol.wait_messages(1)
    assert order.body == b"order" and order.headers.get("redelivered") == "true"

    broker.publish("/topic/plant.2", "after")
    broker.publish("/topic/other.1", "still granted")
    assert elsewhere.wait_messages(1)[0].body == b"still granted"  # her other connection was left alone
    carol.barrier()
    assert alice.bodies == [b"before", b"order"]
    assert v3.payloads == [b"before"] and v5.payloads == [b"before"]


def test_a_revoked_reader_that_reads_nothing_is_still_cut_off(broker, clients):
    """Its socket and output are full when the read is revoked, so the ERROR
    cannot go out: the connection still ends, within its closing bound."""
    stalled = RawClient((HOST, broker.process.port), rcvbuf=4096)
    clients.append(stalled)
    stalled.connect(login="alice", passcode="alice-pw")
    stalled.send_frame("SUBSCRIBE", {"destination": "/topic/plant.>", "id": "s", "receipt": "r"})
    assert stalled.next_frame().command == "RECEIPT"
    for _ in range(20):  # 10 MB: more than the socket's buffers and the outbox hold
        broker.publish("/topic/plant.big", "x" * 500_000)

    broker.reload([ALICE, BOB, CAROL], REVOKED)

    reason = "user 'alice' may not read '/topic/plant.>' any more: the authorization map was reloaded"
    wait_for(lambda: any(e.get("reason") == reason for e in broker.events("connection_closed")), timeout=30,
             what="the stalled connection closed")


def test_a_revoked_durable_subscription_stays_but_its_resume_is_refused(broker, clients):
    alice = stomp(broker, clients, "alice", **{"client-id": "alice-app"})
    alice.subscribe("/topic/plant.>", "news", **{"activemq.subscriptionName": "news"})
    kept = mqtt3(broker, clients, "alice", client_id="alice-device", clean=False)
    assert kept.subscribe(("plant/#", 1)) == [1]

    broker.reload([ALICE, BOB, CAROL], REVOKED)
    assert "'/topic/plant.>'" in alice.wait_error().headers["message"]
    assert kept.closed.wait(TIMEOUT)  # type: ignore[attr-defined]
    broker.publish("/topic/plant.3", "while away")  # (the re-check ended both before the reload was logged)

    # Both durable subscriptions are kept (and collected the message) ...
    status, listing = broker.request("GET", "/api/v1/destinations")
    assert status == 200
    durables = {d["name"]: d["depth"] for d in listing if d["name"].startswith("durable:")}
    assert len(durables) == 2 and set(durables.values()) == {1}, durables
    # ... and resuming them is decided by the new map: refused.
    again = stomp(broker, clients, "alice", **{"client-id": "alice-app"})
    again.conn.subscribe("/topic/plant.>", "news", headers={"activemq.subscriptionName": "news"})
    assert "may not read '/topic/plant.>'" in again.wait_error().headers["message"]
    device = mqtt3(broker, clients, "alice", client_id="alice-device", clean=False)
    assert device.connacks[0][0] is True  # session present: kept, not deleted
    assert device.subscribe(("other/#", 1)) == [1]
    broker.publish("/topic/other.2", "mark")
    assert device.wait(1)[0].payload == b"mark"  # the kept backlog would have come first
    assert device.payloads == [b"mark"]
    refused = [e for e in broker.events("mqtt_subscribe_refused") if e.get("filter") == "plant/#"]
    assert refused and "may not read" in refused[-1]["reason"]


def test_a_removed_user_loses_every_connection_and_a_changed_password_keeps_them(broker, clients):
    bob = stomp(broker, clients, "bob")
    bob_v3 = mqtt3(broker, clients, "bob")
    bob_v5 = mqtt5(broker, clients, "bob")
    sock = WebSocketSocket(broker.admin_port, "/stomp", ["v12.stomp"])
    clients.append(sock)
    bob_ws = RawClient(None, sock=sock)
    bob_ws.connect(login="bob", passcode="bob-pw")
    alice = stomp(broker, clients, "alice")
    alice.subscribe("/topic/plant.>")

    # Bob goes; alice's password changes, which closes none of her connections.
    renewed = entry("alice", "another-pw", groups=["readers"])
    done = broker.reload([renewed, CAROL], GRANTED, signal_it=False)  # POST /api/v1/reload

    assert bob.wait_error().headers["message"] == "user 'bob' was removed by a configuration reload"
    ws_error = bob_ws.expect_error_and_close()
    assert ws_error.headers["message"] == "user 'bob' was removed by a configuration reload"
    assert bob_v5.wait_disconnect()[0] == NOT_AUTHORIZED
    assert bob_v3.closed.wait(TIMEOUT)  # type: ignore[attr-defined]
    assert done["users_removed"] == ["bob"] and done["connections_closed"] == 4, done
    broker.publish("/topic/plant.4", "for alice")
    assert alice.wait_messages(1)[0].body == b"for alice"
    assert alice.rec.errors == []


def test_turning_anonymous_access_off_closes_the_anonymous_connections(tmp_path, clients):
    grants = GRANTED.replace('read = ["readers"] }', 'read = ["readers", "anonymous"] }', 1)  # plant.> for guests too
    broker = Broker(tmp_path, [ALICE], grants, anonymous="true")
    try:
        guest = Client((HOST, broker.process.port))
        clients.append(guest)
        guest.connect()
        guest.subscribe("/topic/plant.>")
        guest_v5 = Paho5(broker.mqtt_port, unique("guest-"))
        clients.append(guest_v5)
        guest_v5.client._reconnect_on_failure = False
        assert guest_v5.subscribe("plant/#", 1) == [1]
        alice = stomp(broker, clients, "alice")
        alice.subscribe("/topic/plant.>")

        done = broker.reload([ALICE], grants)  # anonymous = "auto" with a user: off

        assert guest.wait_error().headers["message"] == "anonymous access was turned off by a configuration reload"
        assert guest_v5.wait_disconnect()[0] == NOT_AUTHORIZED
        assert done["connections_closed"] == 2, done
        broker.publish("/topic/plant.5", "for alice")
        assert alice.wait_messages(1)[0].body == b"for alice" and guest.bodies == []
    finally:
        assert broker.process.terminate() == 0
