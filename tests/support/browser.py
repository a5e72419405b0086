"""Debian's headless chromium through chromedriver, for the tests that need a
real browser (the console, stomp.js and MQTT.js over WebSocket), and a tiny
loopback HTTP server for the pages those tests load."""

from __future__ import annotations

import http.server
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
requires_chromium = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None, reason="chromium and chromedriver not installed (make test installs them)"
)
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


@contextmanager
def chromium(*extra_flags: str) -> Iterator[Any]:
    """A headless chromium session (selenium WebDriver), quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS + extra_flags:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


@contextmanager
def serve_files(files: dict[str, Path]) -> Iterator[str]:
    """Serve exactly ``files`` (URL path -> file) on 127.0.0.1; yields the base URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = files.get(self.path.split("?", 1)[0])
            if path is None:
                self.send_error(404)
                return
            body = path.read_bytes()
            self.send_response(200)
            kind = "text/html" if path.suffix == ".html" else "text/javascript"
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return None  # quiet: the tests say what went wrong

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="pages", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def console_login(driver: Any, base: str, user: str, password: str, page: str = "overview") -> None:
    """Open the admin console at ``base`` (http://host:port), log in through
    its form and wait for ``page`` (#/<page>) to be drawn."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{base}/#/{page}")
    wait = WebDriverWait(driver, 20)
    wait.until(lambda d: d.find_element(By.ID, "login-user").is_displayed())
    for field, value in (("login-user", user), ("login-password", password)):
        driver.find_element(By.ID, field).clear()
        driver.find_element(By.ID, field).send_keys(value)
    driver.find_element(By.ID, "login-submit").click()
    wait.until(lambda d: d.find_elements(By.ID, f"page-{page.split('/')[0]}"))
