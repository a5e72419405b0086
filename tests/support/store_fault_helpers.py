"""What the store-fault tests (tests/e2e/test_store_*.py) share: filling and
draining a queue over raw STOMP, and reading a figure off /metrics as a
read-only admin user."""

from __future__ import annotations

import base64
import http.client

from gateway.auth import hash_password
from tests.support.helpers import RawClient

PERSISTENT = {"persistent": "true"}


def fill(port: int, queue: str, count: int) -> None:
    client = RawClient(("127.0.0.1", port))
    try:
        client.connect(heart_beat="0,0")
        for i in range(count):
            client.send_frame("SEND", {"destination": queue, "receipt": f"r{i}", **PERSISTENT}, f"body-{i:04d}".encode() * 8)
            client.receipt(f"r{i}")
    finally:
        client.close()


def drain(port: int, queue: str) -> list[bytes]:
    client = RawClient(("127.0.0.1", port))
    try:
        client.connect(heart_beat="0,0")
        client.send_frame("SUBSCRIBE", {"destination": queue, "id": "1"})
        bodies = []
        for frame in client.quiet_for(1.0):
            assert frame.command == "MESSAGE", frame
            bodies.append(frame.body)
        return bodies
    finally:
        client.close()


VIEWER = ("viewer", "look")
ADMIN = {"users": [{"name": VIEWER[0], "password_hash": hash_password(VIEWER[1], iterations=1000), "role": "read"}]}


def metric(broker, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    conn = http.client.HTTPConnection("127.0.0.1", broker.admin_port, timeout=5)
    token = base64.b64encode(f"{VIEWER[0]}:{VIEWER[1]}".encode()).decode()
    conn.request("GET", "/metrics", headers={"Authorization": f"Basic {token}"})
    text = conn.getresponse().read().decode()
    conn.close()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"no {name} in /metrics")
