"""Logging for every command: one line per event on stderr, as text or JSON (`--log-format`).

Text: `2026-11-21T10:00:00.123Z INFO    shop/web autoscaler.controller.reconciler: message`
(UTC; the object column only for a program that names the object of each line). JSON: one
object per line with `time`, `level`, `logger`, `message`, and `object`, `namespace`, `name`
for such a program, `exception` with a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "add_logging_arguments", "configure_logging"]

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
_NO_OBJECT = "-"


def add_logging_arguments(group: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--log-format` and `--log-level`, as every long-running command takes them."""
    group.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                       help="one line per event, as text or JSON (default text)")
    group.add_argument("--log-level", default="info", choices=LOG_LEVELS,
                       help="(default info)")


class _ObjectFilter(logging.Filter):
    """Puts the object being worked on (`namespace/name`, or "-") on every record."""

    def __init__(self, current_object: Callable[[], str | None]) -> None:
        super().__init__()
        self._current_object = current_object

    def filter(self, record: logging.LogRecord) -> bool:
        record.object = self._current_object() or _NO_OBJECT
        return True


class _JSONFormatter(logging.Formatter):
    def __init__(self, *, with_object: bool) -> None:
        super().__init__()
        self._with_object = with_object

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        obj = getattr(record, "object", _NO_OBJECT) if self._with_object else None
        if obj is not None:
            line["object"] = obj
        line["message"] = record.getMessage()
        if obj is not None and obj != _NO_OBJECT and "/" in obj:
            line["namespace"], line["name"] = obj.split("/", 1)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure_logging(*, fmt: str, level: str, stream: TextIO | None = None,
                      current_object: Callable[[], str | None] | None = None
                      ) -> logging.Handler:
    """One handler on the root logger, writing `fmt` ("text" or "json") from `level` up.

    `current_object` names the object a line is about (the autoscaler being reconciled), or
    None; without it, lines have no object.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    with_object = current_object is not None
    if current_object is not None:
        handler.addFilter(_ObjectFilter(current_object))
    if fmt == "json":
        handler.setFormatter(_JSONFormatter(with_object=with_object))
    else:
        column = " %(object)s" if with_object else ""
        formatter = logging.Formatter(
            f"%(asctime)s.%(msecs)03dZ %(levelname)-7s{column} %(name)s: %(message)s",
            datefmt="%Y-%m-%dT%H:%M:%S")
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level.upper())
    # aiohttp's access log would add a line per probe; requests are counted in /metrics.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return handler
