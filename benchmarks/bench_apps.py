"""Workflows the benchmarks run: activities are no-ops returning a small value."""

from __future__ import annotations

from durable import Workflow, activity


def noop(i: int) -> int:
    return i


class TenSteps(Workflow):
    """N sequential no-op activities (W1/W2)."""

    def handle(self, n: int = 10) -> int:
        for i in range(n):
            activity(noop, i)
        return n
