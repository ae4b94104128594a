"""Workflows started by schedules in the process tests (tests/test_schedules_cli.py)."""

from __future__ import annotations

from durable import Workflow


class SchedEcho(Workflow):
    """Finishes at once with its argument."""

    def handle(self, tag: str = "") -> str:
        return tag
