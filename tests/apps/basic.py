"""Workflows and activities the end-to-end tests run (importable by worker processes as
``apps.basic`` with ``tests/`` on the path)."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

from durable import (
    Activity,
    ActivityFailed,
    CancelledError,
    RetryPolicy,
    Workflow,
    activity,
    activity_context,
    all,
    await_hook,
    await_signal,
    child,
    continue_as_new,
    create_hook,
    get_version,
    now,
    query,
    side_effect,
    signal,
    timer,
    update,
    uuid4,
    wait_until,
)


def add(a: int, b: int) -> int:
    return a + b


def record(path: str, line: str) -> str:
    """Append a line to a file: a visible, countable side effect."""
    with open(path, "a") as fh:
        fh.write(line + "\n")
    return line


def apply_once(path: str, key: str) -> str:
    """An idempotent effect: applied once per idempotency key, however often it runs."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / key.replace("/", "_").replace(":", "_")
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.close(fd)
        with open(folder / "applied.log", "a") as fh:
            fh.write(key + "\n")
    except FileExistsError:
        pass
    return key


class Slow(Activity):
    """Sleeps, then writes a line; used to kill workers mid-activity."""

    def handle(self, path: str, seconds: float, tag: str) -> str:
        record(path, f"start {tag} {self.context.attempt}")
        time.sleep(seconds)
        apply_once(path + ".effects", self.context.idempotency_key)
        return tag


class Flaky(Activity):
    retry = RetryPolicy(initial_interval=0.05, backoff_coefficient=2, max_attempts=3)

    def handle(self, path: str, fail_times: int) -> int:
        attempt = self.context.attempt
        record(path, f"attempt {attempt}")
        if attempt <= fail_times:
            raise ValueError(f"flaky failure {attempt}")
        return attempt


class Sequence(Workflow):
    def handle(self, n: int) -> int:
        total = 0
        for i in range(n):
            total = activity(add, total, i)
        return total


class AddsAtOnce(Workflow):
    """``n`` activities at once: ``[0, 2, 4, ...]``."""

    def handle(self, n: int) -> list[int]:
        return all([lambda i=i: activity(add, i, i) for i in range(n)])


EVERYTHING_RESULT = {
    "a": 11,
    "pair": [3, 7],
    "approval": "alice",
    "bumps": 2,
    "token": "effect",
    "uuid_len": 36,
    "version": 2,
    "child": 6,
    "later": True,
}
"""What ``Everything(10)`` returns, signalled ``approve("alice")`` and ``bump(1)`` twice."""


class Everything(Workflow):
    """Touches every workflow call of the public surface."""

    def __init__(self) -> None:
        self.bumps = 0
        self.stage = "start"

    @signal
    def bump(self, by: int = 1) -> None:
        self.bumps += by

    @query
    def progress(self) -> dict:
        return {"stage": self.stage, "bumps": self.bumps}

    @query
    def field(self, name: str) -> object:
        """One field of :meth:`progress`; a name it lacks raises KeyError (a query's own bug)."""
        return self.progress()[name]

    def handle(self, x: int) -> dict:
        started = now()
        a = activity(add, x, 1)
        self.stage = "timer"
        timer(timedelta(milliseconds=100))
        pair = all([lambda: activity(add, 1, 2), lambda: activity(add, 3, 4)])
        self.stage = "signal"
        approval = await_signal("approve", timeout=30)
        self.stage = "bumps"
        wait_until(lambda: self.bumps >= 2, timeout=30)
        token = side_effect(lambda: "effect")
        ident = uuid4()
        version = get_version("new-step", -1, 2)
        c = child(Sequence, 4)
        self.stage = "done"
        return {
            "a": a,
            "pair": pair,
            "approval": approval,
            "bumps": self.bumps,
            "token": token,
            "uuid_len": len(str(ident)),
            "version": version,
            "child": c,
            "later": now() >= started,
        }


class Failing(Workflow):
    def handle(self, path: str, fail_times: int) -> object:
        try:
            return activity(Flaky, path, fail_times)
        except ActivityFailed as exc:
            return {"failed": type(exc.cause).__name__, "attempts": exc.attempts, "message": str(exc.cause)}


class Boom(Workflow):
    def handle(self) -> None:
        raise KeyError("boom")


class Saga(Workflow):
    """Cancellable: compensates what it did, in reverse order, when cancelled."""

    def handle(self, path: str) -> str:
        done = []
        try:
            done.append(activity(record, path, "reserve"))
            done.append(activity(record, path, "charge"))
            await_signal("ship")
            return "shipped"
        except CancelledError:
            for step in reversed(done):
                activity(record, path, f"undo {step}")
            raise


class Waiter(Workflow):
    def handle(self, seconds: float) -> str:
        timer(seconds)
        return await_signal("go")


class Counter(Workflow):
    """Counts by updates until signal ``stop``; a negative step raises in the handler."""

    def __init__(self) -> None:
        self.n = 0

    def handle(self) -> int:
        await_signal("stop")
        return self.n

    @update
    def add(self, step: int) -> int:
        if step < 0:
            raise ValueError(f"a negative step ({step})")
        self.n += step
        return self.n


class Looper(Workflow):
    def handle(self, n: int, total: int) -> int:
        total += activity(add, n, 0)
        if n > 0:
            continue_as_new(n - 1, total)
        return total


class Hooked(Workflow):
    def __init__(self) -> None:
        self.token = ""

    @query
    def hook_token(self) -> str:
        return self.token

    def handle(self) -> object:
        hook = create_hook("callback", {"purpose": "test"})
        self.token = hook.token
        return await_hook(hook, timeout=30)


class SlowSteps(Workflow):
    """Several slow activities with idempotent effects; used by crash tests."""

    def handle(self, path: str, steps: int, seconds: float) -> list:
        out = []
        for i in range(steps):
            out.append(activity(Slow, path, seconds, f"s{i}"))
        out.append(await_signal("finish", timeout=120) if steps < 0 else "end")
        return out


class Parent(Workflow):
    def handle(self, n: int) -> list:
        return all([lambda i=i: child(Sequence, i + 2) for i in range(n)])


def slow_context_probe() -> dict:
    ctx = activity_context()
    return {"attempt": ctx.attempt, "key": ctx.idempotency_key}


class SlowOnBilling(Workflow):
    """A slow activity on the queue ``billing`` (the run itself is on ``default``)."""

    def handle(self, path: str, seconds: float) -> str:
        return activity(Slow, path, seconds, "billed", queue="billing")


class PaysOnBilling(Workflow):
    """Runs its activity on the queue ``billing`` (the run itself is on ``default``)."""

    def handle(self, n: int) -> int:
        return activity(add, n, 1, queue="billing")
