"""The web console in a real headless browser (Debian's chromium through
chromedriver): it shows a queue a STOMP client just filled with its depth,
and its purge button empties it."""

from __future__ import annotations

from gateway.auth import hash_password
from tests.browser import requires_chromium
from tests.helpers import unique

pytestmark = requires_chromium


def test_the_console_shows_a_queue_and_purges_it(broker_factory, stomp_client, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    broker = broker_factory(admin={"users": [{"name": "ops", "password_hash": hash_password("pw", iterations=1000),
                                              "role": "write"}]})
    queue = f"/queue/{unique('console')}"
    producer = stomp_client(broker)
    for i in range(7):
        producer.send(queue, f"m{i}".encode(), receipt=(i == 6))

    browser.get(f"http://ops:pw@127.0.0.1:{broker.admin_port}/")
    row = f'#destinations tr[data-name="{queue}"]'
    wait = WebDriverWait(browser, 10)
    wait.until(expected_conditions.text_to_be_present_in_element((By.CSS_SELECTOR, f"{row} td.depth"), "7"))
    assert not browser.find_element(By.ID, "cluster").is_displayed()  # a single node: no cluster panel
    browser.find_element(By.CSS_SELECTOR, f"{row} button.purge").click()
    wait.until(expected_conditions.text_to_be_present_in_element((By.CSS_SELECTOR, f"{row} td.depth"), "0"))
    assert broker.call(lambda: broker.running.broker.queues[next(a for a in broker.running.broker.queues
                                                                   if a.text == queue)].depth) == 0
