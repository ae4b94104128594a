"""Workflows the fault-injection suite runs (worker processes import this as ``faults_app``).

Every activity writes two logs under the run's folder:

* ``ran.log``: one line per execution (at-least-once: may repeat after a crash);
* ``applied.log``: one line per idempotency key, written once however often the
  activity runs (the "external effect" that must happen exactly once).

Results are a pure function of the arguments, so the harness knows what each
run must return.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from durable import (
    Activity,
    RetryPolicy,
    Workflow,
    activity,
    activity_context,
    all,
    await_signal,
    child,
    timer,
)


def _append(path: Path, line: str) -> None:
    # One small O_APPEND write: atomic between processes.
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _effect(folder: str, key: str) -> None:
    """Log the execution, then apply the effect once per key (check-and-append under a lock).

    Several activity threads of one worker may be inside this function when a
    fault point SIGKILLs the process: the lock dies with it and the append is a
    single write, so the effect is either fully applied or not at all.
    """
    base = Path(folder)
    base.mkdir(parents=True, exist_ok=True)
    _append(base / "ran.log", key)
    lock = os.open(base / "applied.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        applied = base / "applied.log"
        done = applied.read_text().split() if applied.exists() else []
        if key not in done:
            _append(applied, key)
    finally:
        os.close(lock)


def fx(folder: str, tag: str, value: int) -> dict:
    """An activity with an idempotency-keyed effect; returns a value derived from its args."""
    _effect(folder, activity_context().idempotency_key)
    return {"tag": tag, "value": value * 2}


class FlakyFx(Activity):
    """Fails its first attempt (exercises retry timers), then applies its effect."""

    retry = RetryPolicy(initial_interval=0.1, backoff_coefficient=1, max_attempts=0)

    def handle(self, folder: str, value: int) -> int:
        ctx = self.context
        if ctx.attempt == 1:
            _append(Path(folder) / "flaky.log", f"{ctx.idempotency_key} attempt 1")
            raise RuntimeError("first attempt always fails")
        _effect(folder, ctx.idempotency_key)
        return value + 1000


class ChaosChild(Workflow):
    def handle(self, folder: str, idx: int) -> int:
        got = activity(fx, folder, "child", idx)
        timer(0.1)
        return got["value"] + 1


class Chaos(Workflow):
    """Activities, a retried activity, a timer, ``all()``, a signal and a child."""

    def handle(self, folder: str, idx: int, use_signal: bool = True) -> dict:
        first = activity(fx, folder, "first", idx)
        timer(0.2)
        pair = all(
            [
                lambda: activity(fx, folder, "left", idx + 1)["value"],
                lambda: activity(FlakyFx, folder, idx),
            ]
        )
        signal_value = await_signal("go", timeout=600) if use_signal else idx
        kid = child(ChaosChild, folder, idx)
        return {"idx": idx, "first": first["value"], "pair": pair, "signal": signal_value, "child": kid}


def expected(idx: int) -> dict:
    """What ``Chaos(folder, idx)`` returns (the harness signals ``go`` with ``idx``)."""
    return {
        "idx": idx,
        "first": idx * 2,
        "pair": [(idx + 1) * 2, idx + 1000],
        "signal": idx,
        "child": idx * 2 + 1,
    }


EFFECTS_PER_RUN = 4
"""Idempotency-keyed effects per ``Chaos`` run: first, left, FlakyFx, and the child's fx."""
