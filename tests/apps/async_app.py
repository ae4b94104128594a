"""Workflows over ``async def`` activities (tests/test_aio.py), run by real worker processes."""

from __future__ import annotations

import asyncio
import time

from durable import (
    Activity,
    ActivityFailed,
    CancelledError,
    RetryPolicy,
    Workflow,
    activity,
    activity_context,
    all,
    await_signal,
    query,
    update,
)


def record(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


async def double(x: int) -> int:
    await asyncio.sleep(0.01)
    return 2 * x


class Beating(Activity):
    """Heartbeats until the workflow cancels it; resumes from the last details on a retry."""

    heartbeat_timeout = 0.5  # the attempt outlives it only if its heartbeats reach Redis

    async def handle(self, path: str) -> str:
        ctx = self.context
        record(path, f"started {ctx.attempt}")
        beats = 0
        try:
            for beats in range(1, 400):
                activity_context().heartbeat(beats)
                await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            record(path, f"saw cancel after {beats}")
            raise
        return "finished"


class SlowAsync(Activity):
    start_to_close_timeout = 0.5
    retry = RetryPolicy(max_attempts=2, initial_interval=0.1)

    async def handle(self, path: str) -> str:
        record(path, f"slow {self.context.attempt}")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            record(path, "slow cancelled")
            raise
        return "late"


class SwallowsCancel(Activity):
    """Catches the cancel its timeout sends and returns a value anyway: too late to count."""

    start_to_close_timeout = 0.5
    retry = RetryPolicy(max_attempts=1)

    async def handle(self) -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "late"
        return "never"


class SpinsPastDeadline(Activity):
    """Never awaits, so the loop never runs its timeout's timer: it returns past the deadline."""

    start_to_close_timeout = 0.5
    retry = RetryPolicy(max_attempts=1)

    async def handle(self) -> str:
        began = time.monotonic()
        while time.monotonic() - began < 1.5:
            pass
        return "late"


class SpunPastDeadline(Workflow):
    def handle(self) -> object:
        try:
            return activity(SpinsPastDeadline)
        except ActivityFailed as exc:
            return {"cause": type(exc.cause).__name__, "kind": getattr(exc.cause, "kind", None)}


class SwallowedTimeout(Workflow):
    def handle(self) -> object:
        try:
            return activity(SwallowsCancel)
        except ActivityFailed as exc:
            return {"cause": type(exc.cause).__name__, "kind": getattr(exc.cause, "kind", None)}


async def fail_soon() -> None:
    await asyncio.sleep(1.5)
    raise RuntimeError("branch failed")


async def spin(seconds: float) -> str:
    """Holds the loop of async activities (never awaits) for ``seconds``."""
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        pass
    return "spun"


class Spins(Workflow):
    def handle(self, seconds: float) -> str:
        return activity(spin, seconds, start_to_close_timeout=120)


class Doubles(Workflow):
    def handle(self, n: int) -> list:
        return all([lambda i=i: activity(double, i) for i in range(n)])


async def quiet(path: str, seconds: float) -> str:
    """Sleeps without a heartbeat: no heartbeat reply can tell it its run closed."""
    record(path, "started")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        record(path, "cancelled")
        raise
    record(path, "finished")
    return "finished"


class LeavesQuiet(Workflow):
    """Completes while its quiet activity still runs (it stops waiting for it on a cancel)."""

    def handle(self, path: str) -> str:
        try:
            return activity(quiet, path, 60.0)
        except CancelledError:
            return "saw cancel"


class CancelsBeating(Workflow):
    def handle(self, path: str) -> str:
        try:
            all(
                [
                    lambda: activity(Beating, path, retry=RetryPolicy(max_attempts=1)),
                    lambda: activity(fail_soon, retry=RetryPolicy(max_attempts=1)),
                ]
            )
        except ActivityFailed as exc:
            return f"caught {type(exc.cause).__name__}"
        return "no error"


class TimesOut(Workflow):
    def handle(self, path: str) -> object:
        try:
            return activity(SlowAsync, path)
        except ActivityFailed as exc:
            return {
                "cause": type(exc.cause).__name__,
                "kind": getattr(exc.cause, "kind", None),
                "attempts": exc.attempts,
            }


class Gate(Workflow):
    """Waits for one signal: what 500 coroutines await at once."""

    def __init__(self) -> None:
        self.bumps = 0

    def handle(self, i: int) -> int:
        return i + await_signal("go") + self.bumps

    @update
    def bump(self, n: int) -> int:
        self.bumps += activity(double, n)
        return self.bumps

    @query
    def seen(self) -> int:
        return self.bumps


async def blocks_the_loop(seconds: float) -> str:
    time.sleep(seconds)  # the mistake: a synchronous sleep in an async def activity
    return "done"


class BlocksTheLoop(Workflow):
    def handle(self, seconds: float) -> str:
        return activity(blocks_the_loop, seconds)
