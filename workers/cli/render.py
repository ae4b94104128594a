"""What the CLI prints: JSON (made safe for any stored value) and rich tables."""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import decimal
import enum
import json
import math
import os
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from durable import HistoryEvent
from durable.runinfo import blocked_reason, from_now, last_frame, past_dates
from durable.store.records import CLOSED_STATUSES
from durable.untrusted import terminal_safe

__all__ = [
    "console",
    "dead_letters_table",
    "describe_tables",
    "fmt_ms",
    "history_table",
    "json_default",
    "runs_table",
    "short",
    "summarize",
    "to_json",
]

# --------------------------------------------------------------------------- JSON


def json_default(value: Any) -> Any:
    """``json.dumps(default=...)`` for what history data may hold."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, set | frozenset):
        items = list(value)
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=repr)
    if isinstance(value, _dt.datetime | _dt.date | _dt.time):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal | uuid.UUID | Path):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, BaseException):
        return {"$error": type(value).__name__, "message": str(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, complex):
        return [value.real, value.imag]
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    return repr(value)


def _json_key(key: Any) -> Any:
    if isinstance(key, str | int | float | bool) or key is None:
        return key
    if isinstance(key, bytes | bytearray):
        # Stored task fields (a parked task's, say) keep Redis's bytes keys.
        return bytes(key).decode("utf-8", errors="backslashreplace")
    return str(key)


_MARKERS = frozenset({"$bytes", "$float", "$error", "$dict"})


def _string_keys(value: Any) -> Any:
    """``value`` with every dict key one JSON accepts (``default`` never sees keys), and a
    float JSON has no number for (NaN, infinities) as ``{"$float": "nan" | "inf" | "-inf"}``:
    ``json.dumps`` would write ``NaN``, which no JSON parser (a browser's) reads; and a dict
    with a marker's key as ``{"$dict": {...}}``."""
    if isinstance(value, Mapping):
        out = {_json_key(k): _string_keys(v) for k, v in value.items()}
        # A dict of the payload's own with a marker's key (``{"$bytes": "AAEC"}`` sent as a
        # signal) read back exactly like the bytes the marker stands for: it is wrapped.
        return out if _MARKERS.isdisjoint(out) else {"$dict": out}
    if isinstance(value, list | tuple):
        return [_string_keys(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": str(value)}
    return value


def to_json(value: Any, *, indent: int | None = None) -> str:
    """``value`` as JSON: bytes keys decoded, other values through :func:`json_default`; DEL and
    the C1 controls escaped as ``\\u00XX`` (JSON leaves them raw, and a terminal acts on them)."""
    text = json.dumps(
        _string_keys(value), default=json_default, ensure_ascii=False, indent=indent, allow_nan=True
    )
    return _RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


_RAW_IN_JSON = re.compile("[\x7f-\x9f]")


# --------------------------------------------------------------------------- text


class _Console(Console):
    """A console whose text from strings has its control characters escaped
    (:func:`~durable.untrusted.terminal_safe`): the tables hold what runs and their callers wrote."""

    def render_str(self, text: str, **kwargs: Any) -> Any:
        return super().render_str(terminal_safe(text), **kwargs)


def styled(text: str, style: str = "") -> Text:
    """A rich ``Text`` of ``text`` in ``style``, its control characters escaped (see :class:`_Console`)."""
    return Text(terminal_safe(text), style=style)


def echo(message: Any = None, err: bool = False, nl: bool = True) -> None:
    """``click.echo`` with the control characters of ``message`` escaped (see :class:`_Console`)."""
    click.echo(None if message is None else terminal_safe(str(message)), err=err, nl=nl)


def console(err: bool = False) -> Console:
    """A rich console; not a terminal (pipes, CliRunner): 160 columns, tables not folded at 80.

    No markup and no emoji codes in what it prints: the tables hold ids, payloads, errors and
    reasons as they were given, and rich would take ``[true]`` (a payload), ``[red]`` or an IPv6
    ``[::1]`` for its own markup and drop it, and show an id ``order:cross_mark:1`` as ``order❌1``
    (copied from the table, an id that does not exist)."""
    out = _Console(stderr=err, highlight=False, soft_wrap=False, markup=False, emoji=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = 160
    return out


def fmt_ms(ms: Any, fmt: str = "%Y-%m-%d %H:%M:%S.%f") -> str:
    """Epoch milliseconds as UTC text ("" for none); beyond year 9999 (a timer set for
    ages), the milliseconds themselves."""
    if not isinstance(ms, int | float) or ms <= 0:
        return ""
    if past_dates(ms):
        return f"after 9999-12-31 ({int(ms)} ms)"
    try:
        return _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.UTC).strftime(fmt)[:-3]
    except (ValueError, OverflowError, OSError):  # NaN: no date to write
        return f"{ms} ms"


def short(value: Any, width: int = 80) -> str:
    """``value`` as text (JSON unless a string), cut to ``width`` with an ellipsis."""
    text = value if isinstance(value, str) else to_json(value)
    return text if len(text) <= width else text[: width - 1] + "…"


_EPOCH_MS = ("fire_at", "deadline")  # history data fields that hold UTC ms
_SUMMARY_SKIP = {"id", "run_id", "workflow_id", "signal_id", "timeouts", "options", "build_id", "patches"}


def summarize(event: HistoryEvent) -> str:
    """A one-line summary of an event's data for tables."""
    parts = []
    for key, value in event.data.items():
        if key in _SUMMARY_SKIP or value in (None, "", [], {}, False):
            continue
        if key in _EPOCH_MS and isinstance(value, int) and (when := fmt_ms(value)):
            # A time, as the time column says it, and how far after the event it lies (the
            # timer's or the wait's length as the code asked for it).
            parts.append(f"{key}={when} (+{(value - event.ts) / 1000:g} s)")
            continue
        parts.append(f"{key}={short(value, 60)}")
    return short(", ".join(parts), 100)


# --------------------------------------------------------------------------- tables


def history_table(events: Sequence[HistoryEvent], title: str | None = None) -> Table:
    """One row per event: seq, time, type (failures in red), step id, data summary."""
    table = Table(title=title, show_lines=False)
    table.add_column("seq", justify="right", no_wrap=True)
    table.add_column("time (UTC)", no_wrap=True)
    table.add_column("type", no_wrap=True)
    table.add_column("id", no_wrap=True)
    table.add_column("data", overflow="fold")
    for e in events:
        style = "red" if e.type in ("WorkflowFailed", "ActivityFailed", "ChildFailed") else None
        table.add_row(
            str(e.seq),
            fmt_ms(e.ts, "%H:%M:%S.%f"),
            styled(e.type, style=style or ""),
            str(e.data.get("id", "")),
            summarize(e),
        )
    return table


def _describe_head(info: Mapping[str, Any], redis_url: str) -> Table:
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("workflow id", str(info.get("workflow_id")))
    head.add_row("run id", str(info.get("run_id")))
    head.add_row("type", str(info.get("type")))
    head.add_row("status", str(info.get("status")))
    head.add_row("history length", str(info.get("seq", "")))
    head.add_row("created", fmt_ms(info.get("created")))
    if info.get("closed"):
        head.add_row("closed", fmt_ms(info["closed"]))
    if info.get("purge_at"):  # after that, "no workflow with id": said before it happens
        head.add_row("purged at", f"{fmt_ms(info['purge_at'])} (retention)")
    if info.get("blocked"):
        reason = f"{info.get('blocked_kind') or 'other'}: {info['blocked']}"
        head.add_row("blocked", styled(reason, style="bold red"))
    if info.get("workflow_task"):  # a run held up there says so here too, as status does
        head.add_row("workflow task", str(info["workflow_task"]))
    outcome = info.get("outcome") or {}
    if outcome.get("error"):
        head.add_row(
            "error", styled(f"{outcome['error']['type']}: {outcome['error']['message']}", style="red")
        )
        if info.get("raised_at"):
            head.add_row("raised at", info["raised_at"])
    elif outcome.get("status") == "completed":
        head.add_row("result", short(to_json(outcome.get("result")), 200))
    if info.get("signals_buffered"):
        head.add_row("signals buffered", to_json(info["signals_buffered"]))
    if info.get("signals_undecided"):
        head.add_row("signals not yet decided", to_json(info["signals_undecided"]))
    if info.get("updates_undecided"):
        shown = ", ".join(f"{u['name']} ({u['id']})" for u in info["updates_undecided"])
        head.add_row("updates not yet decided", shown)
    if info.get("cancel_requested"):
        head.add_row("cancel requested", "yes")
    if info.get("search_attributes"):
        head.add_row("search attributes", short(to_json(info["search_attributes"]), 400))
    if info.get("memo"):
        head.add_row("memo", short(to_json(info["memo"]), 400))
    head.add_row("redis", redis_url)
    return head


def _pending_table(pending: Sequence[Mapping[str, Any]], *, closed: bool = False) -> Table:
    """A run's pending steps; a closed run's are what it waited on as it closed (no deadline
    of theirs is still coming)."""
    title = "pending when it closed (nothing waits now)" if closed else "pending steps"
    table = Table(title=title, title_justify="left")
    for col in ("kind", "id", "name", "deadline", "state"):
        table.add_column(col, overflow="fold")
    for item in pending:
        name = item.get("name") or item.get("workflow_id") or ""
        table.add_row(
            str(item.get("kind", "")),
            str(item.get("id", "")),
            str(name),
            fmt_ms(item.get("deadline")) if closed else _deadline(item.get("deadline")),
            str(item.get("state", "")),
        )
    return table


def _deadline(ms: Any) -> str:
    """A pending step's deadline, and how far off it is (this host's clock: for reading only)."""
    at = fmt_ms(ms)
    if not at or not isinstance(ms, int | float) or past_dates(ms):
        return at  # none, or past any date (a timer set for ages)
    return f"{at} ({from_now(ms, time.time() * 1000)})"


def _attempts_table(attempts: Sequence[Mapping[str, Any]]) -> Table:
    table = Table(title="activity attempts", title_justify="left")
    for col in ("activity", "attempt", "outcome", "error", "duration", "time (UTC)"):
        table.add_column(col, overflow="fold")
    for item in attempts:
        raw = item.get("record")
        record: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
        duration = record.get("duration_ms")
        outcome = str(item.get("outcome", ""))
        table.add_row(
            str(item.get("act", "")) + (f" ({record['name']})" if record.get("name") else ""),
            str(item.get("attempt", "")),
            styled(outcome, style="red" if outcome in ("failed", "retry", "lost") else ""),
            short(_attempt_error(record) or str(item.get("reason") or ""), 120),
            f"{duration} ms" if duration is not None else "",
            fmt_ms(item.get("ts")),
        )
    return table


def _attempt_error(record: Mapping[str, Any]) -> str:
    """An attempt's error; sealed (no key ring in this process): its readable type first."""
    error = str(record.get("error", ""))
    if error.startswith("<sealed text") and record.get("error_type"):
        return f"{record['error_type']}: {error}"
    where = last_frame(str(record.get("traceback") or ""))  # the activity's raise site
    if where:
        path, _, rest = where.partition(":")
        return f"{short(error, 60)} (at {Path(path).name}:{rest})"
    return error


def _dropped_table(dropped: Sequence[Mapping[str, Any]]) -> Table:
    table = Table(title="dropped inputs", title_justify="left")
    table.add_column("time (UTC)")
    table.add_column("input")
    table.add_column("name", overflow="fold")
    table.add_column("payload", overflow="fold")
    table.add_column("reason", overflow="fold")
    for item in dropped:
        name = str(item.get("name") or "")
        if item.get("id"):  # an update's id: the caller's handle on it
            name += f" (id {item['id']})"
        table.add_row(
            fmt_ms(item.get("ts")),
            str(item.get("input") or "?"),
            name,
            str(item.get("preview") or ""),
            str(item.get("reason", "")),
        )
    return table


def describe_tables(info: Mapping[str, Any], redis_url: str) -> list[Table]:
    """``durable describe``: the run's head, then pending steps, attempts and dropped inputs."""
    tables = [_describe_head(info, redis_url)]
    if info.get("pending"):
        tables.append(_pending_table(info["pending"], closed=info.get("status") in CLOSED_STATUSES))
    if info.get("attempts"):
        tables.append(_attempts_table(info["attempts"]))
    if info.get("dropped"):
        tables.append(_dropped_table(info["dropped"]))
    return tables


def dead_letters_table(
    letters: Sequence[Mapping[str, Any]], redis_url: str, total: int | None = None
) -> Table:
    """``durable list --dead``: one row per parked task (the newest, of ``total``)."""
    shown = (
        f"{len(letters)} newest of {total:,}" if total is not None and total > len(letters) else len(letters)
    )
    more = "; --limit N for more" if total is not None and total > len(letters) else ""
    table = Table(title=f"dead letters ({shown})", title_justify="left", caption=f"redis: {redis_url}{more}")
    for col in ("partition", "entry", "kind", "workflow id", "run", "reason"):
        table.add_column(col, overflow="fold")
    for item in letters:
        table.add_row(
            str(item.get("partition", "")),
            str(item.get("id", "")),
            str(item.get("kind", "")),
            str(item.get("workflow_id") or ""),
            str(item.get("run", "")),
            _letter_reason(item),
        )
    return table


def _letter_reason(item: Mapping[str, Any]) -> str | Text:
    """A letter's reason; of a run closed since, dimmed and said so (its advice to repair is moot)."""
    status = item.get("run_status")
    if status in CLOSED_STATUSES:
        return styled(f"{item.get('reason', '')} (run {status} since: nothing to repair)", style="dim")
    return str(item.get("reason", ""))


def runs_table(runs: Sequence[Mapping[str, Any]], redis_url: str) -> Table:
    """``durable list``: one row per run, newest first (``--json`` has ``created`` in ms; a full
    page ends with the ``--before`` cursor of the next)."""
    table = Table(title=f"runs ({len(runs)})", title_justify="left", caption=f"redis: {redis_url}")
    for col in ("workflow id", "run id", "type", "status", "created (UTC)", "blocked"):
        table.add_column(col, overflow="fold")
    for r in runs:
        table.add_row(
            str(r.get("workflow_id", "")),
            str(r.get("run_id", "")),
            str(r.get("type", "")),
            str(r.get("status", "")),
            fmt_ms(r.get("created")),
            styled(str(blocked_reason(r) or ""), style="red"),
        )
    return table
