"""structlog set-up: console or JSON lines, level-filtered, no globals beyond structlog's own."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def configure(log_format: str = "console", level: str = "info") -> Any:
    """Configure structlog once for the process and return the root logger."""
    renderer: Any
    if log_format == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # Assembled now, not on each use: the server binds one logger per
    # connection, and binding a lazy proxy builds a logger anew every time.
    return structlog.get_logger("gateway").bind()
