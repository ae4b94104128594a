"""The benchmark workflows for Temporal (same shapes as ``bench_apps.py``).

Kept in a module of their own, importing only temporalio and the standard
library, because Temporal's workflow sandbox re-imports the module that defines
a workflow.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow

TIMEOUT = timedelta(seconds=60)


@activity.defn
async def noop(i: int) -> int:
    return i


@workflow.defn
class TenSteps:
    @workflow.run
    async def run(self, n: int) -> int:
        for i in range(n):
            await workflow.execute_activity(noop, i, start_to_close_timeout=TIMEOUT)
        return n


@workflow.defn
class FanOut:
    @workflow.run
    async def run(self, n: int) -> int:
        results = await asyncio.gather(
            *(workflow.execute_activity(noop, i, start_to_close_timeout=TIMEOUT) for i in range(n))
        )
        return len(results)


@workflow.defn
class Sleeper:
    @workflow.run
    async def run(self, seconds: float) -> float:
        await asyncio.sleep(seconds)  # a durable timer in Temporal
        return seconds


@workflow.defn
class WaitSignal:
    def __init__(self) -> None:
        self._value: Any = None
        self._got = False

    @workflow.signal
    def go(self, value: Any) -> None:
        self._value, self._got = value, True

    @workflow.run
    async def run(self) -> Any:
        await workflow.wait_condition(lambda: self._got)
        return self._value
