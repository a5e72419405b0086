"""Topic archives end to end: stomp.py and paho publish to archived topics,
http.client reads /api/v1/archive and pyarrow decodes the stream; retention,
bad ranges, auth, SIGKILL, and idempotent COMMIT."""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import stomp
from prometheus_client.parser import text_string_to_metric_families

from gateway.auth import hash_password
from persistence.settings import StoreSettings
from tests.support.helpers import unique, wait_for
from tests.support.processes import BrokerProcess, accepting, free_port

READER = ("viewer", "look")
# An archive reader (Spark, say) reads message contents: the browse role.
USERS = [{"name": READER[0], "password_hash": hash_password(READER[1], iterations=1000), "role": "browse"}]
ARCHIVED = [{"destination": "/topic/plant.>", "archive": True}]
ARROW = "application/vnd.apache.arrow.stream"
SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("offset", pa.int64()),
    ("message_id", pa.string()),
    ("timestamp", pa.timestamp("ms", tz="UTC")),
    ("priority", pa.int32()),
    ("headers", pa.map_(pa.string(), pa.string())),
    ("body", pa.binary()),
])


def get(port: int, path: str, auth: tuple[str, str] | None = READER) -> tuple[int, bytes, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data, response


def read_range(port: int, topic: str, query: str = "") -> pa.Table:
    status, data, response = get(port, f"/api/v1/archive/{topic}/messages{query}")
    assert status == 200, data
    assert response.getheader("content-type") == ARROW
    assert response.getheader("transfer-encoding") == "chunked"
    return pa.ipc.open_stream(data).read_all()


@pytest.fixture
def archive_broker(broker_factory):
    def start(policies: list[dict[str, Any]] = ARCHIVED, **store: Any) -> Any:
        return broker_factory(
            broker={"policies": policies}, admin={"users": USERS}, store=StoreSettings(sync="always", **store)
        )

    return start


def test_stomp_and_mqtt_publishes_are_kept_in_order_and_read_back_as_arrow(archive_broker, stomp_client, paho):
    broker = archive_broker()
    producer = stomp_client(broker)
    producer.send("/topic/plant.1.temp", b"s0", persistent="true", unit="C", priority="7")
    producer.send("/topic/plant.1.temp", b"s1", unit="F")  # not persistent: archived all the same
    device = paho(broker, "dev-1")
    device.publish("plant/1/temp", b"m2", qos=1)
    device.publish("plant/1/temp", b"\x00\xffm3", qos=0)
    producer.send("/topic/other.1.temp", b"not archived")
    producer.send("/topic/plant.1.temp", b"s4", receipt=True)

    status, data, _ = get(broker.admin_port, "/api/v1/archive/plant.1.temp")
    assert status == 200
    view = json.loads(data)
    assert (view["topic"], view["earliest"], view["latest"], view["messages"]) == ("plant.1.temp", 0, 5, 5)
    assert view["bytes"] > 0

    table = read_range(broker.admin_port, "plant.1.temp")
    assert table.schema == SCHEMA
    rows = table.to_pylist()
    assert [r["offset"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["body"] for r in rows] == [b"s0", b"s1", b"m2", b"\x00\xffm3", b"s4"]
    assert {r["topic"] for r in rows} == {"plant.1.temp"}
    assert rows[0]["priority"] == 7 and rows[1]["priority"] == 4
    assert dict(rows[0]["headers"]) == {"unit": "C"}  # user headers only: no priority, persistent, receipt
    assert dict(rows[1]["headers"]) == {"unit": "F"}
    # MQTT 3.1.1 carries no headers; the archive keeps its QoS (and RETAIN flag, when set).
    assert rows[2]["headers"] == [("mqtt-qos", "1")] and rows[3]["headers"] == [("mqtt-qos", "0")]
    assert len({r["message_id"] for r in rows}) == 5
    now = time.time()
    assert all(abs(r["timestamp"].timestamp() - now) < 60 for r in rows)
    assert get(broker.admin_port, "/api/v1/archive/other.1.temp")[0] == 404

    part = read_range(broker.admin_port, "plant.1.temp", "?from=2&to=4").to_pylist()
    assert [(r["offset"], r["body"]) for r in part] == [(2, b"m2"), (3, b"\x00\xffm3")]
    # `to` beyond latest is clamped; from == latest is an empty stream with the schema.
    assert read_range(broker.admin_port, "plant.1.temp", "?from=3&to=999").num_rows == 2
    empty = read_range(broker.admin_port, "plant.1.temp", "?from=5")
    assert empty.num_rows == 0 and empty.schema == SCHEMA


def test_listing_by_pattern_sorted_and_url_encoded_topics(archive_broker, stomp_client):
    broker = archive_broker()
    producer = stomp_client(broker)
    for topic in ("plant.2.temp", "plant.1.temp", "plant.1.rpm", "plant.1.temp"):
        producer.send(f"/topic/{topic}", b"x")
    status, data, _ = get(broker.admin_port, "/api/v1/archive?pattern=plant.*.temp")
    assert status == 200
    topics = json.loads(data)["topics"]
    assert [(t["topic"], t["earliest"], t["latest"], t["messages"]) for t in topics] == [
        ("plant.1.temp", 0, 2, 2), ("plant.2.temp", 0, 1, 1)
    ]
    everything = json.loads(get(broker.admin_port, "/api/v1/archive")[1])["topics"]
    assert [t["topic"] for t in everything] == ["plant.1.rpm", "plant.1.temp", "plant.2.temp"]
    # An MQTT level with a dot is escaped in the core name; URL-encoded in the path.
    producer.send("/topic/plant.v1%2E0.temp", b"dotted")
    status, data, _ = get(broker.admin_port, "/api/v1/archive/plant.v1%252E0.temp")
    assert status == 200 and json.loads(data)["latest"] == 1
    assert get(broker.admin_port, "/api/v1/archive?pattern=plant..x")[0] == 400
    metrics = get(broker.admin_port, "/metrics")[1].decode()
    assert 'gateway_archive_latest_offset{topic="plant.1.temp"} 2' in metrics
    assert 'gateway_archive_earliest_offset{topic="plant.2.temp"} 0' in metrics
    assert {f.name for f in text_string_to_metric_families(metrics)} >= {"gateway_archive_bytes", "gateway_archive_latest_offset"}


def test_the_archive_needs_the_admin_credentials(archive_broker, broker_factory, stomp_client):
    locked = broker_factory(broker={"policies": ARCHIVED})  # no admin user at all
    assert get(locked.admin_port, "/api/v1/archive")[0] == 403
    locked.stop()
    broker = archive_broker()
    stomp_client(broker).send("/topic/plant.9", b"x")
    assert get(broker.admin_port, "/api/v1/archive", auth=None)[0] == 401
    assert get(broker.admin_port, "/api/v1/archive/plant.9/messages", auth=("viewer", "wrong"))[0] == 401
    assert get(broker.admin_port, "/api/v1/archive/plant.9/messages")[0] == 200  # the browse role suffices


def test_bad_ranges_get_clear_errors(archive_broker, stomp_client):
    broker = archive_broker()
    producer = stomp_client(broker)
    for i in range(3):
        producer.send("/topic/plant.r", f"m{i}")
    for query, status in [("?from=4", 416), ("?from=2&to=1", 416), ("?from=-1", 400), ("?from=x", 400),
                          ("?to=1.5", 400)]:
        got, data, response = get(broker.admin_port, f"/api/v1/archive/plant.r/messages{query}")
        assert got == status, (query, data)
        assert response.getheader("content-type") == "application/json"
        assert json.loads(data)["status"] == status and json.loads(data)["reason"]
    assert get(broker.admin_port, "/api/v1/archive/plant.*")[0] == 400
    assert get(broker.admin_port, "/api/v1/archive/nothing.here/messages")[0] == 404
    assert get(broker.admin_port, "/api/v1/archive/plant.r/other")[0] == 404


def test_retention_by_bytes_drops_old_segments_and_a_read_of_them_says_so(archive_broker, stomp_client):
    policies = [{"destination": "/topic/plant.>", "archive": True, "archive_retention_bytes": 4096}]
    broker = archive_broker(policies, archive_segment_bytes=1024, maintenance_interval_s=0.05)
    producer = stomp_client(broker)
    body = b"x" * 100
    for _ in range(100):
        producer.send("/topic/plant.kept", body, receipt=False)
    producer.send("/topic/plant.kept", body)

    def dropped() -> dict[str, Any] | None:
        view = json.loads(get(broker.admin_port, "/api/v1/archive/plant.kept")[1])
        return view if view["earliest"] > 0 else None

    view = wait_for(dropped, what="retention to drop old segments")
    assert view["latest"] == 101 and view["bytes"] <= 4096 + 1024
    earliest = view["earliest"]
    status, data, _ = get(broker.admin_port, "/api/v1/archive/plant.kept/messages?from=0")
    assert status == 410
    assert json.loads(data) == {
        "status": 410, "earliest": earliest,
        "reason": f"offsets 0..{earliest - 1} of plant.kept were dropped by retention; earliest is {earliest}",
    }
    rest = read_range(broker.admin_port, "plant.kept", f"?from={earliest}")
    assert rest.column("offset").to_pylist() == list(range(earliest, 101))


def test_retention_by_age_drops_everything_old_but_keeps_counting(archive_broker, stomp_client):
    policies = [{"destination": "/topic/plant.>", "archive": True, "archive_retention_s": 1}]
    broker = archive_broker(policies, maintenance_interval_s=0.1)
    producer = stomp_client(broker)
    for i in range(3):
        producer.send("/topic/plant.old", f"m{i}")
    view = wait_for(
        lambda: (v := json.loads(get(broker.admin_port, "/api/v1/archive/plant.old")[1]))["earliest"] == 3 and v,
        timeout=10, what="age retention",
    )
    assert view["latest"] == 3 and view["messages"] == 0
    assert get(broker.admin_port, "/api/v1/archive/plant.old/messages?from=1")[0] == 410
    producer.send("/topic/plant.old", b"new")
    assert read_range(broker.admin_port, "plant.old", "?from=3").column("offset").to_pylist() == [3]


def test_offsets_survive_a_restart(archive_broker, stomp_client, broker_factory, tmp_path):
    broker = archive_broker()
    producer = stomp_client(broker)
    for i in range(3):
        producer.send("/topic/plant.again", f"a{i}")
    producer.close()
    broker.stop()
    again = archive_broker()
    stomp_client(again).send("/topic/plant.again", b"b3")
    table = read_range(again.admin_port, "plant.again")
    assert list(zip(table.column("offset").to_pylist(), table.column("body").to_pylist())) == [
        (0, b"a0"), (1, b"a1"), (2, b"a2"), (3, b"b3")
    ]


# -- SIGKILL ---------------------------------------------------------------------


def test_every_receipted_persistent_message_is_archived_after_sigkill(tmp_path: Path, stomp_client):
    admin_port = free_port()
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[[broker.policies]]\ndestination = "/topic/plant.>"\narchive = true\n'
        f'[admin]\nusers = [{{name = "{READER[0]}", password_hash = "{USERS[0]["password_hash"]}", role = "browse"}}]\n'
        "[store]\narchive_segment_bytes = 65536\n"
    )
    process = BrokerProcess(tmp_path, "--config", str(config), "--admin-port", str(admin_port))
    receipted: set[bytes] = set()
    try:
        for round_ in range(3):
            process.start()
            stop = threading.Event()
            errors: list[BaseException] = []

            def produce(name: str, round_: int = round_, stop: threading.Event = stop) -> None:
                client = stomp_client(("127.0.0.1", process.port))
                try:
                    for i in range(100_000):
                        if stop.is_set():
                            return
                        body = f"{round_}.{name}.{i}".encode()
                        client.send("/topic/plant.crash", body, persistent="true")
                        receipted.add(body)
                except Exception as exc:  # the broker died under it: expected
                    errors.append(exc)

            threads = [threading.Thread(target=produce, args=(f"p{k}",)) for k in range(3)]
            for thread in threads:
                thread.start()
            wait_for(lambda: len(receipted) >= 300 * (round_ + 1), timeout=20, what="receipts")
            process.kill()
            stop.set()
            for thread in threads:
                thread.join(10)
        process.start()
        # The admin port opens just after the STOMP port that start() waits for.
        wait_for(lambda: accepting(admin_port), what="the admin port")
        table = read_range(admin_port, "plant.crash")
    finally:
        process.kill()
    offsets = table.column("offset").to_pylist()
    bodies = table.column("body").to_pylist()
    assert offsets == list(range(len(offsets)))  # contiguous from 0
    assert len(bodies) == len(set(bodies))  # none twice
    missing = receipted - set(bodies)
    assert not missing, f"{len(missing)} receipted messages not archived, e.g. {sorted(missing)[:5]}"


# -- idempotent COMMIT ----------------------------------------------------------------


class ReceiptHeaders(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.by_id: dict[str, dict[str, str]] = {}

    def on_receipt(self, frame: Any) -> None:
        self.by_id[frame.headers["receipt-id"]] = dict(frame.headers)


def commit_batch(client: Any, key: str, bodies: list[bytes]) -> dict[str, str]:
    """One transaction as the Spark writer sends it; the COMMIT's RECEIPT headers."""
    listener = client.conn.get_listener("receipt-headers")
    if listener is None:
        listener = ReceiptHeaders()
        client.conn.set_listener("receipt-headers", listener)
    tx = unique("tx-")
    client.conn.begin(tx)
    for body in bodies:
        client.conn.send("/queue/sink", body, headers={"transaction": tx, "persistent": "true"})
    rid = unique("commit-")
    client.conn.commit(tx, headers={"receipt": rid, "idempotency-key": key})
    client.wait_receipt(rid)
    return listener.by_id[rid]


def test_a_replayed_commit_with_the_same_key_is_discarded_even_after_a_restart(archive_broker, stomp_client):
    broker = archive_broker()
    producer = stomp_client(broker)
    assert "duplicate" not in commit_batch(producer, "batch-7", [b"a", b"b"])
    assert commit_batch(producer, "batch-7", [b"a", b"b"])["duplicate"] == "true"  # the same batch, replayed
    assert "duplicate" not in commit_batch(producer, "batch-8", [b"c"])
    producer.close()
    broker.stop()
    again = archive_broker()
    producer = stomp_client(again)
    assert commit_batch(producer, "batch-8", [b"c"])["duplicate"] == "true"  # remembered across the restart
    assert "duplicate" not in commit_batch(producer, "batch-9", [b"d"])
    consumer = stomp_client(again)
    consumer.subscribe("/queue/sink")
    consumer.wait_messages(4)
    consumer.barrier()
    assert sorted(consumer.bodies) == [b"a", b"b", b"c", b"d"]


def test_a_reader_that_hangs_up_mid_stream_harms_nobody(archive_broker, stomp_client):
    broker = archive_broker()
    producer = stomp_client(broker)
    body = b"z" * 4096
    for i in range(2000):  # about 8 MiB: far more than the socket buffers hold
        producer.send("/topic/plant.big", body, receipt=(i == 1999))
    conn = http.client.HTTPConnection("127.0.0.1", broker.admin_port, timeout=10)
    token = base64.b64encode(f"{READER[0]}:{READER[1]}".encode()).decode()
    conn.request("GET", "/api/v1/archive/plant.big/messages", headers={"Authorization": "Basic " + token})
    response = conn.getresponse()
    assert response.status == 200 and len(response.read(1024)) == 1024
    conn.close()  # gone with most of the body unsent
    producer.send("/topic/plant.big", b"after")
    table = read_range(broker.admin_port, "plant.big", "?from=1990")
    assert table.column("body").to_pylist() == [body] * 10 + [b"after"]
