"""Activities that end with ``sys.exit()`` (as argparse and click do on bad input)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durable import ActivityFailed, RetryPolicy, Workflow, activity


def exits(log: str, code: int) -> None:
    with Path(log).open("a") as f:
        f.write("ran\n")
    sys.exit(code)


async def exits_async(log: str, code: int) -> None:
    exits(log, code)


def _cause(fn: Callable[..., Any], log: str, code: int) -> dict:
    """The error the activity's last attempt ended with, as the workflow sees it."""
    try:
        activity(fn, log, code, retry=RetryPolicy(initial_interval=0.05, max_attempts=2))
    except ActivityFailed as exc:
        cause = exc.__cause__
        return {"cause": getattr(cause, "type_name", "") or type(cause).__name__, "message": str(cause)}
    return {}


class ExitingActivity(Workflow):
    def handle(self, log: str) -> dict:
        return _cause(exits, log, 3)


class ExitingAsyncActivity(Workflow):
    def handle(self, log: str) -> dict:
        return _cause(exits_async, log, 4)


class ExitUncaught(Workflow):
    """Lets its activity's failure fail the run."""

    def handle(self, log: str) -> None:
        activity(exits, log, 5, retry=RetryPolicy(max_attempts=1))
