"""The README's client quick start, run as a reader would run it: every
snippet of that section against a real `gateway serve` started with the
environment users it shows (only the ports changed to free ones): the
Python ones (stomp.py, paho-mqtt) as scripts, the shell one with Debian's
mosquitto_pub/mosquitto_sub, the JavaScript ones (stomp.js, MQTT.js) in
Chromium.  And the "How do I" answer for the dead-letter queue:
examples/dlq_retry.py moves dead letters back where they came from."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import npm_bundles
from tests.support.browser import chromium, requires_chromium, serve_files
from tests.e2e.test_first_users import Broker
from tests.support.helpers import Client, RawClient, unique, wait_for
from tests.support.processes import HOST

ROOT = Path(__file__).resolve().parents[2]
ENVIRONMENT = {"GATEWAY_USER": "app", "GATEWAY_PASSWORD": "app-secret",
               "GATEWAY_ADMIN_USER": "admin", "GATEWAY_ADMIN_PASSWORD": "admin-secret"}
SNIPPET_TIMEOUT_S = 30
BROWSER_TIMEOUT_S = 15.0


def section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section("Client quick start"), re.S)


def test_the_quick_start_starts_the_broker_with_the_users_its_snippets_use():
    (start,) = [b for b in blocks("sh") if "make run" in b]
    assert all(f"{name}={value}" in start for name, value in ENVIRONMENT.items())
    assert len(blocks("python")) == 2 and len(blocks("js")) == 2


@pytest.fixture
def broker(tmp_path):
    running = Broker(tmp_path, ENVIRONMENT)
    yield running
    running.stop()


def on_ports(snippet: str, broker: Broker) -> str:
    """The snippet with the default ports replaced by the test broker's."""
    for default, port in (("61613", broker.stomp_port), ("1883", broker.mqtt_port), ("8161", broker.admin_port)):
        snippet = re.sub(rf"\b{default}\b", str(port), snippet)
    return snippet


@pytest.mark.parametrize(("index", "expected"), [(0, "stomp.py got hello from stomp.py"),
                                                 (1, "paho got sensors/room1/temp 21.5")], ids=["stomp.py", "paho"])
def test_the_python_snippets_run_as_written(broker, index, expected):
    snippet = on_ports(blocks("python")[index], broker)
    result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=SNIPPET_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout, (result.stdout, result.stderr)


@pytest.mark.skipif(shutil.which("mosquitto_pub") is None, reason="mosquitto-clients not installed (make test installs them)")
def test_the_mosquitto_commands_run_as_written(broker):
    (commands,) = [b for b in blocks("sh") if "mosquitto_" in b]
    result = subprocess.run(["bash", "-e", "-c", on_ports(commands, broker)], capture_output=True, text=True,
                            timeout=SNIPPET_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "sensors/room2/temp 19.0"


@pytest.fixture
def bundles() -> dict[str, Path]:
    try:
        paths = [npm_bundles.bundle(name) for name in ("stompjs", "mqtt")]
    except npm_bundles.BundleError as exc:
        pytest.skip(f"stomp.js / MQTT.js not available from the npm registry ({exc}); make test fetches them")
    return {f"/{path.name}": path for path in paths}


@pytest.fixture
def browser() -> Iterator[object]:
    with chromium() as driver:
        yield driver


@requires_chromium
@pytest.mark.parametrize(("index", "expected"), [(0, "stomp.js got hello from stomp.js"),
                                                 (1, "MQTT.js got chat/room1 hello from MQTT.js")],
                         ids=["stomp.js", "MQTT.js"])
def test_the_javascript_snippets_run_in_a_browser(broker, bundles, browser, tmp_path, index, expected):
    scripts = "".join(f'<script src="{path}"></script>' for path in bundles)
    page = tmp_path / "quickstart.html"
    page.write_text(
        f"<!doctype html><meta charset=utf-8>{scripts}"
        "<script>window.logs = []; const show = console.log;"
        " console.log = (...parts) => { window.logs.push(parts.join(' ')); show(...parts); };</script>"
        f"<script>{on_ports(blocks('js')[index], broker)}</script>"
    )
    with serve_files({"/quickstart.html": page, **bundles}) as base:
        browser.get(f"{base}/quickstart.html")
        logs = wait_for(lambda: (found := browser.execute_script("return window.logs")) and expected in found and found,
                        BROWSER_TIMEOUT_S, interval=0.05, what=f"{expected!r} in the page's console")
    assert expected in logs


def test_dlq_retry_moves_dead_letters_back_transactionally(tmp_path):
    config = tmp_path / "gateway.toml"
    config.write_text("[broker]\nmax_redeliveries = 0\n")  # the first NACK dead-letters
    running = Broker(tmp_path, ENVIRONMENT, "--config", str(config))
    orders, other = f"/queue/orders.{unique()}", f"/queue/other.{unique()}"
    try:
        producer = Client((HOST, running.stomp_port)).connect(login="app", passcode="app-secret")
        try:
            for n in range(3):
                producer.send(orders, f"order {n}".encode(), persistent="true", **{"x-tenant": "acme"})
            producer.send(other, b"other 0", persistent="true")
        finally:
            producer.close()
        consumer = RawClient((HOST, running.stomp_port))
        try:
            consumer.connect(login="app", passcode="app-secret")
            for destination, count in ((orders, 3), (other, 1)):
                consumer.send_frame("SUBSCRIBE", {"destination": destination, "id": destination, "ack": "client-individual"})
                for _ in range(count):
                    consumer.send_frame("NACK", {"id": consumer.expect("MESSAGE").headers["ack"]})
        finally:
            consumer.close()
        def depth(name: str) -> int | None:
            status, body = running.get(f"/api/v1/destinations/{name}", ("admin", "admin-secret"))
            return json.loads(body)["depth"] if status == 200 else None

        wait_for(lambda: depth("queue/DLQ") == 4, what="4 dead letters")

        script = [sys.executable, str(ROOT / "examples" / "dlq_retry.py"), "--port", str(running.stomp_port),
                  "--login", "app", "--passcode", "app-secret", "--idle", "1"]
        moved = subprocess.run([*script, "--only", orders], capture_output=True, text=True, timeout=SNIPPET_TIMEOUT_S)
        assert moved.returncode == 0 and "moved 3 message(s)" in moved.stdout, (moved.stdout, moved.stderr)
        back = Client((HOST, running.stomp_port)).connect(login="app", passcode="app-secret")
        try:
            back.subscribe(orders)
            messages = back.wait_messages(3)
            assert sorted(m.body for m in messages) == [b"order 0", b"order 1", b"order 2"]
            for message in messages:
                assert message.headers["x-tenant"] == "acme" and message.headers["persistent"] == "true"
                assert "originalDestination" not in message.headers and "dlqDeliveryFailureCause" not in message.headers
        finally:
            back.close()
        assert depth("queue/DLQ") == 1  # the other queue's was left

        rest = subprocess.run(script, capture_output=True, text=True, timeout=SNIPPET_TIMEOUT_S)
        assert rest.returncode == 0 and "moved 1 message(s)" in rest.stdout, (rest.stdout, rest.stderr)
        assert depth("queue/DLQ") == 0 and depth(other[1:]) == 1
    finally:
        running.stop()
