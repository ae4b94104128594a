"""Logging setup for the ``durable`` command: plain text or one JSON object per line.

Either way, passwords in URLs are masked (:func:`workers.config.mask_secrets`): a
message that quotes a Redis URL, or an exception that does, never logs the secret.

A line about a run carries its ids (:data:`RUN_FIELDS`): the worker binds them
(:func:`bind_run`) around each decision and activity attempt, in a context
variable, and :class:`RunContextFilter` copies them onto every record logged
meanwhile. The workflow logger (``durable.workflow_logger()``) sets them itself.
Text lines end with ``[workflow_id=... run_id=...]``; JSON lines have them as keys.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import Any

from durable.untrusted import terminal_safe
from workers.config import mask_secrets

__all__ = [
    "RUN_FIELDS",
    "JsonFormatter",
    "MaskingFormatter",
    "RunContextFilter",
    "bind_run",
    "bound_run",
    "configure",
    "unbind_run",
]

RUN_FIELDS = ("workflow_id", "run_id", "workflow_type", "activity_id", "activity_type", "attempt")
"""The ids a log record about a run carries (those that apply), in this order."""

_run: ContextVar[dict[str, Any] | None] = ContextVar("durable_run", default=None)


def bind_run(fields: dict[str, Any]) -> Token[dict[str, Any] | None]:
    """Attach ``fields`` (of :data:`RUN_FIELDS`) to every record logged in this context until
    :func:`unbind_run`; returns the token to pass it. The dict may be updated meanwhile
    (a replay learns the workflow type)."""
    return _run.set(fields)


def unbind_run(token: Token[dict[str, Any] | None]) -> None:
    """End what :func:`bind_run` began."""
    _run.reset(token)


def bound_run() -> dict[str, Any] | None:
    """The fields bound in this context (``None``: none)."""
    return _run.get()


class RunContextFilter(logging.Filter):
    """Copies the bound run's ids onto each record (never over ids the record has)."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _run.get()
        if fields:
            for name, value in fields.items():
                if value not in (None, "") and not hasattr(record, name):
                    setattr(record, name, value)
        return True


def _run_ids(record: logging.LogRecord) -> dict[str, Any]:
    ids = {}
    for name in RUN_FIELDS:
        value = getattr(record, name, None)
        if value not in (None, ""):
            ids[name] = value
    return ids


TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
FORMATS = ("text", "json")


class _SafeTracebacks(logging.Formatter):
    """A traceback that cannot be formatted (an error whose own attributes raise) is said as
    such: the log call must not raise in the worker's threads, which would die with it."""

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's name
        try:
            return super().formatException(ei)
        except Exception as err:  # noqa: BLE001 - whatever the error's class does
            name = getattr(ei[0], "__name__", "?") if ei else "?"
            return f"(the traceback of this {name} could not be formatted: {type(err).__name__}: {err})"


_worker_name = ""


def name_process(worker: str) -> None:
    """Name the worker this process runs in its JSON lines (``worker``): under ``--processes N``
    every child writes to the supervisor's stderr, and a line said nothing of which one."""
    global _worker_name
    _worker_name = worker


class JsonFormatter(_SafeTracebacks):
    """One JSON object per line: ``ts`` (ISO 8601 UTC), ``level``, ``logger``, ``message``,
    ``pid``, ``worker`` (its registry name, once the process runs one: :func:`name_process`),
    the run's ids (:data:`RUN_FIELDS`, those the record carries), ``exc`` (the formatted
    traceback, when the record carries one)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        if _worker_name:
            out["worker"] = _worker_name
        out.update(_run_ids(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return mask_secrets(json.dumps(out, default=str, ensure_ascii=False))


class MaskingFormatter(_SafeTracebacks):
    """The text format, with passwords in URLs masked and the run's ids at the end of the line."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = _run_ids(record)
        if ids:
            tail = " [" + " ".join(f"{k}={v}" for k, v in ids.items()) + "]"
            # Before a traceback, so the ids stay on the message's own line.
            head, sep, rest = line.partition("\n")
            line = head + tail + sep + rest
        # A message quoting someone's text (an activity's error) must not act on the terminal.
        return mask_secrets(terminal_safe(line))


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
    handler.addFilter(RunContextFilter())
    handler._durable = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_durable", False):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)


def logs_json() -> bool:
    """Whether this process's log lines are JSON (:func:`configure` with ``json``): an error that
    ends it is then one too, else a log pipeline drops the line saying why it is down."""
    return any(
        getattr(h, "_durable", False) and isinstance(h.formatter, JsonFormatter)
        for h in logging.getLogger().handlers
    )
