"""Dropped inputs as ``describe`` shows them: what was dropped, not only why.

A run's log keeps each input it read but did not apply (a signal or update that arrived as the
run closed, a poison input) with the input's exact stored bytes (field ``e``). The view of one
names the input -- its kind (``signal``, ``update``, ``cancel``... or the stored event type),
its name (the signal's or the update's), an update's id -- and gives a short preview of its
payload, bounded to :data:`PREVIEW_CHARS` characters.

Payloads under a payload hook (encryption, :class:`~durable.codec.KeyRing`) are sealed: their
preview is only ``<sealed payload, N bytes>``, never their text, like the log lines of
:func:`durable.codec.sealed.log_text` (``durable history`` shows them decoded, where the key is).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from . import codec
from . import events as ev
from .codec.hooks import get_payload_hook

__all__ = ["PREVIEW_CHARS", "PREVIEW_MAX_BYTES", "dropped_inputs", "dropped_view"]

PREVIEW_CHARS = 80
"""Most characters of a dropped input's payload preview (longer ones end with ``...``)."""

PREVIEW_MAX_BYTES = 64 * 1024
"""A payload larger than this is not decoded for a preview (only its size is shown)."""

_KINDS = {
    "SignalReceived": "signal",
    "UpdateRequested": "update",
    "CancelRequested": "cancel",
}


def dropped_inputs(log: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ``dropped`` entries of a run's log (``log_entries``), each as :func:`dropped_view`."""
    return [dropped_view(e) for e in log if e.get("kind") == "dropped"]


def dropped_view(entry: Mapping[str, Any]) -> dict[str, Any]:
    """One dropped input: ``reason``, ``ts``, and the input's ``input`` (its kind), ``name``,
    ``id`` (an update's) and ``preview`` (its payload, short; ``None``: it carries none).
    An input whose bytes cannot be read back is ``input: "unreadable"``."""
    out: dict[str, Any] = {"reason": entry.get("reason"), "ts": entry.get("ts")}
    raw = entry.get("e")
    if not isinstance(raw, bytes):
        return out | {"input": None, "name": None, "id": None, "preview": None}
    try:
        event = ev.decode(raw).event
    except Exception:  # describe shows the rest whatever the bytes hold
        return out | {"input": "unreadable", "name": None, "id": None, "preview": f"<{len(raw)} bytes>"}
    payload = next((getattr(event, p) for p in event.payloads if isinstance(getattr(event, p), bytes)), None)
    return out | {
        "input": _KINDS.get(event.type, event.type),
        "name": getattr(event, "name", None),
        "id": getattr(event, "id", None) if isinstance(event, ev.UpdateRequested) else None,
        "preview": None if payload is None else preview(payload),
    }


def preview(payload: bytes) -> str:
    """A payload in at most :data:`PREVIEW_CHARS` characters (sealed ones hidden)."""
    if get_payload_hook() is not None:
        return f"<sealed payload, {len(payload)} bytes>"
    if len(payload) > PREVIEW_MAX_BYTES:
        return f"<{len(payload)} bytes>"
    try:
        value = codec.view(payload)  # a class not loaded here shows by its name and fields
    except Exception:  # an undecodable (or encrypted, keyless) payload: its size only
        return f"<undecodable payload, {len(payload)} bytes>"
    # A signal's arguments: one argument is shown as the value its handler would get.
    shown = repr(value[0] if isinstance(value, tuple) and len(value) == 1 else value)
    return shown if len(shown) <= PREVIEW_CHARS else shown[: PREVIEW_CHARS - 3] + "..."
