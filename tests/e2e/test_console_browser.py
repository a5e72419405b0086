"""The web console in a real headless browser (Debian's chromium through
chromedriver) against a real `gateway serve`: the login page, the page that
says how to make an admin user, and every page with real data from STOMP
clients, each action taking effect (send, purge, delete, retry a dead
letter, close a connection).  Every page is screenshotted into
build/console-screenshots/; the README's docs/console.png is the overview's,
taken by the same code (GATEWAY_README_SCREENSHOT=1 refreshes it)."""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.auth import hash_password
from tests.support.browser import chromium, console_login, requires_chromium
from tests.e2e.test_admin import call
from tests.support.helpers import unique, wait_for
from tests.support.processes import HOST, BrokerProcess, accepting, free_port

pytestmark = requires_chromium

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "build" / "console-screenshots"
README_SHOT = ROOT / "docs" / "console.png"
WINDOW = (1280, 900)
WRITER = ("ops", "s3cret")
READER = ("viewer", "look")
WAIT_S = 15


class Console:
    """A `gateway serve` with admin users, a dead-letter policy and an
    archived topic, and its admin port's base URL."""

    def __init__(self, tmp_path: Path) -> None:
        self.admin_port = free_port()
        users = ", ".join(
            f'{{name = "{name}", password_hash = "{hash_password(password, iterations=1000)}", role = "{role}"}}'
            for (name, password), role in ((WRITER, "write"), (READER, "read"))
        )
        config = tmp_path / "gateway.toml"
        config.write_text(
            f"[admin]\nusers = [{users}]\nhistory_interval_s = 0.5\n"
            '[[broker.policies]]\ndestination = "/queue/retry.>"\nmax_redeliveries = 0\n'
            '[[broker.policies]]\ndestination = "/topic/plant.>"\narchive = true\n'
        )
        self.process = BrokerProcess(tmp_path, "--config", str(config), "--admin-port", str(self.admin_port))
        self.base = f"http://{HOST}:{self.admin_port}"

    @property
    def stomp(self) -> tuple[str, int]:
        return (HOST, self.process.port)

    def api(self, path: str) -> Any:
        import json

        status, body, _ = call(self, "GET", path)
        assert status == 200, (status, body)
        return json.loads(body)


def ready(console: Console) -> bool:
    try:
        return call(console, "GET", "/readyz", auth=None)[0] == 200
    except ConnectionRefusedError:  # the admin port binds after the STOMP one
        return False


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    served = Console(tmp_path_factory.mktemp("console"))
    served.process.start()
    try:
        wait_for(lambda: ready(served), WAIT_S, 0.05, "the broker ready")
        yield served
    finally:
        served.process.terminate()


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with chromium(f"--window-size={WINDOW[0]},{WINDOW[1]}") as browser:
        yield browser


@pytest.fixture(scope="module")
def ops(console: Console, driver: Any) -> Any:
    """The browser, logged in to the console as the write user."""
    console_login(driver, console.base, *WRITER)
    return driver


def until(driver: Any, condition: Callable[[Any], Any], what: str) -> Any:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # The console redraws its page every refresh: an element found may be
    # replaced (stale) before it is read; look again until the time is up.
    ignored = (StaleElementReferenceException, NoSuchElementException)
    return WebDriverWait(driver, WAIT_S, ignored_exceptions=ignored).until(condition, what)


def text_of(driver: Any, css: str) -> str:
    """The text of what ``css`` finds ("" if nothing), read again if a refresh redrew it meanwhile."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(5):
        try:
            found = driver.find_elements(By.CSS_SELECTOR, css)
            return str(found[0].text) if found else ""
        except StaleElementReferenceException:
            continue
    return ""


def shows(driver: Any, css: str, text: str) -> None:
    until(driver, lambda d: text_of(d, css) == text, f"{css} showing {text!r}")


def go(driver: Any, page: str) -> None:
    """Another page of the console (the hash route: no reload, still logged in)."""
    from selenium.webdriver.common.by import By

    driver.execute_script("location.hash = arguments[0]", "#/" + page)
    until(driver, lambda d: d.find_elements(By.ID, "page-" + page.split("/")[0]), f"the {page} page")


def click(driver: Any, css: str) -> None:
    """Click what ``css`` finds, again if a refresh redrew it meanwhile."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def clicked(d: Any) -> bool:
        try:
            d.find_element(By.CSS_SELECTOR, css).click()
            return True
        except StaleElementReferenceException:
            return False

    until(driver, clicked, f"a click on {css}")


def confirm(driver: Any, css: str) -> None:
    """A button that asks "really ...?": click, see it armed, click again."""
    from selenium.webdriver.common.by import By

    click(driver, css)
    until(driver, lambda d: "armed" in d.find_element(By.CSS_SELECTOR, css).get_attribute("class"), f"{css} armed")
    click(driver, css)


def screenshot(driver: Any, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot {path}"
    return path


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


# -- logging in -------------------------------------------------------------------------


def test_without_an_admin_user_the_console_says_how_to_make_one(tmp_path: Path, driver: Any) -> None:
    from selenium.webdriver.common.by import By

    port = free_port()
    process = BrokerProcess(tmp_path, "--admin-port", str(port))
    process.start()
    try:
        wait_for(lambda: accepting(port), WAIT_S, 0.05, "the admin port")
        driver.get(f"http://{HOST}:{port}/")
        until(driver, lambda d: d.find_element(By.ID, "setup").is_displayed(), "the setup page")
        text = driver.find_element(By.ID, "setup").text
        for needed in ("gateway passwd --name ops --role write", "[admin]", "GATEWAY_ADMIN_USER", "GATEWAY_ADMIN_PASSWORD"):
            assert needed in text
        assert not driver.find_element(By.ID, "login").is_displayed()
        screenshot(driver, "no-admin-user")
    finally:
        process.terminate()


def test_a_browser_gets_a_login_page_and_a_wrong_password_is_refused(console: Console, driver: Any) -> None:
    from selenium.webdriver.common.by import By

    driver.get(console.base + "/")
    until(driver, lambda d: d.find_element(By.ID, "login").is_displayed(), "the login form")
    assert not driver.find_element(By.ID, "app").is_displayed()
    driver.find_element(By.ID, "login-user").send_keys(WRITER[0])
    driver.find_element(By.ID, "login-password").send_keys("wrong")
    driver.find_element(By.ID, "login-submit").click()
    shows(driver, "#login-error", "wrong user or password")
    screenshot(driver, "login")
    # the page's own script logs in; the right password opens the console
    console_login(driver, console.base, *READER)
    shows(driver, "#who-name", "viewer (read)")
    go(driver, "queues")
    assert not driver.find_elements(By.CSS_SELECTOR, "button.purge")  # a reader gets no buttons
    click(driver, "#logout")
    until(driver, lambda d: d.find_element(By.ID, "login").is_displayed(), "the login form again")


# -- the pages ------------------------------------------------------------------------------


def test_the_overview_charts_rates_and_queued_messages_over_time(console: Console, ops: Any, stomp_client: Any) -> None:
    from selenium.webdriver.common.by import By

    queue, drained = f"/queue/{unique('overview')}", f"/queue/{unique('drained')}"
    consumer = stomp_client(console.stomp)
    consumer.subscribe(drained)
    producer = stomp_client(console.stomp)
    for i in range(40):
        producer.send(queue, f"m{i}", receipt=(i == 39))
        producer.send(drained, f"d{i}", receipt=False)
    consumer.wait_messages(40)
    go(ops, "overview")
    until(ops, lambda d: int(text_of(d, "#fig-queued .value") or 0) >= 40, "40 messages queued")
    assert int(text_of(ops, "#fig-connections .value")) >= 1

    def points(key: str) -> list[tuple[float, float]]:
        line = ops.find_element(By.CSS_SELECTOR, f'#chart-rates polyline[data-key="{key}"]').get_attribute("points")
        return [tuple(map(float, p.split(","))) for p in line.split()]

    def queued_points() -> list[tuple[float, float]]:
        line = ops.find_element(By.CSS_SELECTOR, '#chart-queued polyline[data-key="queued"]').get_attribute("points")
        return [tuple(map(float, p.split(","))) for p in line.split()]

    # Charted over time: one point per sample, left to right, the latest
    # above the zero line (SVG's y grows downwards; zero is at y = 136).
    until(ops, lambda d: len(queued_points()) >= 4, "four samples charted")
    xs, ys = zip(*queued_points())
    assert list(xs) == sorted(set(xs)) and ys[-1] < 136
    assert points("in") and points("out")
    for chart in ("chart-rates", "chart-queued", "chart-connections", "chart-memory"):
        until(ops, lambda d, chart=chart: d.find_element(By.ID, chart).is_displayed(), f"the chart {chart}")
    assert text_of(ops, "#fig-memory .value").endswith("B")
    shot = screenshot(ops, "overview")
    if os.environ.get("GATEWAY_README_SCREENSHOT") == "1":
        README_SHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, README_SHOT)
    # The README's screenshot is this page, taken by this code at this window size.
    assert png_size(README_SHOT) == png_size(shot)
    assert "docs/console.png" in (ROOT / "README.md").read_text()


def test_the_queues_page_shows_depth_and_unacked_and_purges(console: Console, ops: Any, stomp_client: Any) -> None:
    from selenium.webdriver.common.by import By

    held, waiting = f"/queue/{unique('held')}", f"/queue/{unique('waiting')}"
    producer = stomp_client(console.stomp)
    for i in range(10):
        producer.send(held, f"h{i}", receipt=False)
    for i in range(7):
        producer.send(waiting, f"w{i}", receipt=(i == 6))
    producer.barrier()
    consumer = stomp_client(console.stomp)
    consumer.subscribe(held, ack="client-individual", **{"activemq.prefetchSize": "7"})
    consumer.wait_messages(7)

    (listed,) = [d for d in console.api("/api/v1/destinations") if d["name"] == held]
    assert (listed["depth"], listed["unacked"], listed["consumers"]) == (3, 7, 1)
    go(ops, "queues")
    shows(ops, f'#destinations tr[data-name="{held}"] td.unacked', "7")
    shows(ops, f'#destinations tr[data-name="{held}"] td.depth', "3")
    shows(ops, f'#destinations tr[data-name="{waiting}"] td.depth', "7")
    until(ops, lambda d: text_of(d, f'#destinations tr[data-name="{waiting}"] td.rate-in') != "", "a rate")
    until(ops, lambda d: d.find_elements(By.CSS_SELECTOR, f'#destinations tr[data-name="{waiting}"] td.spark polyline'),
          "a sparkline of its depth")
    screenshot(ops, "queues")
    confirm(ops, f'#destinations tr[data-name="{waiting}"] button.purge')
    shows(ops, f'#destinations tr[data-name="{waiting}"] td.depth', "0")
    assert [d["depth"] for d in console.api("/api/v1/destinations") if d["name"] == waiting] == [0]


def test_the_topics_page_shows_subscribers_and_archive_offsets(console: Console, ops: Any, stomp_client: Any) -> None:
    from selenium.webdriver.common.by import By

    topic = f"/topic/plant.{unique('t')}"
    live = stomp_client(console.stomp)
    live.subscribe(topic, ack="client-individual", **{"activemq.prefetchSize": "2"})
    durable = stomp_client(console.stomp, headers={"client-id": unique("keeper")})
    durable.subscribe(topic, ack="client-individual", **{"activemq.subscriptionName": "audit",
                                                           "activemq.prefetchSize": "1"})
    producer = stomp_client(console.stomp)
    for i in range(5):
        producer.send(topic, f"t{i}", persistent="true")
    live.wait_messages(2)
    durable.wait_messages(1)

    go(ops, "topics")
    row = f'#topics tr.topic[data-topic="{topic}"]'
    shows(ops, f"{row} td.subscribers", "2 subscribers")
    shows(ops, f"{row} td.unacked", "3")  # 2 held by the live subscriber, 1 by the durable one
    shows(ops, f"{row} td.pending", "7")  # 3 + 4 waiting behind them
    shows(ops, f"{row} td.archive", "0 \u2026 5")
    kinds = text_of(ops, f'#topics tr.subscriber[data-topic="{topic}"] td.kind')
    assert kinds in ("non-durable", "durable")
    screenshot(ops, "topics")
    # the durable subscription's own page: its waiting messages, browsed
    click(ops, f'#topics tr.subscriber[data-topic="{topic}"] a.name')
    until(ops, lambda d: text_of(d, "#dest-name").startswith("durable:"), "the durable subscription's page")
    shows(ops, ".figure.unacked .value", "1")
    until(ops, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#messages tbody tr")) == 4, "its 4 waiting messages")
    go(ops, "archive")
    shows(ops, f'#archive tr[data-topic="{topic[len("/topic/"):]}"] td.latest', "5")
    screenshot(ops, "archive")


def test_a_read_user_sees_a_destinations_figures_but_not_its_messages(console: Console, driver: Any,
                                                                       stomp_client: Any) -> None:
    from selenium.webdriver.common.by import By

    queue = f"/queue/{unique('unread')}"
    stomp_client(console.stomp).send(queue, "a private body", receipt=True)

    def log_out() -> None:  # the module's one browser may be logged in as the operator
        driver.get(console.base + "/#/overview")
        if driver.find_elements(By.ID, "logout") and driver.find_element(By.ID, "logout").is_displayed():
            click(driver, "#logout")
            until(driver, lambda d: d.find_element(By.ID, "login").is_displayed(), "the login form")

    log_out()
    console_login(driver, console.base, *READER)
    try:
        go(driver, "destination/" + queue)
        shows(driver, ".figure.depth .value", "1")
        shows(driver, "#no-browse", "Message contents need the browse role.")
        assert not driver.find_elements(By.CSS_SELECTOR, "#messages")
        assert "a private body" not in driver.find_element(By.TAG_NAME, "body").text
    finally:
        log_out()
        console_login(driver, console.base, *WRITER)  # as the other tests' `ops` expects


def test_the_destination_page_browses_sends_and_deletes(console: Console, ops: Any, stomp_client: Any) -> None:
    from selenium.webdriver.common.by import By

    queue = f"/queue/{unique('dest')}"
    producer = stomp_client(console.stomp)
    for i in range(3):
        producer.send(queue, f"body {i}", receipt=(i == 2), kind="order")
    go(ops, "destination/" + queue)
    until(ops, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#messages tbody tr")) == 3, "3 messages browsed")
    assert "body 0" in text_of(ops, "#messages tbody tr td.body")
    shows(ops, ".figure.depth .value", "3")
    ops.find_element(By.ID, "send-body").send_keys("sent from the console")
    click(ops, "#send-button")
    shows(ops, ".figure.depth .value", "4")
    screenshot(ops, "destination")
    consumer = stomp_client(console.stomp)
    consumer.subscribe(queue)
    assert consumer.wait_messages(4)[-1].body == b"sent from the console"
    consumer.close()
    for i in range(2):
        producer.send(queue, f"more {i}", receipt=(i == 1))
    shows(ops, ".figure.depth .value", "2")
    confirm(ops, "#dest-actions button.purge")
    shows(ops, ".figure.depth .value", "0")
    confirm(ops, "#dest-actions button.delete")
    until(ops, lambda d: d.find_elements(By.ID, "page-queues"), "back on the queues page")
    assert queue not in [d["name"] for d in console.api("/api/v1/destinations")]


def test_a_dead_letter_retried_from_its_page_reaches_a_consumer_of_its_queue(console: Console, ops: Any,
                                                                             stomp_client: Any) -> None:
    from selenium.webdriver.common.by import By

    queue = f"/queue/retry.{unique('orders')}"
    producer = stomp_client(console.stomp)
    producer.send(queue, "try again", persistent="true")
    rejecting = stomp_client(console.stomp)
    rejecting.subscribe(queue, ack="client-individual")
    (message,) = rejecting.wait_messages(1)
    rejecting.conn.nack(message.headers["ack"])  # max_redeliveries 0: to the DLQ
    rejecting.close()
    wait_for(lambda: any(m["headers"].get("originalDestination") == queue
                         for m in console.api("/api/v1/destinations/queue%2FDLQ/messages?limit=1000")), WAIT_S)

    go(ops, "destination/queue/DLQ")
    # (its id and text read at once: the page is redrawn every refresh)
    message_id, text = until(ops, lambda d: next(((r.get_attribute("data-id"), r.text)
                                                  for r in d.find_elements(By.CSS_SELECTOR, "#messages tbody tr")
                                                  if queue in r.text), None), "the dead letter listed")
    assert "try again" in text
    screenshot(ops, "dead-letters")
    consumer = stomp_client(console.stomp)
    consumer.subscribe(queue)
    click(ops, f'#messages tr[data-id="{message_id}"] button.retry')
    assert consumer.wait_messages(1)[0].body == b"try again"
    until(ops, lambda d: not d.find_elements(By.CSS_SELECTOR, f'#messages tr[data-id="{message_id}"]'), "it left the DLQ")


def test_the_connections_page_closes_a_connection(console: Console, ops: Any, stomp_client: Any) -> None:
    client_id = unique("closeme")
    victim = stomp_client(console.stomp, headers={"client-id": client_id})
    go(ops, "connections")
    row = f'#connections tr[data-client="{client_id}"]'
    until(ops, lambda d: text_of(d, row) != "", "the connection listed")
    screenshot(ops, "connections")
    confirm(ops, f"{row} button.close")
    assert victim.rec.disconnected.wait(WAIT_S), "the client was not disconnected"
    until(ops, lambda d: text_of(d, row) == "", "the connection gone from the page")


def test_the_cluster_page_on_a_single_node(console: Console, ops: Any) -> None:
    from selenium.webdriver.common.by import By

    go(ops, "cluster")
    until(ops, lambda d: "single node" in text_of(d, "#single"), "the single-node note")
    until(ops, lambda d: not d.find_element(By.ID, "cluster").is_displayed(), "no cluster panel")
