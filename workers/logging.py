"""Logging setup for the ``durable`` command: plain text or one JSON object per line.

Either way, passwords in URLs are masked (:func:`workers.config.mask_secrets`): a
message that quotes a Redis URL, or an exception that does, never logs the secret.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from workers.config import mask_secrets

__all__ = ["JsonFormatter", "MaskingFormatter", "configure"]

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (ISO 8601 UTC), ``level``, ``logger``, ``message``,
    ``exc`` (the formatted traceback, when the record carries one)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return mask_secrets(json.dumps(out, default=str, ensure_ascii=False))


class MaskingFormatter(logging.Formatter):
    """The text format, with passwords in URLs masked."""

    def format(self, record: logging.LogRecord) -> str:
        return mask_secrets(super().format(record))


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """Send the root logger's records to stderr at ``level`` in ``fmt`` (``text`` or ``json``).

    Replaces handlers installed by an earlier call, so it may be called again.

    Raises:
        ValueError: unknown level or format.
    """
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {FORMATS}, not {fmt!r}")
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else MaskingFormatter(TEXT_FORMAT))
    handler._durable = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_durable", False):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
