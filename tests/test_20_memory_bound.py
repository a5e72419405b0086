"""A fast producer and a slow consumer for a bounded time: the broker holds the
producer back instead of buffering, so its memory stays bounded."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from tests.helpers import RawClient, encode_frame, unique
from tests.test_07_cli import free_port


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_slow_consumer_does_not_make_the_broker_grow(gateway, tmp_path):
    port = free_port()
    config = tmp_path / "gateway.toml"
    # 200 messages of 16 KiB may wait in the queue: about 3 MiB, whatever the producer does.
    config.write_text("[broker]\nqueue_high_water = 200\n[stomp]\noutbox_high_water_bytes = 262144\n")
    process = gateway("--config", str(config), "--stomp-port", str(port), "--data-dir", str(tmp_path / "d"))
    process.wait_listening(port)
    queue = f"/queue/{unique('bounded')}"
    baseline = rss_mib(process.proc.pid)
    body = b"x" * 16384
    frame = encode_frame("SEND", {"destination": queue}, body)
    stop = threading.Event()
    sent = [0]

    def produce() -> None:  # as fast as the broker lets it, for a bounded time
        producer = RawClient(("127.0.0.1", port))
        producer.connect(heart_beat="0,0")
        producer.sock.settimeout(0.5)
        try:
            while not stop.is_set():
                try:
                    producer.sock.sendall(frame * 16)
                    sent[0] += 16
                except TimeoutError:
                    continue  # held back by flow control: exactly what is being tested
        finally:
            producer.close()

    thread = threading.Thread(target=produce)
    thread.start()
    consumer = RawClient(("127.0.0.1", port), rcvbuf=65536)
    consumer.connect(heart_beat="0,0")
    consumer.send_frame("SUBSCRIBE", {"destination": queue, "id": "1"})
    peak = baseline
    received = 0
    deadline = time.monotonic() + 4.0
    try:
        while time.monotonic() < deadline:
            consumer.expect("MESSAGE", timeout=5)
            received += 1
            time.sleep(0.002)  # a slow consumer: about 500 messages a second
            if received % 50 == 0:
                peak = max(peak, rss_mib(process.proc.pid))
    finally:
        stop.set()
        thread.join(10)
        consumer.close()
    peak = max(peak, rss_mib(process.proc.pid))
    process.signal(signal.SIGTERM)
    assert process.wait_exit(15) == 0
    assert sent[0] > received * 2 or sent[0] > 2000, "the producer was not fast enough to prove anything"
    # Without flow control the queue would hold (sent - received) x 16 KiB: tens to hundreds of MiB.
    assert peak - baseline < 40, f"RSS grew {peak - baseline:.0f} MiB with {sent[0] - received} messages unconsumed"
