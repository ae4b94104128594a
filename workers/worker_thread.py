"""A worker running in a background thread of this process (tests, ``durable dev``)."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .worker import Worker

__all__ = ["WorkerThread"]


class WorkerThread:
    """A worker running in a background thread of this process (tests, ``durable dev``)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, name="durable-worker", daemon=True)

    def __enter__(self) -> Worker:
        """Start the worker and wait until it is in the registry (before that, the views
        report its queues' runs as having no live worker)."""
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.worker.joined.wait(0.05) and self.thread.is_alive() and time.monotonic() < deadline:
            pass
        return self.worker

    def __exit__(self, *exc: Any) -> None:
        self.worker.stop()
        self.thread.join(timeout=self.worker.grace + 10)
