"""STOMP and MQTT over WebSocket from a real browser: stomp.js and MQTT.js
(pinned, from the npm registry; tests/npm_bundles.py) in Debian's headless
chromium, on pages served from loopback, publishing to and receiving from
stomp.py and paho over plain TCP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests import npm_bundles
from tests.browser import chromium, requires_chromium, serve_files
from tests.helpers import unique, wait_for
from tests.tls_helpers import tls_broker

pytestmark = requires_chromium

PAGES = Path(__file__).resolve().parent.parent / "pages"
BROWSER_TIMEOUT_S = 15.0  # a cold chromium on a loaded machine is slow to its first frame


@pytest.fixture
def pages() -> Iterator[str]:
    try:
        paths = [npm_bundles.bundle(name) for name in ("stompjs", "mqtt")]
    except npm_bundles.BundleError as exc:
        pytest.skip(f"stomp.js / MQTT.js not available from the npm registry ({exc}); make test fetches them")
    bundles = {f"/{path.name}": path for path in paths}
    with serve_files({"/stomp.html": PAGES / "stomp.html", "/mqtt.html": PAGES / "mqtt.html", **bundles}) as base:
        yield base


def status(browser) -> str:
    return browser.execute_script("return document.getElementById('status').textContent")


def received(browser) -> list[str]:
    return browser.execute_script("return [...document.querySelectorAll('#received li')].map(li => li.textContent)")


def wait_status(browser, expected: str) -> None:
    wait_for(lambda: status(browser) == expected, BROWSER_TIMEOUT_S, interval=0.05,
             what=f"page status {expected!r} (it says {status(browser)!r})")


def wait_received(browser, expected: str) -> None:
    wait_for(lambda: expected in received(browser), BROWSER_TIMEOUT_S, interval=0.05,
             what=f"{expected!r} on the page (it has {received(browser)!r})")


def protocols(broker) -> list[str]:
    return broker.call(lambda: sorted(c.protocol for c in broker.running.server.connections.values()))


def test_stomp_js_in_the_browser_meets_stomp_py_over_tcp(broker, stomp_client, browser, pages):
    topic, queue = f"/topic/{unique('browser')}", f"/queue/{unique('browser')}"
    browser.get(f"{pages}/stomp.html?{urlencode({'port': broker.admin_port, 'subscribe': topic})}")
    # stomp.js offered v10.stomp, v11.stomp, v12.stomp; CONNECT negotiated 1.2.
    wait_status(browser, "subscribed 1.2 v12.stomp")
    assert protocols(broker) == ["stomp-ws"]

    tcp = stomp_client(broker)
    tcp.send(topic, "from stomp.py over TCP, ünïcode".encode())
    wait_received(browser, "from stomp.py over TCP, ünïcode")

    tcp.subscribe(queue)
    browser.execute_script("publish(arguments[0], arguments[1])", queue, "from stomp.js over WebSocket")
    assert tcp.wait_messages(1)[0].body == b"from stomp.js over WebSocket"


def test_mqtt_js_in_the_browser_meets_paho_and_stomp_over_tcp(broker, paho, stomp_client, browser, pages):
    plant = unique("plant")
    browser.get(f"{pages}/mqtt.html?{urlencode({'port': broker.admin_port, 'subscribe': f'{plant}/+/temp'})}")
    wait_status(browser, "subscribed 1")
    assert protocols(broker) == ["mqtt-ws"]

    device = paho(broker, unique("tcp-device-"))
    device.publish(f"{plant}/3/temp", b"21.5", qos=1)
    wait_received(browser, f"{plant}/3/temp 21.5 qos1")

    stomp_client(broker).send(f"/topic/{plant}.4.temp", b"from STOMP")  # and across protocols
    wait_for(lambda: any(text.startswith(f"{plant}/4/temp from STOMP") for text in received(browser)),
             BROWSER_TIMEOUT_S, interval=0.05, what="the STOMP message on the MQTT.js page")

    assert device.subscribe((f"{plant}/cmd", 1)) == [1]
    browser.execute_script("publish(arguments[0], arguments[1])", f"{plant}/cmd", "heat on")
    (command,) = device.wait(1)
    assert (command.payload, command.qos) == (b"heat on", 1)


def test_stomp_js_and_mqtt_js_over_wss(broker_factory, pki, stomp_client, paho, pages):
    """The same pages over wss:// (the admin-tls port).  The browser cannot be
    told to trust the tests' throwaway CA, so certificate errors are ignored:
    the TLS handshake and everything above it are real."""
    broker = tls_broker(broker_factory, pki)
    port = broker.running.ports["admin-tls"]
    topic, plant = f"/topic/{unique('wss')}", unique("plant")
    with chromium("--ignore-certificate-errors") as browser:
        browser.get(f"{pages}/stomp.html?{urlencode({'scheme': 'wss', 'port': port, 'subscribe': topic})}")
        wait_status(browser, "subscribed 1.2 v12.stomp")
        stomp_client(broker).send(topic, b"over TLS")
        wait_received(browser, "over TLS")

        browser.get(f"{pages}/mqtt.html?{urlencode({'scheme': 'wss', 'port': port, 'subscribe': f'{plant}/#'})}")
        wait_status(browser, "subscribed 1")
        paho(broker, unique("tcp-")).publish(f"{plant}/1/temp", b"20.5", qos=1)
        wait_received(browser, f"{plant}/1/temp 20.5 qos1")
    accepted = broker.call(lambda: dict(broker.running.server.accepted))
    assert accepted.get("stomp-ws") == 1 and accepted.get("mqtt-ws") == 1
