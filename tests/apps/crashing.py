"""Activities that kill their worker process (``os._exit``), for the crash-loop tests
(importable by worker processes as ``apps.crashing``).

Each attempt appends a line to a file the test names, so the test sees how often it began.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from durable import Activity, RetryPolicy, Workflow, activity, local_activity


def _note(path: str, line: str) -> None:
    with Path(path).open("a") as f:
        f.write(line + "\n")


class KillsItsWorker(Activity):
    """Ends its worker process on every attempt, as a segfault or the OOM killer would.

    It sleeps a little first, so that the quick activities sharing the worker finish (a worker's
    death takes its other in-flight tasks with it, and they are not what the tests are about).
    """

    retry = RetryPolicy(max_attempts=1)

    def handle(self, log: str) -> str:
        _note(log, f"attempt {self.context.attempt}")
        time.sleep(0.3)
        os._exit(9)


class KillsItsWorkerOnce(Activity):
    """Ends its worker on attempt 1, each time it runs; attempt 2 (a new task) returns."""

    retry = RetryPolicy(max_attempts=2, initial_interval=0.1)

    def handle(self, log: str) -> str:
        attempt = self.context.attempt
        _note(log, f"attempt {attempt}")
        if attempt == 1:
            time.sleep(0.3)
            os._exit(9)
        return f"attempt {attempt} ran"


class Quick(Activity):
    """Returns at once."""

    def handle(self, value: int) -> int:
        return value + 1


class CrashingRun(Workflow):
    """Runs one activity that kills its worker (``once``: only on its first attempt)."""

    def handle(self, log: str, once: bool = False) -> str:
        return activity(KillsItsWorkerOnce if once else KillsItsWorker, log)


class LeasedCrashingRun(Workflow):
    """Runs ``KillsItsWorker`` as a local activity (``local``), or as an activity that an ``--eager``
    worker leases: either way its attempt runs first under its deciding worker's lease."""

    def handle(self, log: str, local: bool = False) -> str:
        return (local_activity if local else activity)(KillsItsWorker, log)


class QuickRun(Workflow):
    """Two quick activities in a row."""

    def handle(self, value: int) -> int:
        return activity(Quick, activity(Quick, value))
