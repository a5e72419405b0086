"""What an operator sees when the disk fills up: SENDs that cannot be stored
fail with their receipts named, and the disk alarm (free space below
store.min_free_bytes) holds persistent producers until space is back."""

from __future__ import annotations

import errno
import os
import subprocess
import time

import pytest

from tests.support.helpers import RawClient, encode_frame, unique, wait_for
from tests.support.store_fault_helpers import ADMIN, PERSISTENT, metric


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
