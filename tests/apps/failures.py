"""Workflows for the failure-model tests."""

from __future__ import annotations

import time
from typing import Any

from durable import (
    Activity,
    ActivityCancelledError,
    ActivityFailed,
    CancelledError,
    ChildWorkflowFailed,
    NonRetryableError,
    RetryPolicy,
    Workflow,
    activity,
    activity_context,
    all,
    await_signal,
    child,
    timer,
)

from .basic import record

FAST = RetryPolicy(initial_interval=0.05, max_attempts=2)


class Sleepy(Activity):
    start_to_close_timeout = 0.3
    retry = FAST

    def handle(self, path: str, seconds: float) -> str:
        record(path, f"sleep attempt {self.context.attempt}")
        time.sleep(seconds)
        record(path, f"woke attempt {self.context.attempt}")
        return "late"


class Resumable(Activity):
    """Heartbeats its progress; a retry resumes from the last heartbeat details."""

    heartbeat_timeout = 0.4
    retry = RetryPolicy(initial_interval=0.05, max_attempts=3)

    def handle(self, path: str) -> dict:
        ctx = self.context
        start = ctx.heartbeat_details or 0
        record(path, f"attempt {ctx.attempt} from {start}")
        for step in range(start, 5):
            ctx.heartbeat(step)
            if ctx.attempt == 1 and step == 2:
                time.sleep(1.0)  # stop heartbeating: the attempt times out
            time.sleep(0.02)
        return {"attempt": ctx.attempt, "resumed_from": start}


class BeatsEveryItem(Activity):
    """Heartbeats every item of a loop (all but the first held back by the throttle: its
    interval is 0.75 s), once more 0.6 s later (held back too), then is quiet for 2.7 s: only
    the deadline that held-back heartbeat pushed (3.6 s) covers that; the written ones reach
    3.0 s. Attempt 1 then fails right after another held-back heartbeat; attempt 2 returns the
    details it resumed from."""

    heartbeat_timeout = 3.0
    retry = RetryPolicy(initial_interval=0.05, max_attempts=2)

    def handle(self, items: int) -> object:
        ctx = self.context
        if ctx.attempt > 1:
            return ctx.heartbeat_details
        for i in range(items):
            ctx.heartbeat(i)
        time.sleep(0.6)
        ctx.heartbeat("held back, then written by the flusher")
        time.sleep(2.7)
        ctx.heartbeat("written at once")
        ctx.heartbeat(items - 1)  # held back: written as the attempt fails
        raise RuntimeError("fails once its loop is done")


class Declines(Activity):
    retry = RetryPolicy(initial_interval=0.05, max_attempts=5, non_retryable_errors=("PermissionError",))

    def handle(self, path: str, kind: str) -> None:
        record(path, f"declines {self.context.attempt}")
        if kind == "listed":
            raise PermissionError("card blocked")
        raise NonRetryableError("insufficient funds")


class DeclinesThePortedWay(Activity):
    """A policy written with Temporal's names, as a ported activity has it."""

    retry = RetryPolicy(
        initial_interval=0.05, maximum_attempts=3, non_retryable_error_types=["PermissionError"]
    )

    def handle(self, path: str, kind: str) -> None:
        record(path, f"declines {self.context.attempt}")
        raise PermissionError("card blocked") if kind == "listed" else ValueError("flaky")


def heartbeat_until_cancelled(path: str) -> str:
    ctx = activity_context()
    record(path, "long started")
    try:
        for _ in range(200):
            ctx.heartbeat()
            time.sleep(0.02)
    except ActivityCancelledError:
        record(path, "long saw cancel")
        raise
    return "finished"


def fail_fast(path: str) -> None:
    time.sleep(0.1)
    raise RuntimeError("branch failed")


class Timeouts(Workflow):
    def handle(self, path: str) -> object:
        try:
            return activity(Sleepy, path, 1.0)
        except ActivityFailed as exc:
            return {
                "cause": type(exc.cause).__name__,
                "kind": getattr(exc.cause, "kind", None),
                "attempts": exc.attempts,
            }


class Heartbeats(Workflow):
    def handle(self, path: str) -> dict:
        return activity(Resumable, path)


class HeartbeatsEveryItem(Workflow):
    def handle(self, items: int) -> object:
        return activity(BeatsEveryItem, items)


class NonRetryable(Workflow):
    def handle(self, path: str, kind: str) -> object:
        try:
            activity(
                DeclinesThePortedWay if kind.startswith("ported") else Declines,
                path,
                kind.removeprefix("ported:"),
            )
        except ActivityFailed as exc:
            return {"cause": type(exc.cause).__name__, "attempts": exc.attempts}
        return None


class FailFast(Workflow):
    def handle(self, path: str) -> str:
        try:
            all(
                [
                    lambda: activity(heartbeat_until_cancelled, path, retry=RetryPolicy(max_attempts=1)),
                    lambda: activity(fail_fast, path, retry=RetryPolicy(max_attempts=1)),
                ]
            )
        except ActivityFailed as exc:
            return f"caught {type(exc.cause).__name__}"
        return "no error"


class ChildFails(Workflow):
    def handle(self) -> None:
        raise ValueError("child broke")


class ChildWaits(Workflow):
    def handle(self) -> str:
        return await_signal("never")


class ParentOfFailing(Workflow):
    def handle(self) -> dict:
        try:
            child(ChildFails)
        except ChildWorkflowFailed as exc:
            return {"status": exc.status, "cause": type(exc.cause).__name__}
        return {}


class ParentOfWaiting(Workflow):
    def handle(self) -> dict:
        try:
            child(ChildWaits, workflow_id=f"{self.__class__.__name__}-kid")
        except ChildWorkflowFailed as exc:
            return {"status": exc.status}
        return {}


class ParentOfTakenId(Workflow):
    def handle(self, kid_id: str) -> str:
        try:
            child(ChildWaits, workflow_id=kid_id)
        except ChildWorkflowFailed as exc:
            return str(exc)
        return "started"


class StubbornKid(Workflow):
    """Carries on after its cancel (a clean-up taking ``seconds``), then closes cancelled."""

    def handle(self, seconds: float) -> str:
        try:
            await_signal("never")
        except CancelledError:
            timer(seconds)
            raise
        return "not cancelled"


class ParentLeavingKid(Workflow):
    """Its child() call raises CancelledError once the child's cancellation completed."""

    def handle(self, kid_id: str, seconds: float = 1.0) -> str:
        try:
            child(StubbornKid, seconds, workflow_id=kid_id)
        except CancelledError:
            return "parent cancelled"
        return "kid done"


VERSION = {"value": 1}


def step_a() -> str:
    return "a"


def step_b() -> str:
    return "b"


class Changing(Workflow):
    """Its code 'changes' between deploys: VERSION picks the activity."""

    def handle(self) -> str:
        first = activity(step_a if VERSION["value"] == 1 else step_b)
        return first + await_signal("go")


class UnreadableError(Exception):
    """An error whose own attributes raise (a tester's): recording it killed an activity thread."""

    def __getattribute__(self, name: str) -> Any:
        if name in ("args", "__dict__", "__traceback__"):
            raise RuntimeError("no " + name)
        return super().__getattribute__(name)


def raise_unreadable(kind: str) -> None:
    if kind == "attributes":
        raise UnreadableError("x")
    if kind == "cycle":
        cyclic: list[Any] = []
        cyclic.append(cyclic)
        raise ValueError(cyclic)
    error: BaseException | None = None
    for i in range(200):  # a cause chain past the nesting limit
        try:
            raise KeyError(i) from error
        except KeyError as caught:
            error = caught
    assert error is not None
    raise error


class RaisesUnreadable(Workflow):
    """Its activity raises an error that cannot be stored as it is (``kind``)."""

    def handle(self, kind: str) -> None:
        activity(raise_unreadable, kind, retry=RetryPolicy(max_attempts=2, initial_interval=0.1))


def breaks_here(n: int) -> None:
    raise ValueError(f"broke at {n}")  # the line a failure's traceback and describe point at


class FailsInItsActivity(Workflow):
    def handle(self) -> None:
        activity(breaks_here, 7, retry=RetryPolicy(max_attempts=1))


class BeatsThroughOutages(Activity):
    """Heartbeats every 1.5 s (its timeout: 2 s) for ``seconds``; writes what its heartbeats
    raised, if anything."""

    heartbeat_timeout = 2
    start_to_close_timeout = 120
    retry = RetryPolicy(max_attempts=1)

    def handle(self, path: str, seconds: float) -> str:
        record(path, f"began attempt {self.context.attempt}")
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            time.sleep(1.5)
            try:
                self.context.heartbeat()
            except ActivityCancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - what the test asserts never happens
                record(path, f"heartbeat raised {type(exc).__name__}: {exc}")
                raise
        return "done"


class HeartbeatsThroughOutages(Workflow):
    def handle(self, path: str, seconds: float) -> str:
        return activity(BeatsThroughOutages, path, seconds)
