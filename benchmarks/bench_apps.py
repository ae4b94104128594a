"""Workflows the benchmarks run: activities are no-ops returning a small value."""

from __future__ import annotations

from durable import Workflow, activity, all, await_signal, timer


def noop(i: int) -> int:
    return i


class TenSteps(Workflow):
    """N sequential no-op activities (W1/W2)."""

    def handle(self, n: int = 10) -> int:
        for i in range(n):
            activity(noop, i)
        return n


class FanOut(Workflow):
    """N no-op activities at once in one ``all()`` (W3)."""

    def handle(self, n: int = 100) -> int:
        results = all([lambda i=i: activity(noop, i) for i in range(n)])
        return len(results)


class Sleeper(Workflow):
    """One durable timer (W4)."""

    def handle(self, seconds: float = 1.0) -> float:
        timer(seconds)
        return seconds


class WaitSignal(Workflow):
    """Waits for the signal ``go`` and returns its payload (W5, W7)."""

    def handle(self) -> object:
        return await_signal("go")


if __import__("os").environ.get("DURABLE_BENCH_TRACING"):  # harness.py --tracing: worker processes
    __import__("bench_tracing").enable()
