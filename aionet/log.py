"""structlog setup. Library code only calls ``get_logger``; programs (the CLI) call
``configure`` once to choose level and format."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def get_logger(name: str = "aionet", **bind: Any) -> Any:
    return structlog.get_logger(name).bind(**bind) if bind else structlog.get_logger(name)


def configure(level: str = "info", fmt: str = "console", stream: Any = None) -> None:
    """Route structlog through a filtering logger writing to ``stream`` (default stderr)."""
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        lvl = logging.INFO
    renderer: Any = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
