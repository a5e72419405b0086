"""What an operator sees when a journal record is damaged: a flipped bit
found while recovering is logged with its position and skipped, and one found
only when its body is read on dispatch loses that one message, nothing else."""

from __future__ import annotations

import json
import signal

import pytest

from tests.support.helpers import unique
from tests.support.processes import free_port
from tests.support.store_fault_helpers import ADMIN, PERSISTENT, drain, fill, metric


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


# -- a damaged record found only when its body is read -------------------------
# A clean start trusts the checkpoint and leaves bodies on disk until dispatch,
# so a flipped byte shows up then: that one message is lost, nothing else.

DAMAGED = 17
COUNT = 40
LAZY = {"resident_messages": 4}  # most of a backlog waits as stubs while running, too


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
