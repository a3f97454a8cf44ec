"""Logging: structlog for structured calls, the standard library's ``logging`` underneath.

Library code calls ``get_logger("aionet.<part>", **bound)``. Each event goes to the stdlib
logger of that name (children of ``"aionet"``), so a program tunes aionet like any other
library: ``logging.getLogger("aionet").setLevel(logging.INFO)``, its own handlers, filters,
``logging.basicConfig``. aionet adds no handler by itself: with none configured anywhere,
Python's last-resort handler prints WARNING and above to stderr and nothing below it, and
nothing ever goes to stdout. ``[log] level`` in a Node's config sets the ``"aionet"`` logger's
level (process-wide, as stdlib levels are); programs that want aionet's own output (the CLI)
call :func:`configure`, which adds one stderr handler writing console or JSON lines.

structlog is never configured globally: each logger is built with its own processors, so a
program's ``structlog.configure(...)`` neither changes aionet's output nor is changed by it,
and any number of Nodes share one process. ``structlog.testing.capture_logs()`` still sees
aionet's events (tests rely on it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from typing import Any

import structlog
from structlog.exceptions import DropEvent
from structlog.testing import LogCapture

LOGGER = "aionet"
LEVELS = ("debug", "info", "warning", "error", "critical")
_CLI_HANDLER = "_aionet_cli_handler"  # marks the handler configure() installed


def _to_capture(logger: Any, method_name: str, event_dict: Any) -> Any:
    """Hand the event to ``structlog.testing.capture_logs()`` while one is active."""
    for proc in structlog.get_config()["processors"]:
        if isinstance(proc, LogCapture):
            with contextlib.suppress(DropEvent):
                proc(logger, method_name, dict(event_dict))
    return event_dict


def _value(v: Any) -> str:
    s = v if isinstance(v, str) else repr(v)
    return repr(s) if isinstance(v, str) and (not s or any(c.isspace() or c in "='\"" for c in s)) else s


def _to_stdlib(_logger: Any, _method: str, event_dict: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Final processor: one readable message for any stdlib formatter (``event k=v ...``),
    the structured fields alongside for :class:`JSONFormatter`."""
    event = str(event_dict.pop("event", ""))
    exc_info = event_dict.pop("exc_info", None)
    fields = dict(sorted(event_dict.items()))
    msg = event + ("  " + " ".join(f"{k}={_value(v)}" for k, v in fields.items()) if fields else "")
    return (msg,), {"exc_info": exc_info, "extra": {"aionet_event": event, "aionet_fields": fields}}


_PROCESSORS = (_to_capture, structlog.stdlib.filter_by_level, _to_stdlib)


def get_logger(name: str = LOGGER, **bind: Any) -> Any:
    """A structlog logger writing to the stdlib logger ``name`` (keep it under ``aionet``)."""
    return structlog.stdlib.BoundLogger(logging.getLogger(name), _PROCESSORS, dict(bind))


def level_number(level: str) -> int:
    """'debug' -> logging.DEBUG; a ValueError naming the valid levels otherwise."""
    lvl = logging.getLevelName(str(level).upper())
    if str(level).lower() not in LEVELS or not isinstance(lvl, int):
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    return lvl


def apply_level(level: str) -> None:
    """``[log] level`` of a Node's config: set the ``aionet`` logger's level; "" leaves it
    alone. Adds no handler: where records go stays the program's choice."""
    if level:
        logging.getLogger(LOGGER).setLevel(level_number(level))


class ConsoleFormatter(logging.Formatter):
    """``2025-01-01T12:00:00.123Z [info     ] aionet.node: peer connected  node=a peer=b``"""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        line = f"{ts} [{record.levelname.lower():<9}] {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JSONFormatter(logging.Formatter):
    """One JSON object per line: timestamp, level, logger, event and the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        out: dict[str, Any] = {"timestamp": ts, "level": record.levelname.lower(), "logger": record.name}
        out["event"] = getattr(record, "aionet_event", None) or record.getMessage()
        out.update(getattr(record, "aionet_fields", {}))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str = "info", fmt: str = "console", stream: Any = None) -> logging.Handler:
    """For programs (the CLI): send aionet's records at ``level`` and above to ``stream``
    (default stderr) as console or JSON lines. Calling it again replaces the handler."""
    logger = logging.getLogger(LOGGER)
    for h in list(logger.handlers):
        if getattr(h, _CLI_HANDLER, False):
            logger.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    setattr(handler, _CLI_HANDLER, True)
    handler.setFormatter(JSONFormatter() if fmt == "json" else ConsoleFormatter())
    logger.addHandler(handler)
    logger.setLevel(level_number(level))
    logger.propagate = False  # a root handler the program also has must not print each line twice
    return handler
