"""Activities that end with ``sys.exit()`` (as argparse and click do on bad input)."""

from __future__ import annotations

import sys
from pathlib import Path

from durable import ActivityFailed, RetryPolicy, Workflow, activity


def exits(log: str, code: int) -> None:
    with Path(log).open("a") as f:
        f.write("ran\n")
    sys.exit(code)


class ExitingActivity(Workflow):
    def handle(self, log: str) -> dict:
        try:
            activity(exits, log, 3, retry=RetryPolicy(initial_interval=0.05, max_attempts=2))
        except ActivityFailed as exc:
            cause = exc.__cause__
            return {"cause": getattr(cause, "type_name", "") or type(cause).__name__, "message": str(cause)}
        return {}


async def exits_async(log: str, code: int) -> None:
    exits(log, code)


class ExitingAsyncActivity(Workflow):
    def handle(self, log: str) -> dict:
        try:
            activity(exits_async, log, 4, retry=RetryPolicy(initial_interval=0.05, max_attempts=2))
        except ActivityFailed as exc:
            cause = exc.__cause__
            return {"cause": getattr(cause, "type_name", "") or type(cause).__name__, "message": str(cause)}
        return {}
