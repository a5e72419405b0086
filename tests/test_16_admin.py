"""The admin HTTP server through a real HTTP client: probes, metrics, the JSON
API, authentication, and bad or slow requests."""

from __future__ import annotations

import base64
import http.client
import json
import socket

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.auth import hash_password
from tests.helpers import unique, wait_for

WRITER = ("ops", "s3cret")
READER = ("viewer", "look")
USERS = [
    {"name": WRITER[0], "password_hash": hash_password(WRITER[1], iterations=1000), "role": "write"},
    {"name": READER[0], "password_hash": hash_password(READER[1], iterations=1000), "role": "read"},
]


@pytest.fixture
def admin_broker(broker_factory):
    return broker_factory(admin={"users": USERS, "request_timeout_s": 1.0, "max_request_bytes": 4096})


def call(broker, method, path, body=None, auth=WRITER, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", broker.admin_port, timeout=5)
    sent = dict(headers or {})
    if auth is not None:
        sent["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    if body is not None and not isinstance(body, bytes):
        body = json.dumps(body).encode()
        sent["Content-Type"] = "application/json"
    conn.request(method, path, body=body, headers=sent)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data, response


def fill(stomp_client, broker, queue, n):
    producer = stomp_client(broker)
    for i in range(n):
        producer.send(queue, f"m{i}".encode(), receipt=(i == n - 1))


def test_probes_are_open_and_readiness_says_ready(admin_broker):
    assert call(admin_broker, "GET", "/healthz", auth=None)[:2] == (200, b"ok\n")
    assert call(admin_broker, "GET", "/readyz", auth=None)[0] == 200


def test_readiness_turns_503_once_draining(admin_broker):
    admin_broker.call(lambda: setattr(admin_broker.running.server, "stopping", True))
    assert call(admin_broker, "GET", "/readyz", auth=None)[0] == 503
    admin_broker.call(lambda: setattr(admin_broker.running.server, "stopping", False))


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/metrics"), ("GET", "/api/v1/destinations"), ("GET", "/api/v1/connections"), ("GET", "/"),
     ("POST", "/api/v1/destinations/queue%2Fx/purge")],
)
def test_everything_but_the_probes_needs_credentials(admin_broker, method, path):
    status, body, response = call(admin_broker, method, path, auth=None)
    assert status == 401 and response.getheader("WWW-Authenticate", "").startswith("Basic")
    assert json.loads(body)["status"] == 401
    assert call(admin_broker, method, path, auth=(WRITER[0], "wrong"))[0] == 401


def test_a_reader_may_read_but_not_write(admin_broker, stomp_client):
    queue = f"/queue/{unique('ro')}"
    fill(stomp_client, admin_broker, queue, 2)
    assert call(admin_broker, "GET", "/api/v1/destinations", auth=READER)[0] == 200
    status, body, _ = call(admin_broker, "POST", f"/api/v1/destinations{queue}/purge", auth=READER)
    assert status == 403 and "read" in json.loads(body)["reason"]


def test_without_admin_users_the_api_is_locked(broker):
    assert call(broker, "GET", "/api/v1/destinations", auth=None)[0] == 403
    assert call(broker, "GET", "/healthz", auth=None)[0] == 200


def test_destinations_browse_purge_and_delete(admin_broker, stomp_client):
    queue = f"/queue/{unique('api')}"
    fill(stomp_client, admin_broker, queue, 5)
    status, body, _ = call(admin_broker, "GET", "/api/v1/destinations")
    listed = {d["name"]: d for d in json.loads(body)}
    assert status == 200 and listed[queue]["depth"] == 5 and listed[queue]["type"] == "queue"
    status, body, _ = call(admin_broker, "GET", f"/api/v1/destinations{queue}")
    assert json.loads(body)["enqueued"] == 5
    status, body, _ = call(admin_broker, "GET", f"/api/v1/destinations{queue}/messages?limit=2")
    browsed = json.loads(body)
    assert [m["body"] for m in browsed] == ["m0", "m1"]
    assert json.loads(call(admin_broker, "GET", f"/api/v1/destinations{queue}")[1])["depth"] == 5  # not consumed
    status, body, _ = call(admin_broker, "POST", f"/api/v1/destinations{queue}/purge")
    assert (status, json.loads(body)) == (200, {"purged": 5})
    status, body, _ = call(admin_broker, "DELETE", "/api/v1/destinations/" + queue.lstrip("/"))
    assert status == 200
    assert call(admin_broker, "GET", f"/api/v1/destinations{queue}")[0] == 404


def test_a_queue_with_consumers_is_not_deleted(admin_broker, stomp_client):
    queue = f"/queue/{unique('busy')}"
    stomp_client(admin_broker).subscribe(queue)
    status, body, _ = call(admin_broker, "DELETE", f"/api/v1/destinations{queue}")
    assert status == 409 and "consumers" in json.loads(body)["reason"]


def test_a_queue_holding_messages_is_deleted_only_with_force(admin_broker, stomp_client):
    queue = f"/queue/{unique('full')}"
    fill(stomp_client, admin_broker, queue, 3)
    status, body, _ = call(admin_broker, "DELETE", f"/api/v1/destinations{queue}")
    refused = json.loads(body)
    assert (status, refused["status"], refused["depth"]) == (409, 409, 3)
    assert "3 messages" in refused["reason"] and "force=true" in refused["reason"]
    assert json.loads(call(admin_broker, "GET", f"/api/v1/destinations{queue}")[1])["depth"] == 3  # untouched
    status, body, _ = call(admin_broker, "DELETE", f"/api/v1/destinations{queue}?force=true")
    assert (status, json.loads(body)) == (200, {"deleted": 3})
    assert call(admin_broker, "GET", f"/api/v1/destinations{queue}")[0] == 404


def test_a_forced_delete_removes_stored_messages_for_good(broker_factory, stomp_client):
    settings = {"admin": {"users": USERS}}
    broker = broker_factory(**settings)
    queue = f"/queue/{unique('stored')}"
    producer = stomp_client(broker)
    for i in range(3):
        producer.send(queue, f"m{i}".encode(), persistent="true")
    producer.close()
    status, body, _ = call(broker, "DELETE", f"/api/v1/destinations{queue}?force=true")
    assert (status, json.loads(body)) == (200, {"deleted": 3})
    broker.stop()
    broker = broker_factory(**settings)  # the same data folder
    assert call(broker, "GET", f"/api/v1/destinations{queue}")[0] == 404
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    consumer.barrier()
    assert consumer.bodies == []


def test_sending_through_the_api_reaches_a_stomp_consumer(admin_broker, stomp_client):
    queue = f"/queue/{unique('send')}"
    consumer = stomp_client(admin_broker)
    consumer.subscribe(queue)
    status, body, _ = call(admin_broker, "POST", f"/api/v1/destinations{queue}/messages",
                           {"body": "from the console", "headers": {"k": "v"}})
    assert status == 201 and json.loads(body)["message_id"]
    message = consumer.wait_messages(1)[0]
    assert message.body == b"from the console" and message.headers["k"] == "v"
    assert call(admin_broker, "POST", f"/api/v1/destinations{queue}/messages", b"not json")[0] == 400


def test_connections_are_listed_and_one_can_be_closed(admin_broker, stomp_client):
    victim = stomp_client(admin_broker, headers={"client-id": "victim"})
    status, body, _ = call(admin_broker, "GET", "/api/v1/connections")
    connections = json.loads(body)
    target = [c for c in connections if c["client_id"] == "victim"]
    assert status == 200 and len(target) == 1 and target[0]["protocol"] == "stomp"
    assert call(admin_broker, "DELETE", f"/api/v1/connections/{target[0]['id']}")[0] == 200
    error = victim.wait_error()
    assert "administrator" in error.headers["message"]
    assert call(admin_broker, "DELETE", "/api/v1/connections/nope")[0] == 404


def test_metrics_parse_and_move_when_messages_flow(admin_broker, stomp_client):
    def sample(name, labels=None):
        text = call(admin_broker, "GET", "/metrics")[1].decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and (labels is None or all(s.labels.get(k) == v for k, v in labels.items())):
                    return s.value
        return None

    queue = f"/queue/{unique('metrics')}"
    before = sample("gateway_messages_published_total")
    fill(stomp_client, admin_broker, queue, 3)
    assert sample("gateway_messages_published_total") == before + 3
    assert sample("gateway_destination_depth", {"destination": queue}) == 3
    assert sample("gateway_connections", {"protocol": "stomp"}) >= 1
    assert sample("gateway_received_bytes_total") > 0
    assert sample("process_resident_memory_bytes") > 10_000_000
    stomp_client(admin_broker).send(queue, b"p", persistent="true")
    wait_for(lambda: (sample("gateway_store_write_seconds_count") or 0) > 0, what="a store write observed")


def test_malformed_oversized_and_unknown_requests_get_4xx(admin_broker):
    assert call(admin_broker, "GET", "/api/v1/nothing")[0] == 404
    assert call(admin_broker, "POST", "/api/v1/destinations/queue%2Fx/messages", b"x" * 10_000)[0] == 413
    assert call(admin_broker, "GET", "/api/v1/destinations/not-a-destination")[0] == 400
    with socket.create_connection(("127.0.0.1", admin_broker.admin_port), timeout=5) as raw:
        raw.sendall(b"NONSENSE\r\n\r\n")
        assert raw.recv(100).startswith(b"HTTP/1.1 400")
    with socket.create_connection(("127.0.0.1", admin_broker.admin_port), timeout=5) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n")
        assert raw.recv(100)[:12] in (b"HTTP/1.1 431", b"HTTP/1.1 400")


def test_a_client_that_never_finishes_its_request_is_cut_off(admin_broker):
    with socket.create_connection(("127.0.0.1", admin_broker.admin_port), timeout=5) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        answer = raw.recv(100)  # within the socket's 5 s: request_timeout_s is 1
        assert answer.startswith(b"HTTP/1.1 408")
    assert call(admin_broker, "GET", "/healthz", auth=None)[0] == 200  # the server is fine


def test_the_console_page_is_served(admin_broker):
    status, body, response = call(admin_broker, "GET", "/")
    assert status == 200 and response.getheader("Content-Type").startswith("text/html")
    assert b"/api/v1/destinations" in body and b"purge" in body
