"""Saying a problem that repeats once in a while, not at every pass that meets it.

A key of the wrong kind, a schedule whose pass fails, a result that cannot be recorded: the
loops that meet them run every second or faster, and a line each time buried the log (95,000
lines a minute). The first time is said, then again once per ``every`` seconds while it lasts.
"""

from __future__ import annotations

import time
from collections.abc import Hashable

__all__ = ["Quiet"]


class Quiet:
    """Which problems were said lately (by a key of the caller's choosing)."""

    def __init__(self, every: float = 60.0) -> None:
        self.every = every
        self._at: dict[Hashable, float] = {}

    def first(self, key: Hashable) -> bool:
        """Whether ``key`` was never said yet."""
        return key not in self._at

    def due(self, key: Hashable) -> bool:
        """Whether ``key`` is to be said now (never said, or last said ``every`` seconds ago);
        if so, it counts as said."""
        now = time.monotonic()
        last = self._at.get(key)
        if last is not None and now - last < self.every:
            return False
        self._at[key] = now
        return True
