"""Workflows for the start policy, signal-with-start, workflow timeout and all_settled tests
(tests/test_start_policies.py; importable by worker processes as ``apps.starts``)."""

from __future__ import annotations

from durable import (
    NonRetryableError,
    RetryPolicy,
    Workflow,
    activity,
    all_settled,
    child,
    continue_as_new,
    query,
    signal,
    timer,
    wait_until,
)


class Collect(Workflow):
    """Collects ``add`` signals until it has ``expect`` of them; returns them in order."""

    def __init__(self) -> None:
        self.items: list = []

    @signal
    def add(self, item: object) -> None:
        self.items.append(item)

    @query
    def seen(self) -> list:
        return list(self.items)

    def handle(self, expect: int = 1) -> list:
        wait_until(lambda: len(self.items) >= expect)
        return self.items


class Quick(Workflow):
    """Completes at once."""

    def handle(self, value: object = "done") -> object:
        return value


class Broken(Workflow):
    """Fails at once."""

    def handle(self) -> None:
        raise ValueError("broken on purpose")


class Nap(Workflow):
    """Sleeps ``seconds`` (a durable timer), then completes."""

    def handle(self, seconds: float = 30.0) -> str:
        timer(seconds)
        return "rested"


class Relay(Workflow):
    """Sleeps ``step`` seconds per run and continues as new, forever (``n`` counts runs)."""

    def handle(self, n: int = 1, step: float = 0.3) -> None:
        timer(step)
        continue_as_new(n + 1, step)


class Guardian(Workflow):
    """Waits on a long child under ``policy`` (the parent close policy)."""

    def handle(self, policy: str, child_id: str) -> str:
        return child(Nap, 60, workflow_id=child_id, parent_close_policy=policy)


class Elder(Workflow):
    """Waits on a :class:`Guardian` child ``child_id`` (policy ``terminate``), which waits on
    its own child ``grandchild_id``: three generations."""

    def handle(self, child_id: str, grandchild_id: str) -> str:
        return child(Guardian, "terminate", grandchild_id, workflow_id=child_id)


def square(n: int) -> int:
    return n * n


def refuse(n: int) -> int:
    raise NonRetryableError(f"item {n} refused")


class Fanout(Workflow):
    """One failing branch among slower succeeding ones: all_settled collects every outcome."""

    def handle(self) -> list:
        def slow(n: int) -> int:
            timer(0.2)  # still running when the failing branch has failed
            return activity(square, n)

        outcomes = all_settled(
            [
                lambda: slow(2),
                lambda: activity(refuse, 3, retry=RetryPolicy(max_attempts=1)),
                lambda: slow(4),
            ]
        )
        return [[o.ok, o.value, type(o.error).__name__ if o.error else None] for o in outcomes]
