"""Structured logging: one JSON object per line (or plain text), with request fields when a record carries them."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

import orjson

from proxy.observability.settings import LoggingSettings

_FIELDS = ("request_id", "tenant", "route", "tier", "status", "latency_ms", "startup")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in _FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def plain(fmt: str, stream: TextIO) -> bool:
    """Whether ``logging.format`` ``fmt`` means plain text on ``stream`` (``auto``: when a person reads it)."""
    return fmt == "text" or (fmt == "auto" and stream.isatty())


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
                         if plain(fmt, sys.stderr) else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class LogLevel:
    """The root logger's level (``logging.level``): set by :func:`configure` at start, changed live
    (:mod:`proxy.assembly.live_settings`)."""

    live_keys = frozenset({"logging.level"})

    def configure(self, logging_settings: LoggingSettings) -> None:
        logging.getLogger().setLevel(logging_settings.level.upper())
