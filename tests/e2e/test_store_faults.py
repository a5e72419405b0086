"""What an operator sees when the disk misbehaves: a flipped bit in the
journal, a full disk, and the offline `gateway store check|compact` tools."""

from __future__ import annotations

import base64
import errno
import http.client
import json
import os
import signal
import subprocess
import time

import pytest

from gateway.auth import hash_password
from tests.helpers import RawClient, encode_frame, unique, wait_for
from tests.processes import GATEWAY, free_port

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


def test_a_flipped_bit_mid_journal_is_logged_with_its_position_and_skipped(gateway, tmp_path):
    port = free_port()
    data = tmp_path / "d"
    queue = f"/queue/{unique('bits')}"
    process = gateway("--stomp-port", str(port), "--data-dir", str(data), "--log-format", "json")
    process.wait_listening(port)
    fill(port, queue, 50)
    process.proc.send_signal(signal.SIGKILL)  # no checkpoint: recovery must read the journal
    process.wait_exit()
    segment = sorted((data / "store").glob("*.log"))[0]
    raw = bytearray(segment.read_bytes())
    target = raw.find(b"body-0025")  # inside the 26th message's body
    assert target > 0
    raw[target] ^= 0x01
    segment.write_bytes(bytes(raw))

    again = gateway("--stomp-port", str(port), "--data-dir", str(data), "--log-format", "json")
    again.wait_listening(port)
    bodies = drain(port, queue)
    again.signal(signal.SIGTERM)
    assert again.wait_exit() == 0
    events = [json.loads(line) for line in again.stderr.splitlines() if line.startswith("{")]
    corrupt = [e for e in events if e["event"] == "record_corrupt"]
    assert len(corrupt) == 1 and corrupt[0]["level"] == "warning"
    assert corrupt[0]["segment"].endswith(segment.name) and 0 < corrupt[0]["offset"] < target
    expected = [f"body-{i:04d}".encode() * 8 for i in range(50) if i != 25]
    assert bodies == expected


def test_a_full_disk_fails_the_sends_it_cannot_store_and_the_broker_recovers(broker, monkeypatch):
    queue = f"/queue/{unique('full')}"
    healthy = RawClient(broker.stomp_address)
    healthy.connect(heart_beat="0,0")
    healthy.send_frame("SEND", {"destination": queue, "receipt": "before", **PERSISTENT}, b"stored")
    healthy.receipt("before")

    real_pwrite = os.pwrite

    def disk_full(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", disk_full)
    victim = RawClient(broker.stomp_address)
    victim.connect(heart_beat="0,0")
    victim.send_frame("SEND", {"destination": queue, "receipt": "lost", **PERSISTENT}, b"unstorable")
    error = victim.expect_error_and_close()
    assert "No space left" in error.headers["message"]
    assert error.headers["receipt-id"] == "lost"  # which SEND failed
    assert "RECEIPT" not in [f.command for f in victim.frames]
    # Non-persistent traffic keeps flowing meanwhile, on the healthy connection.
    healthy.send_frame("SEND", {"destination": "/topic/ping", "receipt": "still"}, b"")
    healthy.receipt("still")

    monkeypatch.setattr(os, "pwrite", real_pwrite)  # space is back
    later = RawClient(broker.stomp_address)
    later.connect(heart_beat="0,0")
    later.send_frame("SEND", {"destination": queue, "receipt": "after", **PERSISTENT}, b"stored again")
    wait_for(lambda: later.receipt("after", timeout=5), timeout=10, what="a receipt once space returned")
    store = broker.running.store
    assert broker.call(lambda: store.durable_lsn >= store.appended_lsn or store.stats()["pending_bytes"] == 0)
    for client in (healthy, victim, later):
        client.close()


def test_a_full_disk_names_every_withdrawn_receipt_of_the_sends_in_flight(broker, monkeypatch):
    queue = f"/queue/{unique('full')}"
    producer = RawClient(broker.stomp_address)
    producer.connect(heart_beat="0,0")

    def disk_full(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", disk_full)
    # Three SENDs in flight at once, as a pipelining producer has them.
    producer.send(b"".join(
        encode_frame("SEND", {"destination": queue, "receipt": f"lost-{i}", **PERSISTENT}, b"unstorable") for i in range(3)
    ))
    error = producer.expect_error_and_close()
    assert error.headers["receipt-id"] == "lost-0"
    named = {line.split()[1] for line in error.body.decode().splitlines() if line.startswith("receipt ")}
    assert "lost-0" in named and named <= {"lost-0", "lost-1", "lost-2"}
    assert "RECEIPT" not in [f.command for f in producer.frames]
    producer.close()


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GATEWAY, "store", *args], capture_output=True, text=True, timeout=60)


def test_store_check_and_compact_report_what_the_folder_holds(gateway, tmp_path):
    port = free_port()
    data = tmp_path / "d"
    queue = f"/queue/{unique('tool')}"
    process = gateway("--stomp-port", str(port), "--data-dir", str(data))
    process.wait_listening(port)
    fill(port, queue, 20)
    running = run_tool("check", str(data))
    assert running.returncode != 0 and "running broker" in running.stderr  # the broker holds the folder
    process.signal(signal.SIGTERM)
    assert process.wait_exit() == 0

    check = run_tool("check", str(data))
    assert check.returncode == 0, check.stderr
    assert queue in check.stdout and "20" in check.stdout
    compact = run_tool("compact", str(data))
    assert compact.returncode == 0, compact.stderr
    again = gateway("--stomp-port", str(port), "--data-dir", str(data))
    again.wait_listening(port)
    assert len(drain(port, queue)) == 20


def test_store_check_on_a_folder_without_a_store_says_so(tmp_path):
    result = run_tool("check", str(tmp_path))
    assert result.returncode == 2 and "no store" in result.stderr


def test_store_check_reads_the_topic_archives_too(gateway, tmp_path):
    port = free_port()
    data = tmp_path / "d"
    config = tmp_path / "archive.toml"
    config.write_text('[[broker.policies]]\ndestination = "/topic/plant.>"\narchive = true\n[store]\narchive_segment_bytes = 4096\n')
    process = gateway("--config", str(config), "--stomp-port", str(port), "--data-dir", str(data))
    process.wait_listening(port)
    fill(port, "/topic/plant.7.temp", 100)
    process.signal(signal.SIGTERM)
    assert process.wait_exit() == 0
    check = run_tool("check", str(data))
    assert check.returncode == 0, check.stderr
    assert "plant.7.temp:" in check.stdout and "records: 100" in check.stdout and "next_offset: 100" in check.stdout
    segments = sorted((data / "archive" / "plant.7.temp").glob("*.seg"))
    assert len(segments) > 2
    damaged = bytearray(segments[0].read_bytes())
    damaged[30] ^= 0xFF
    segments[0].write_bytes(bytes(damaged))
    check = run_tool("check", str(data))
    assert check.returncode == 1 and "unreadable" in check.stdout


# -- a damaged record found only when its body is read -------------------------
# A clean start trusts the checkpoint and leaves bodies on disk until dispatch,
# so a flipped byte shows up then: that one message is lost, nothing else.

DAMAGED = 17
COUNT = 40
LAZY = {"resident_messages": 4}  # most of a backlog waits as stubs while running, too
VIEWER = ("viewer", "look")
ADMIN = {"users": [{"name": VIEWER[0], "password_hash": hash_password(VIEWER[1], iterations=1000), "role": "read"}]}


def start(broker_factory):
    return broker_factory(broker=LAZY, admin=ADMIN)


def body(i: int) -> bytes:
    return f"m{i:04d}-".encode() * 170  # about 1 KiB, unique per message


def flip_body_byte(data_dir, marker: bytes) -> None:
    """Flip one byte in the middle of the one journal record holding ``marker``."""
    hits = []
    for segment in sorted((data_dir / "store").glob("*.log")):
        raw = bytearray(segment.read_bytes())
        at = raw.find(marker)
        if at >= 0:
            assert raw.find(marker, at + 1) < 0, "the body is in the journal twice"
            hits.append((segment, raw, at))
    [(segment, raw, at)] = hits
    raw[at + len(marker) // 2] ^= 0x01
    segment.write_bytes(bytes(raw))


def corrupt_records_metric(broker) -> float:
    return metric(broker, "gateway_store_corrupt_records_total")


def restart_damaged(broker_factory, broker, data_dir):
    broker.stop()  # clean: checkpoint written, bodies left to lazy reads
    flip_body_byte(data_dir, body(DAMAGED))
    return start(broker_factory)


def corrupt_log_lines(capfd) -> list[str]:
    return [line for line in capfd.readouterr().err.splitlines() if "record_corrupt" in line]


@pytest.mark.parametrize("ack", ["auto", "client-individual"])
def test_a_damaged_record_read_on_dispatch_loses_only_its_message(capfd, broker_factory, stomp_client, tmp_path, ack):
    broker = start(broker_factory)
    queue = f"/queue/{unique('corr')}"
    producer = stomp_client(broker)
    for i in range(COUNT):
        producer.send(queue, body(i), **PERSISTENT)  # each with a receipt
    producer.close()
    broker = restart_damaged(broker_factory, broker, tmp_path / "data")
    capfd.readouterr()

    consumer = stomp_client(broker)
    consumer.subscribe(queue, "s", ack=ack)
    expected = [body(i) for i in range(COUNT) if i != DAMAGED]
    consumer.wait_messages(COUNT - 1)
    consumer.barrier()  # the connection is up and nothing more came
    assert consumer.bodies == expected
    assert consumer.rec.errors == []
    if ack == "client-individual":
        for message in consumer.messages:
            consumer.conn.ack(message.headers["ack"])
        consumer.barrier()
    assert corrupt_records_metric(broker) == 1
    [line] = corrupt_log_lines(capfd)
    assert queue in line and "offset" in line and ".log" in line
    consumer.close()

    # Forgotten in the store as well: nothing comes back after another restart.
    broker.stop()
    broker = start(broker_factory)
    again = stomp_client(broker)
    again.subscribe(queue, "s")
    again.barrier()
    assert again.bodies == []
    assert corrupt_records_metric(broker) == 0


def test_a_durable_subscriber_gets_all_but_the_damaged_message(capfd, broker_factory, stomp_client, tmp_path):
    broker = start(broker_factory)
    topic = f"/topic/{unique('corr')}"
    durable = {"activemq.subscriptionName": "audit"}
    subscriber = stomp_client(broker, headers={"client-id": "auditor"})
    subscriber.subscribe(topic, "d", ack="client-individual", **durable)
    subscriber.close()
    producer = stomp_client(broker)
    for i in range(COUNT):
        producer.send(topic, body(i), **PERSISTENT)
    producer.close()
    broker = restart_damaged(broker_factory, broker, tmp_path / "data")
    capfd.readouterr()

    back = stomp_client(broker, headers={"client-id": "auditor"})
    back.subscribe(topic, "d", ack="auto", **durable)
    back.wait_messages(COUNT - 1)
    back.barrier()
    assert back.bodies == [body(i) for i in range(COUNT) if i != DAMAGED]
    assert corrupt_records_metric(broker) == 1
    [line] = corrupt_log_lines(capfd)
    assert topic in line


def test_an_mqtt_persistent_session_gets_all_but_the_damaged_message(broker_factory, paho, tmp_path):
    broker = start(broker_factory)
    topic = unique("corr")
    client_id = unique("sensor")
    device = paho(broker, client_id, clean=False)
    device.subscribe((f"{topic}/#", 1))
    device.close()
    publisher = paho(broker)
    for i in range(COUNT):
        publisher.publish(f"{topic}/x", body(i), qos=1)
    publisher.close()
    broker = restart_damaged(broker_factory, broker, tmp_path / "data")

    back = paho(broker, client_id, clean=False)
    assert back.connacks == [(True, 0)]
    back.wait(COUNT - 1)
    back.publish(f"{topic}/x", b"after", qos=1)  # the same connection goes on
    back.wait(COUNT)
    assert back.payloads == [body(i) for i in range(COUNT) if i != DAMAGED] + [b"after"]
    assert corrupt_records_metric(broker) == 1


# -- the disk alarm: free space below store.min_free_bytes ---------------------


@pytest.fixture
def disk(monkeypatch):
    """Free space as the broker sees it, settable: no disk has to fill up."""
    from gateway import app

    free = {"bytes": 1 << 40}
    monkeypatch.setattr(app, "disk_free_bytes", lambda path: free["bytes"])
    return free


def alarm_broker(broker_factory, **broker_settings):
    from persistence.settings import StoreSettings

    return broker_factory(store=StoreSettings(maintenance_interval_s=0.05, min_free_bytes=50 << 20),
                          broker=broker_settings, admin=ADMIN)


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


def set_free(broker, disk, free_bytes: int, alarm: bool) -> None:
    disk["bytes"] = free_bytes
    wait_for(lambda: metric(broker, "gateway_disk_alarm") == int(alarm), what=f"the disk alarm {'on' if alarm else 'off'}")


def test_low_disk_space_holds_persistent_producers_until_it_is_back(capfd, broker_factory, disk):
    broker = alarm_broker(broker_factory)
    queue = f"/queue/{unique('disk')}"
    consumer = RawClient(broker.stomp_address)
    consumer.connect(heart_beat="0,0")
    consumer.send_frame("SUBSCRIBE", {"destination": queue, "id": "1", "receipt": "sub"})
    consumer.receipt("sub")
    set_free(broker, disk, 10 << 20, alarm=True)
    assert metric(broker, "gateway_disk_free_bytes") == 10 << 20

    producer = RawClient(broker.stomp_address)
    producer.connect(heart_beat="0,0")
    producer.send_frame("SEND", {"destination": queue, "receipt": "held", **PERSISTENT}, b"persistent")
    core = broker.running.broker
    wait_for(lambda: broker.call(lambda: len(core.disk_waiters)) == 1, what="the producer held")
    # Non-persistent traffic and consumers go on meanwhile.
    other = RawClient(broker.stomp_address)
    other.connect(heart_beat="0,0")
    other.send_frame("SEND", {"destination": queue, "receipt": "light"}, b"transient")
    other.receipt("light")
    assert consumer.expect("MESSAGE").body == b"transient"
    assert [f.command for f in producer.quiet_for(0.2)] == []  # no receipt: nothing was stored
    assert broker.call(lambda: broker.running.store.stats()["live_messages"]) == 0

    set_free(broker, disk, 1 << 40, alarm=False)
    producer.receipt("held")
    assert consumer.expect("MESSAGE").body == b"persistent"
    # The same connection goes on producing.
    producer.send_frame("SEND", {"destination": queue, "receipt": "next", **PERSISTENT}, b"again")
    producer.receipt("next")
    assert consumer.expect("MESSAGE").body == b"again"
    alarms = [line for line in capfd.readouterr().err.splitlines() if "disk_alarm" in line]
    assert len(alarms) == 2 and "set" in alarms[0] and "cleared" in alarms[1]
    for client in (consumer, producer, other):
        client.close()


def test_a_commit_of_persistent_sends_taken_before_the_alarm_waits_it_out(broker_factory, disk):
    broker = alarm_broker(broker_factory)
    queue = f"/queue/{unique('disk')}"
    producer = RawClient(broker.stomp_address)
    producer.connect(heart_beat="0,0")
    producer.send_frame("BEGIN", {"transaction": "t"})
    producer.send_frame("SEND", {"destination": queue, "transaction": "t", "receipt": "taken", **PERSISTENT}, b"in tx")
    producer.receipt("taken")
    set_free(broker, disk, 10 << 20, alarm=True)
    producer.send_frame("COMMIT", {"transaction": "t", "receipt": "committed"})
    core = broker.running.broker
    wait_for(lambda: broker.call(lambda: len(core.disk_waiters)) == 1, what="the committing producer held")
    assert [f.command for f in producer.quiet_for(0.2)] == []  # not committed: nothing stored
    assert broker.call(lambda: broker.running.store.stats()["live_messages"]) == 0
    set_free(broker, disk, 1 << 40, alarm=False)
    producer.receipt("committed")
    consumer = RawClient(broker.stomp_address)
    consumer.connect(heart_beat="0,0")
    consumer.send_frame("SUBSCRIBE", {"destination": queue, "id": "1"})
    assert consumer.expect("MESSAGE").body == b"in tx"
    for client in (consumer, producer):
        client.close()


def test_low_disk_space_refuses_a_persistent_send_with_send_fail_if_no_space(broker_factory, disk):
    broker = alarm_broker(broker_factory, send_fail_if_no_space=True)
    queue = f"/queue/{unique('disk')}"
    set_free(broker, disk, 0, alarm=True)
    producer = RawClient(broker.stomp_address)
    producer.connect(heart_beat="0,0")
    producer.send_frame("SEND", {"destination": queue, "receipt": "refused", **PERSISTENT}, b"persistent")
    error = producer.expect_error_and_close()
    assert error.headers["receipt-id"] == "refused" and "disk" in error.headers["message"]
    producer.close()
    set_free(broker, disk, 1 << 40, alarm=False)
    later = RawClient(broker.stomp_address)
    later.connect(heart_beat="0,0")
    later.send_frame("SEND", {"destination": queue, "receipt": "stored", **PERSISTENT}, b"persistent")
    later.receipt("stored")
    later.close()


def test_low_disk_space_holds_an_mqtt_qos1_publisher_until_it_is_back(broker_factory, disk, paho):
    broker = alarm_broker(broker_factory)
    topic = unique("disk")
    watcher = paho(broker)
    watcher.subscribe((f"{topic}/#", 1))
    set_free(broker, disk, 0, alarm=True)
    device = paho(broker)
    device.publish(f"{topic}/light", b"qos0", qos=0)  # QoS 0 keeps flowing
    watcher.wait(1)
    held = device.client.publish(f"{topic}/x", b"qos1", qos=1)
    core = broker.running.broker
    wait_for(lambda: broker.call(lambda: len(core.disk_waiters)) == 1, what="the publisher held")
    assert not held.is_published() and watcher.payloads == [b"qos0"]
    set_free(broker, disk, 1 << 40, alarm=False)
    held.wait_for_publish(5)
    assert held.is_published()
    watcher.wait(2)
    assert watcher.payloads == [b"qos0", b"qos1"]


@pytest.fixture
def small_volume(tmp_path):
    """A 20 MB tmpfs as the data folder; skips where mounting is impossible."""
    mountpoint = tmp_path / "data"
    mountpoint.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mountpoint)],
                             capture_output=True, text=True) if os.geteuid() == 0 else None
    if mounted is None or mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root and mount rights)")
    yield mountpoint
    subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def test_a_really_filling_volume_holds_the_producer_and_loses_nothing(small_volume, broker_factory):
    from persistence.settings import StoreSettings

    broker = broker_factory(store=StoreSettings(segment_bytes=1 << 20, min_free_bytes=5 << 20,
                                                maintenance_interval_s=0.05))
    core = broker.running.broker
    queue = f"/queue/{unique('fill')}"
    producer = RawClient(broker.stomp_address)
    producer.connect(heart_beat="0,0")
    receipted: set[str] = set()

    def held() -> bool:
        return broker.call(lambda: bool(core.disk_waiters))

    def settle(ids: list[str]) -> bool:
        """Read receipts until the burst is receipted (False) or the producer is held (True)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if receipted.issuperset(ids):
                return False
            if held():
                return True
            try:
                frame = producer.next_frame(timeout=0.05)
            except AssertionError:
                continue  # nothing yet
            assert frame.command == "RECEIPT", frame
            receipted.add(frame.headers["receipt-id"])
        raise AssertionError("the burst was neither receipted nor held")

    sent = 0
    for _ in range(400):  # far more than 20 MB, in bursts of 32 x 8 KiB in flight
        ids = [f"r{i}" for i in range(sent, sent + 32)]
        producer.send(b"".join(encode_frame("SEND", {"destination": queue, "receipt": r, **PERSISTENT}, b"x" * 8192)
                               for r in ids))
        sent += 32
        if settle(ids):
            break
    else:
        raise AssertionError("the disk alarm never held the producer")
    # A consumer drains the queue; its segments are deleted, space comes back,
    # and every SEND, the held ones too, is stored, receipted and delivered.
    consumer = RawClient(broker.stomp_address)
    consumer.connect(heart_beat="0,0")
    consumer.send_frame("SUBSCRIBE", {"destination": queue, "id": "1"})
    for _ in range(sent):
        assert consumer.next_frame().command == "MESSAGE"
    while len(receipted) < sent:
        frame = producer.next_frame()
        assert frame.command == "RECEIPT", frame
        receipted.add(frame.headers["receipt-id"])
    assert not broker.call(lambda: core.disk_alarm)
    for client in (producer, consumer):
        client.close()
