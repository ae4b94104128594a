"""An activity type that takes microseconds until a file exists, then 1.5 s: worker processes
import this module as ``apps.turns_slow``. While ``step`` is fast a worker takes its tasks beyond
its free threads (the prefetch of ``workers/pace.py``); once it is slow, those wait behind it.
The file's path is ``$DURABLE_TEST_SLOW_FILE``."""

from __future__ import annotations

import os
import time

from durable import RetryPolicy, Workflow, activity

SLOW_S = 1.5


def slow_step(i: int) -> int:
    """The pid of the worker that ran it; 1.5 s once the file exists."""
    if os.path.exists(os.environ["DURABLE_TEST_SLOW_FILE"]):
        time.sleep(SLOW_S)
    return os.getpid()


class TurnsSlowSteps(Workflow):
    """``step`` after ``step``, each with a 4 s start-to-close timeout and one attempt: a task that
    waited out its timeout behind a slow thread fails the run."""

    def handle(self, n: int) -> int:
        for i in range(n):
            activity(slow_step, i, start_to_close_timeout=4, retry=RetryPolicy(max_attempts=1))
        return n
