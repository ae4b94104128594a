"""A history exported by ``durable history ID --json``, read back (``durable replay``, the
testing kit's replayer): its ``raw`` fields are the stored bytes, so nothing is re-encoded."""

from __future__ import annotations

import base64
from typing import Any

from .errors import ConfigurationError
from .events import Entry, decode

__all__ = ["from_export"]


def from_export(items: Any, where: str) -> list[Entry]:
    """Rebuild stored entries from an export of ``durable history ID --json`` (its ``raw`` fields).

    Raises:
        ConfigurationError: naming ``where`` and the event that is not a lossless export.
    """
    if not isinstance(items, list) or not items:
        raise ConfigurationError(f"{where}: expected a non-empty list of events (durable history ID --json)")
    entries = []
    for index, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("raw"), str):
            raise ConfigurationError(
                f"{where}: event #{index + 1} has no 'raw' field; export with `durable history ID --json`"
            )
        try:
            raw = base64.b64decode(item["raw"], validate=True)
        except ValueError:
            raise ConfigurationError(
                f"{where}: event #{index + 1} has an invalid base64 'raw' field"
            ) from None
        seq = item["seq"] if isinstance(item.get("seq"), int) else index + 1
        run_id = str((item.get("data") or {}).get("run_id", "")) if index == 0 else ""
        entries.append(decode(raw, run_id=run_id, seq=seq))
    return entries
