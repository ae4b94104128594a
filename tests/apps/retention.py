"""Workflows for ``tests/test_retention.py`` and ``benchmarks/retention_soak.py``: runs that
close (with activities, a never-resumed hook), one that stays open, per-type retention."""

from __future__ import annotations

from datetime import timedelta

from durable import Workflow, activity, await_signal, continue_as_new, create_hook


def double(x: int) -> int:
    return 2 * x


class Steps(Workflow):
    """``n`` activities in a row, a hook nobody resumes, then done (namespace retention)."""

    def handle(self, n: int) -> int:
        create_hook("never-resumed")
        total = 0
        for i in range(n):
            total += activity(double, i)
        return total


class KeptLong(Workflow):
    """Closes at once but keeps an hour of retention of its own."""

    retention = timedelta(hours=1)

    def handle(self) -> str:
        return "kept"


class Chain(Workflow):
    """Continues as new ``n`` times (each run closed as `continued` except the last)."""

    retention = "2s"

    def handle(self, n: int) -> int:
        if n > 0:
            continue_as_new(n - 1)
        return n


class Open(Workflow):
    """Stays open until signalled."""

    def handle(self) -> str:
        return str(await_signal("go"))
