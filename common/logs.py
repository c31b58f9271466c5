"""Structured logging: one logger per component, `event key=value ...` lines (or JSON)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_FORMAT = "text"


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "fields", {}) or {}
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        if _FORMAT == "json":
            doc = {"ts": ts, "level": record.levelname.lower(), "component": record.name,
                   "event": record.getMessage(), **fields}
            if record.exc_info:
                doc["exc"] = self.formatException(record.exc_info)
            return json.dumps(doc, default=str)
        kv = " ".join(f"{k}={_fmt(v)}" for k, v in fields.items())
        line = f"{ts} {record.levelname:<7} [{record.name}] {record.getMessage()}"
        if kv:
            line += " " + kv
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _fmt(v: Any) -> str:
    s = str(v)
    return json.dumps(s) if (" " in s or not s) else s


class StructLogger:
    """`log.info("event", key=value)`: the event is the message, keys become fields."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def _log(self, level: int, event: str, exc_info: bool = False, **fields: Any) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, event, exc_info=exc_info, extra={"fields": fields},
                             stacklevel=3)

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, **fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, exc_info=True, **fields)


def get_logger(component: str) -> StructLogger:
    return StructLogger(logging.getLogger(f"swarl.{component}"))


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    """Configure the root swarl logger once per process (stderr, so stdout stays for data)."""
    global _FORMAT
    _FORMAT = fmt
    root = logging.getLogger("swarl")
    root.setLevel(level.upper())
    if not any(getattr(h, "_swarl", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_Formatter())
        handler._swarl = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.propagate = False
