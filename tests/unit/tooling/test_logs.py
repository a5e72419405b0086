"""The console log line: gateway.logs.ConsoleLines makes the common line
itself and must give exactly what structlog's ConsoleRenderer (no colours)
gives, for every shape of line, including those it hands back to it."""

from __future__ import annotations

import enum
import io
import sys
from typing import Any

import pytest
import structlog

from gateway import logs


class Colour(enum.Enum):
    RED = "red"


class Text(str):
    """A str subclass: shown like a str."""


TIMESTAMP = "2026-11-25T01:47:40.021990Z"
LINES: list[dict[str, Any]] = [
    {"timestamp": TIMESTAMP, "level": "info", "event": "connection_opened", "conn_id": "mqtt-1", "peer": "127.0.0.1:5",
     "protocol": "mqtt", "tls": False},
    {"timestamp": TIMESTAMP, "level": "info", "event": "mqtt_connected", "client_id": "c", "clean_session": True,
     "keep_alive": 60, "session_present": False},
    {"timestamp": TIMESTAMP, "level": "warning", "event": "packet_rejected", "packet": None, "reason": "no CONNECT in time"},
    {"timestamp": TIMESTAMP, "level": "critical", "event": "an event name longer than the thirty-character column"},
    {"timestamp": TIMESTAMP, "level": "debug", "event": ""},
    {"level": "info", "event": "no timestamp", "zeta": 1, "alpha": 2.5, "mid": -3},
    {"timestamp": "", "level": "", "event": "empty columns", "empty": ""},
    {"timestamp": None, "level": "info", "event": None, "value": None},
    {"event": "no level"},
    {"timestamp": TIMESTAMP, "level": "error", "event": "quoting", "space": "a b", "tab": "a\tb", "equals": "a=b",
     "cr": "a\rb", "newline": "a\nb", "double": 'say "hi"', "single": "it's", "plain": "a-b_c.d/e:f",
     "unicode": "température", "subclass": Text("x y"), "plain_subclass": Text("xy")},
    {"timestamp": TIMESTAMP, "level": "info", "event": "values", "bytes": b"\x00ab", "list": [1, "a b"], "dict": {"k": "v"},
     "enum": Colour.RED, "tuple": (1,), "big": 10**30, "float": 1e-9, "set": frozenset()},
    {"timestamp": TIMESTAMP, "level": "info", "event": 42, "x": 1},
    {"timestamp": 1234.5, "level": "info", "event": "a numeric timestamp"},
    # Handed back to the general renderer:
    {"timestamp": TIMESTAMP, "level": "info", "event": "named", "logger": "gateway", "x": 1},
    {"timestamp": TIMESTAMP, "level": "info", "event": "named", "logger_name": "gateway"},
    {"timestamp": TIMESTAMP, "level": "error", "event": "failed", "exception": "Traceback (most recent call last):\n  boom"},
    {"timestamp": TIMESTAMP, "level": "info", "event": "with a stack", "stack": "Stack (most recent call last):\n  here"},
]


@pytest.mark.parametrize("line", LINES, ids=lambda line: str(line.get("event"))[:24])
def test_each_line_is_what_structlogs_console_renderer_makes(line: dict[str, Any]) -> None:
    general = structlog.dev.ConsoleRenderer(colors=False)
    assert logs.ConsoleLines()(None, "info", dict(line)) == general(None, "info", dict(line))


def test_the_configured_console_logger_writes_one_line_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    saved = structlog.get_config()
    try:
        log = logs.configure("console", "info").bind(conn_id="mqtt-7", peer="127.0.0.1:9")
        log.info("connection_opened", protocol="mqtt", tls=False)
        log.debug("not at info")
    finally:
        structlog.configure(**saved)
    [line] = out.getvalue().splitlines()
    assert line.endswith("[info     ] connection_opened              conn_id=mqtt-7 peer=127.0.0.1:9 protocol=mqtt tls=False")
