"""STOMP and MQTT over WebSocket from a real browser: stomp.js and MQTT.js
(pinned, from the npm registry; tests/support/npm_bundles.py) in Debian's headless
chromium, on pages served from loopback, publishing to and receiving from
stomp.py and paho over plain TCP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.support import npm_bundles
from tests.support.browser import chromium, requires_chromium, serve_files
from tests.support.helpers import unique, wait_for
from tests.support.tls_helpers import tls_broker

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
    html = {f"/{name}": PAGES / name for name in ("stomp.html", "mqtt.html", "mqtt5.html")}
    with serve_files({**html, **bundles}) as base:
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


def call(browser, function: str, *args):
    """``window.<function>(*args, done)`` on the page; what it passed to done."""
    return browser.execute_async_script(f"{function}(...arguments)", *args)


def subscription_ids(message: dict) -> list[int]:
    ids = message["properties"].get("subscriptionIdentifier")
    return ids if isinstance(ids, list) else [ids]  # MQTT.js gives one as a number, several as a list


def test_mqtt_js_v5_in_the_browser_keeps_properties_across_mqtt_and_stomp(broker, stomp_client, browser, pages):
    """MQTT.js with protocolVersion 5 over WebSocket: CONNECT and SUBSCRIBE with
    properties, a publish with User Properties and a Response Topic that
    comes back with them (and the subscription's identifier, by topic alias
    both ways), the same message's headers at a STOMP subscriber, and the
    STOMP side's reply reaching the browser with its Correlation Data."""
    plant = unique("plant5")
    browser.set_script_timeout(BROWSER_TIMEOUT_S)
    browser.get(f"{pages}/mqtt5.html?{urlencode({'port': broker.admin_port, 'aliases': 10})}")
    wait_status(browser, "connected")
    assert protocols(broker) == ["mqtt-ws"]
    connack = browser.execute_script("return window.connack")
    assert connack["reasonCode"] == 0 and connack["sessionPresent"] is False
    assert connack["properties"]["topicAliasMaximum"] > 0  # else MQTT.js could not alias what it publishes
    assert connack["properties"].get("subscriptionIdentifiersAvailable", True) is True

    error, granted = call(browser, "subscribe", f"{plant}/+/temp",
                          {"qos": 1, "properties": {"subscriptionIdentifier": 7, "userProperties": {"panel": "1"}}})
    assert error is None and [g["qos"] for g in granted] == [1]
    error, granted = call(browser, "subscribe", f"{plant}/replies", {"qos": 1, "properties": {"subscriptionIdentifier": 8}})
    assert error is None and [g["qos"] for g in granted] == [1]
    dashboard = stomp_client(broker)
    dashboard.subscribe(f"/topic/{plant}.1.temp")

    sent = {"qos": 1, "properties": {"userProperties": {"unit": "C", "sensor": "t-1"}, "responseTopic": f"{plant}/replies",
                                     "correlationData": "req-1", "contentType": "text/plain", "messageExpiryInterval": 600}}
    for payload in ("21.5", "21.75"):  # the second goes by topic alias alone
        error, reason = call(browser, "publish", f"{plant}/1/temp", payload, sent)
        assert error is None and reason in (None, 0)
    wait_for(lambda: len(browser.execute_script("return window.messages")) >= 2, BROWSER_TIMEOUT_S, interval=0.05,
             what="both messages back on the page")
    first, second = browser.execute_script("return window.messages")
    assert [(m["topic"], m["payload"], m["qos"]) for m in (first, second)] == [
        (f"{plant}/1/temp", "21.5", 1), (f"{plant}/1/temp", "21.75", 1)]
    for message in (first, second):
        properties = message["properties"]
        assert properties["userProperties"] == {"unit": "C", "sensor": "t-1"}
        assert (properties["responseTopic"], properties["correlationData"], properties["contentType"]) == (
            f"{plant}/replies", "req-1", "text/plain")
        assert 0 < properties["messageExpiryInterval"] <= 600
        assert subscription_ids(message) == [7]
    # The server aliased its deliveries too (the page announced 10): the same
    # alias both times, and MQTT.js named the second's topic from it.
    assert first["properties"]["topicAlias"] == second["properties"]["topicAlias"] > 0

    stomp_first, stomp_second = dashboard.wait_messages(2)
    assert [stomp_first.body, stomp_second.body] == [b"21.5", b"21.75"]
    headers = stomp_first.headers
    assert (headers["unit"], headers["sensor"], headers["content-type"]) == ("C", "t-1", "text/plain")
    assert (headers["reply-to"], headers["correlation-id"]) == (f"/topic/{plant}.replies", "req-1")
    assert int(headers["expires"]) > 0

    # The dashboard answers where the request said, as a STOMP client does.
    dashboard.send(headers["reply-to"], b"ack", **{"correlation-id": headers["correlation-id"], "status": "ok"})
    wait_for(lambda: len(browser.execute_script("return window.messages")) >= 3, BROWSER_TIMEOUT_S, interval=0.05,
             what="the STOMP reply on the page")
    reply = browser.execute_script("return window.messages")[2]
    assert (reply["topic"], reply["payload"], reply["properties"]["correlationData"]) == (f"{plant}/replies", "ack", "req-1")
    assert reply["properties"]["userProperties"]["status"] == "ok"
    assert subscription_ids(reply) == [8]


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
