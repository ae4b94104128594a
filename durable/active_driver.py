"""Which driver replays or decides on this thread right now: what the workflow logger and the
codec's payload warnings ask (silent while a run's history is replayed). Below both: it imports
nothing of durable's."""

from __future__ import annotations

import threading
from typing import Protocol

__all__ = ["active_driver", "set_active"]


class Deciding(Protocol):
    """What the readers of the active driver use of it."""

    run_id: str
    workflow_id: str

    @property
    def workflow_type(self) -> str: ...

    @property
    def is_replaying(self) -> bool: ...


_active = threading.local()


def active_driver() -> Deciding | None:
    """The driver replaying or deciding on this thread right now, if any."""
    return getattr(_active, "driver", None)


def set_active(driver: Deciding | None) -> Deciding | None:
    """Make ``driver`` this thread's active driver; returns the previous one (to restore)."""
    previous = getattr(_active, "driver", None)
    _active.driver = driver
    return previous
