"""Workflows that run into the limits of durable.limits (tests/test_limits.py)."""

from __future__ import annotations

from durable import (
    NonRetryableError,
    Workflow,
    activity,
    all,
    await_signal,
    child,
    continue_as_new,
    side_effect,
    update,
)


def limits_echo(value: int) -> int:
    return value


def shout(size: int) -> None:
    raise NonRetryableError("x" * size)


class FanOut(Workflow):
    """``all()`` of ``n`` activities."""

    def handle(self, n: int) -> int:
        return sum(all([lambda i=i: activity(limits_echo, i) for i in range(n)]))


class SideEffectsThenDone(Workflow):
    """``n`` side effects, then returns: one decision, closing the run."""

    def handle(self, n: int) -> int:
        return len(all([lambda i=i: side_effect(lambda: i) for i in range(n)]))


class BigSideEffectsThenDone(Workflow):
    """``n`` side effects of 10 KB each, then returns: one decision, closing the run."""

    def handle(self, n: int) -> int:
        return len(all([lambda i=i: side_effect(lambda: "x" * 10_000) for i in range(n)]))


class Leaf(Workflow):
    def handle(self, value: int) -> int:
        return value


class ChildFanOut(Workflow):
    """``all()`` of ``n`` child workflows."""

    def handle(self, n: int) -> int:
        return sum(all([lambda i=i: child(Leaf, i) for i in range(n)]))


class Grower(Workflow):
    """Appends two events per step, forever (only a limit stops it)."""

    def handle(self) -> None:
        step = 0
        while True:
            step = activity(limits_echo, step + 1)


class Sink(Workflow):
    """Waits for a ``stop`` signal; other signals are buffered."""

    def handle(self) -> str:
        return str(await_signal("stop"))

    @update
    def grow(self, data: str) -> int:
        return len(data)


class Loud(Workflow):
    """Fails with an activity error too large to store whole."""

    def handle(self, size: int) -> None:
        activity(shout, size)


class BigResult(Workflow):
    """Returns a result of ``size`` bytes."""

    def handle(self, size: int) -> str:
        return side_effect(lambda: "r") * size


def limits_blob(size: int) -> str:
    return "x" * size


class BigResults(Workflow):
    """``all()`` of ``n`` activities returning ``size`` characters each."""

    def handle(self, n: int, size: int) -> int:
        return len("".join(all([lambda: activity(limits_blob, size) for _ in range(n)])))


class FillsThenWaits(Workflow):
    """``n`` side effects, then waits for a signal that does not come."""

    def handle(self, n: int) -> None:
        for i in range(n):
            side_effect(lambda i=i: i)
        await_signal("never")


class TwoSignalsThenAgain(Workflow):
    """A big first step, then continues as new after every second signal, carrying them."""

    def handle(self, size: int, seen: list[str]) -> list[str]:
        if size:
            activity(limits_blob, size)
        got = [*seen, await_signal("s"), await_signal("s")]
        if len(got) >= 4:
            return got
        continue_as_new(0, got)
        return got


class LargeArgument(Workflow):
    """One activity called with a large argument."""

    def handle(self, size: int) -> int:
        return len(activity(limits_echo, "x" * size))
