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
from tests.support.auth_helpers import ACL, USERS as CLIENTS, login
from tests.support.helpers import unique, wait_for

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
     ("GET", "/api/v1/cluster"),
     ("POST", "/api/v1/destinations/queue%2Fx/purge")],
)
def test_everything_but_the_probes_needs_credentials(admin_broker, method, path):
    status, body, response = call(admin_broker, method, path, auth=None)
    assert status == 401 and response.getheader("WWW-Authenticate", "").startswith("Basic")
    assert json.loads(body)["status"] == 401 and json.loads(body)["reason"] == "credentials required"
    status, body, _ = call(admin_broker, method, path, auth=(WRITER[0], "wrong"))
    assert status == 401 and json.loads(body)["reason"] == "wrong user or password"


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


def test_a_single_node_is_its_own_cluster(admin_broker, stomp_client):
    """Without [ha] the cluster answers as HA tools expect, with role single."""
    stomp_client(admin_broker).send(f"/queue/{unique('single')}", b"p", persistent="true", receipt=True)
    status, body, _ = call(admin_broker, "GET", "/api/v1/cluster", auth=READER)
    doc = json.loads(body)
    assert status == 200 and (doc["role"], doc["epoch"], doc["failovers"]) == ("single", 0, 0) and doc["lsn"] >= 1
    assert doc["nodes"] == [{"node_id": "", "role": "single", "state": "single", "epoch": 0, "lsn": doc["lsn"],
                             "self": True}]
    text = call(admin_broker, "GET", "/metrics", auth=READER)[1].decode()
    ha = [s for family in text_string_to_metric_families(text) for s in family.samples if s.name.startswith("gateway_ha")]
    assert [(s.name, s.labels, s.value) for s in ha] == [("gateway_ha_role", {"role": "single"}, 1.0)]


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
    assert b'src="/console/pages.js"' in body
    status, script, response = call(admin_broker, "GET", "/console/pages.js", auth=None)
    assert status == 200 and response.getheader("Content-Type").startswith("text/javascript")
    assert b"/api/v1/destinations" in script and b"purge" in script


# -- cross-site requests and framing ------------------------------------------------


FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def test_a_cross_origin_form_post_is_refused_and_purges_nothing(admin_broker, stomp_client):
    queue = f"/queue/{unique('orders.csrf')}"
    fill(stomp_client, admin_broker, queue, 3)
    path = f"/api/v1/destinations/{queue[1:].replace('/', '%2F')}/purge"
    evil = {"Origin": "https://evil.example", **FORM}
    status, body, _ = call(admin_broker, "POST", path, b"", headers=evil)
    assert status == 403 and "cross-origin request from https://evil.example" in json.loads(body)["reason"]
    # Without Origin, a Referer from elsewhere says the same; a lying "null" origin too.
    assert call(admin_broker, "POST", path, headers={"Referer": "https://evil.example/page"})[0] == 403
    assert call(admin_broker, "POST", path, headers={"Origin": "null"})[0] == 403
    assert call(admin_broker, "DELETE", f"/api/v1/destinations{queue}", headers={"Origin": "http://localhost:1"})[0] == 403
    assert call(admin_broker, "GET", f"/api/v1/destinations{queue}")[1].count(b'"depth":3') == 1
    # The console's own page (same host and port), and a client with no Origin (curl), may.
    own = {"Origin": f"http://127.0.0.1:{admin_broker.admin_port}"}
    assert call(admin_broker, "POST", path, headers=own)[:2] == (200, b'{"purged":3}')
    fill(stomp_client, admin_broker, queue, 1)
    assert call(admin_broker, "POST", path)[:2] == (200, b'{"purged":1}')


def test_only_json_bodies_are_taken_where_json_is_expected(admin_broker, stomp_client):
    queue = f"/queue/{unique('ctype')}"
    path = f"/api/v1/destinations{queue}/messages"
    for kind in ("application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x"):
        status, body, _ = call(admin_broker, "POST", path, b'{"body": "x"}', headers={"Content-Type": kind})
        assert status == 415 and "application/json" in json.loads(body)["reason"]
    assert call(admin_broker, "POST", f"/api/v1/destinations{queue}/purge", b"", headers=FORM)[0] == 415
    status, _, _ = call(admin_broker, "POST", path, b'{"body": "x"}', headers={"Content-Type": "application/json; charset=utf-8"})
    assert status == 201


def test_an_allowed_origin_may_post(broker_factory):
    broker = broker_factory(admin={"users": USERS, "allowed_origins": ["https://ops.example"]})
    path = f"/api/v1/destinations/queue%2F{unique('allowed')}/messages"
    assert call(broker, "POST", path, {"body": "x"}, headers={"Origin": "https://ops.example"})[0] == 201
    assert call(broker, "POST", path, {"body": "x"}, headers={"Origin": "https://other.example"})[0] == 403


@pytest.mark.parametrize(("method", "path", "auth"), [
    ("GET", "/", WRITER), ("GET", "/healthz", None), ("GET", "/api/v1/destinations", None),
    ("GET", "/api/v1/nothing", WRITER), ("POST", "/api/v1/destinations/queue%2Fx/purge", WRITER),
])
def test_every_answer_forbids_framing_and_sniffing(admin_broker, method, path, auth):
    _, _, response = call(admin_broker, method, path, auth=auth)
    assert response.getheader("X-Frame-Options") == "DENY"
    assert "frame-ancestors 'none'" in response.getheader("Content-Security-Policy")
    assert response.getheader("X-Content-Type-Options") == "nosniff"
    assert response.getheader("Referrer-Policy") == "no-referrer"


def test_a_send_through_the_api_acts_as_the_operator_under_an_acl(broker_factory, stomp_client):
    broker = broker_factory(admin={"users": USERS}, auth={"users": CLIENTS, "acl": ACL})
    # Not granted to anyone as such: the operator's send creates the queue too.
    status, body, _ = call(broker, "POST", "/api/v1/destinations/queue%2Forders.eu/messages", {"body": "by ops"})
    assert status == 201, body
    consumer = stomp_client(broker, headers=login("reader"))
    consumer.subscribe("/queue/orders.eu")
    assert consumer.wait_messages(1)[0].body == b"by ops"
    # A reader stays a reader.
    assert call(broker, "POST", "/api/v1/destinations/queue%2Forders.eu/messages", {"body": "x"}, auth=READER)[0] == 403


# -- the admin API's password checks share the broker's one gate ----------------------


def basic(name, password):
    return {"Authorization": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}


def test_admin_login_failures_lock_the_address_out_without_hashing(broker_factory, stomp_client, monkeypatch):
    import hashlib

    broker = broker_factory(admin={"users": USERS}, auth={"max_failed_logins": 3, "failed_login_window_s": 60.0})
    for _ in range(3):
        assert call(broker, "GET", "/api/v1/destinations", auth=(WRITER[0], "guess"))[0] == 401
    runs = []
    real = hashlib.pbkdf2_hmac
    monkeypatch.setattr(hashlib, "pbkdf2_hmac", lambda *args: runs.append(args) or real(*args))
    # Locked out: even the right password is refused, unchecked, with the reason.
    status, body, response = call(broker, "GET", "/api/v1/destinations", auth=("someone", "new-guess"))
    assert status == 429 and "too many failed logins from 127.0.0.1" in json.loads(body)["reason"]
    assert int(response.getheader("Retry-After")) > 0
    assert call(broker, "GET", "/api/v1/destinations", auth=WRITER)[0] == 429
    assert runs == []
    assert call(broker, "GET", "/healthz", auth=None)[0] == 200  # the probes need no login
    # The messaging door keeps its own count: clients on this host still connect.
    stomp_client(broker).send(f"/queue/{unique('still')}", b"ok")


def test_hammering_admin_logins_do_not_hold_up_receipts(broker_factory, stomp_client, monkeypatch):
    import hashlib
    import random
    import threading

    from gateway.app import PASSWORD_THREADS

    # Slow hashes, and a lockout too lenient to help: every attempt costs a PBKDF2 run.
    slow = [{"name": "ops", "password_hash": hash_password("s3cret", iterations=200_000), "role": "write"}]
    broker = broker_factory(admin={"users": slow}, auth={"max_failed_logins": 1_000_000})
    hashing, most, lock, real = [0], [0], threading.Lock(), hashlib.pbkdf2_hmac

    def counted(*args):
        with lock:
            hashing[0] += 1
            most[0] = max(most[0], hashing[0])
        try:
            return real(*args)
        finally:
            with lock:
                hashing[0] -= 1

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counted)
    producer = stomp_client(broker)
    stop = threading.Event()
    answers = []

    def hammer():
        for _ in range(1000):
            if stop.is_set():
                return
            name = random.choice(["ops", f"u{random.randrange(10**6)}"])
            try:
                answers.append(call(broker, "GET", "/api/v1/destinations", auth=(name, str(random.random())))[0])
            except OSError:
                answers.append("refused")

    threads = [threading.Thread(target=hammer) for _ in range(40)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(answers) >= 20, timeout=30, what="admin login attempts under way")
        queue = f"/queue/{unique('durable')}"
        for i in range(5):  # each waits for its receipt, i.e. the store's write and fsync
            producer.send(queue, f"m{i}".encode(), persistent="true")
        assert not stop.is_set() and all(t.is_alive() for t in threads)  # still hammering meanwhile
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert set(answers) <= {401, 429, 503, "refused"} and 401 in answers
    assert 1 <= most[0] <= PASSWORD_THREADS  # hashing never took more threads than its own
    consumer = stomp_client(broker)
    consumer.subscribe(queue)
    assert consumer.wait_messages(5)


def test_a_full_admin_port_closes_the_extra_sockets_and_messaging_goes_on(broker_factory, stomp_client):
    cap, extra = 4, 3
    broker = broker_factory(admin={"users": USERS, "max_connections": cap, "request_timeout_s": 60.0})
    idle = [socket.create_connection(("127.0.0.1", broker.admin_port), timeout=5) for _ in range(cap + extra)]
    try:
        for sock in idle:
            sock.setblocking(False)

        def closed():
            count = 0
            for sock in idle:
                try:
                    count += sock.recv(1) == b""
                except BlockingIOError:
                    pass  # open and silent: being served
                except ConnectionResetError:
                    count += 1
            return count

        wait_for(lambda: closed() >= extra, what=f"{extra} sockets past the admin cap closed")
        assert closed() == extra
        # The messaging listeners are untouched by a full admin port.
        client = stomp_client(broker)
        queue = f"/queue/{unique('beside')}"
        client.subscribe(queue)
        client.send(queue, b"still here")
        assert client.wait_messages(1)[0].body == b"still here"
    finally:
        for sock in idle:
            sock.close()
    wait_for(lambda: healthy(broker), what="the admin port serving again")


def healthy(broker):
    try:
        return call(broker, "GET", "/healthz", auth=None)[0] == 200
    except OSError:  # still full: closed at accept
        return False


def test_admin_sockets_count_against_the_per_address_limit(broker_factory):
    broker = broker_factory(admin={"users": USERS, "request_timeout_s": 60.0}, max_connections_per_address=2)
    held = []
    for _ in range(2):  # each served (a kept-alive request answered) before the next opens
        held.append(socket.create_connection(("127.0.0.1", broker.admin_port), timeout=5))
        held[-1].sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert held[-1].recv(100).startswith(b"HTTP/1.1 200")
    try:
        assert not healthy(broker)  # a third from this address is closed at accept
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: healthy(broker), what="the address's slots given back")
