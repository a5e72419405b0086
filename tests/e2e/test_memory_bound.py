"""A fast producer and a slow consumer: the broker holds the producer back
instead of buffering, so its memory stays bounded.

Nothing here depends on the machine's speed: the test runs until the broker has
demonstrably held the producer back many times and more data has passed through
it than its memory bound, however long that takes (up to a generous deadline)."""

from __future__ import annotations

import base64
import signal
import threading
import time
import urllib.request
from pathlib import Path

from gateway.auth import hash_password
from tests.support.helpers import RawClient, encode_frame, unique
from tests.support.processes import free_port

BODY_BYTES = 16384
GROWTH_LIMIT_MIB = 40
# More than the growth limit must pass through the broker: had it kept what it
# relayed, its memory would show it.
THROUGH = 60 * 1024 * 1024 // BODY_BYTES
HOLDS = 10  # the producer was held back again and again, not once by chance


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def producer_holds(admin_port: int) -> int:
    """The broker's own count of times flow control held a producer back."""
    request = urllib.request.Request(f"http://127.0.0.1:{admin_port}/metrics")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"ops:look").decode())
    with urllib.request.urlopen(request, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("gateway_producer_holds_total "):
                return int(float(line.split()[1]))
    raise AssertionError("no gateway_producer_holds_total in /metrics")


def test_a_slow_consumer_does_not_make_the_broker_grow(gateway, tmp_path):
    port, admin_port = free_port(), free_port()
    config = tmp_path / "gateway.toml"
    # 200 messages of 16 KiB may wait in the queue: about 3 MiB, whatever the producer does.
    config.write_text(
        "[broker]\nqueue_high_water = 200\n[stomp]\noutbox_high_water_bytes = 262144\n"
        f'[admin]\nusers = [{{ name = "ops", password_hash = "{hash_password("look", iterations=1000)}", role = "read" }}]\n'
    )
    process = gateway("--config", str(config), "--stomp-port", str(port), "--admin-port", str(admin_port),
                      "--data-dir", str(tmp_path / "d"))
    process.wait_listening(port)
    queue = f"/queue/{unique('bounded')}"
    baseline = rss_mib(process.proc.pid)
    frame = encode_frame("SEND", {"destination": queue}, b"x" * BODY_BYTES)
    frames = frame * 16
    stop = threading.Event()
    sent = [0]  # bytes

    def grew(mib: float, received: int) -> str:
        return f"RSS grew {mib:.0f} MiB with {sent[0] // len(frame) - received} messages unconsumed"

    def produce() -> None:  # as fast as the broker lets it, until told to stop
        producer = RawClient(("127.0.0.1", port))
        producer.connect(heart_beat="0,0")
        producer.sock.settimeout(0.2)
        view = memoryview(frames)
        try:
            while not stop.is_set():
                offset = 0
                while offset < len(view) and not stop.is_set():
                    try:
                        offset += producer.sock.send(view[offset:])
                    except TimeoutError:
                        continue  # held back by flow control: exactly what is being tested
                sent[0] += offset
        finally:
            producer.close()

    thread = threading.Thread(target=produce)
    thread.start()
    consumer = RawClient(("127.0.0.1", port), rcvbuf=65536)
    consumer.connect(heart_beat="0,0")
    consumer.send_frame("SUBSCRIBE", {"destination": queue, "id": "1"})
    peak = baseline
    received = holds = 0
    deadline = time.monotonic() + 120
    try:
        while received < THROUGH or holds < HOLDS:
            assert time.monotonic() < deadline, (
                f"after 120 s: {received} of {THROUGH} messages through, held back {holds} of {HOLDS} times"
            )
            consumer.expect("MESSAGE", timeout=10)
            received += 1
            time.sleep(0.002)  # a slow consumer
            if received % 50 == 0:
                peak = max(peak, rss_mib(process.proc.pid))
                assert peak - baseline < GROWTH_LIMIT_MIB, grew(peak - baseline, received)
            if received % 250 == 0:
                holds = producer_holds(admin_port)
    finally:
        stop.set()
        thread.join(10)
        consumer.close()
    peak = max(peak, rss_mib(process.proc.pid))
    process.signal(signal.SIGTERM)
    assert process.wait_exit(15) == 0
    # Without flow control the queue would hold every unconsumed message, and
    # the producer would never be held back: the loop above would not end.
    assert peak - baseline < GROWTH_LIMIT_MIB, grew(peak - baseline, received)
