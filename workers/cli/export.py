"""History export and import: ``durable history ID --json`` and the files ``durable replay`` reads.

The format: a JSON array of ``{"seq", "type", "ts", "data", "raw"}``, where ``seq``,
``type``, ``ts`` and ``data`` are exactly what ``WorkflowStub.history()`` gives (made
JSON-friendly: bytes as base64 ``{"$bytes": ...}``, sets as sorted lists, datetimes as
ISO 8601, exceptions as ``{"$error": type, "message": ...}``) and ``raw`` is the stored
entry, base64, from which ``replay`` rebuilds the event losslessly.
"""

from __future__ import annotations

import base64
import dataclasses
from pathlib import Path
from typing import Any

from durable import events as ev
from durable import hooktokens
from durable.client import HistoryEvent
from durable.exports import from_export
from durable.store.redis_store import RedisStore
from durable.untrusted import json_loads
from workers.cli.core import CliError

__all__ = ["export_history", "history_files", "load_export"]


def export_history(store: RedisStore, workflow_id: str, run_id: str | None = None) -> list[dict[str, Any]]:
    """The current run's (or ``run_id``'s) history in the export format (see the module docstring)."""
    ref = store.ref(workflow_id, run_id)
    out = []
    for entry in store.history(ref):
        item = HistoryEvent.from_entry(entry).to_dict()
        item["raw"] = base64.b64encode(_without_token(entry)).decode("ascii")
        out.append(item)
    return out


def _without_token(entry: ev.Entry) -> bytes:
    """The stored bytes, except that a hook token recorded in plaintext (by an older version)
    is exported as its digest, as newer versions record it: replay does not compare it."""
    event = entry.event
    if isinstance(event, ev.HookCreated) and not event.token.startswith(hooktokens.DIGEST_PREFIX):
        return ev.encode(dataclasses.replace(event, token=hooktokens.digest(event.token)), entry.ts)
    return entry.raw


def history_files(target: Path) -> list[Path]:
    """The export files to replay: ``target`` itself, or the ``.json`` files of a directory."""
    if target.is_dir():
        files = sorted(p for p in target.iterdir() if p.suffix == ".json" and p.is_file())
        if not files:
            raise CliError(f"no .json history files in {target}")
        return files
    if not target.exists():
        hint = ""
        if target.suffix != ".json" and len(target.parts) == 1:  # a workflow id, most likely
            hint = (
                f" (replay reads exported histories: `durable history {target} --json > {target}.json`, "
                f"then `durable replay {target}.json --app MODULE`)"
            )
        raise CliError(f"no such file or directory: {target}{hint}")
    return [target]


def load_export(path: Path) -> list[ev.Entry]:
    """Rebuild the stored entries of an exported history file (``history --json``)."""
    try:
        items = json_loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CliError(f"{path}: not a JSON history export ({exc})") from None
    return from_export(items, str(path))
