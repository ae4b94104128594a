"""An event of a type a newer release of durable wrote: read and shown as stored, never replayed.

Its envelope says the history format it needs (:mod:`durable.history_format`), past this
release's: ``durable history``, the API and the UI show it with its data as stored, and replay
(:func:`durable.history_format.require`) refuses it with :class:`~durable.errors.HistoryTooNew`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .events import Event
from .immutable import immutable

__all__ = ["NewerEvent"]


@immutable(kw_only=True)
class NewerEvent(Event):
    """An event this release has no class for; ``type_name`` is its stored type."""

    type_name: str
    data: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def type(self) -> str:
        return self.type_name

    def to_data(self) -> dict[str, Any]:
        return dict(self.data)
