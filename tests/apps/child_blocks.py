"""Parents waiting on children that cannot move (tests/test_child_blocked.py)."""

from __future__ import annotations

from typing import Any

from durable import Workflow, await_signal, child, signal


class KidQ(Workflow):
    """A child that returns its argument (where a worker serves its queue)."""

    def handle(self, n: int) -> int:
        return n


class ParentQ(Workflow):
    """Waits on a child on a queue no worker serves."""

    def handle(self) -> Any:
        return child(KidQ, 1, queue="nowhere2")


class GrandQ(Workflow):
    """Waits on a :class:`ParentQ`: blocked two levels down."""

    def handle(self) -> Any:
        return child(ParentQ)


class ParentOfGhost(Workflow):
    """Waits on a child of a type no worker defines."""

    def handle(self) -> Any:
        return child("Chld", 1)


class GoThenClose(Workflow):
    """Closes on the signal ``go``."""

    def handle(self) -> Any:
        return await_signal("go")


class FailsOnBad(Workflow):
    """Fails in its ``bad`` signal's handler: a signal behind it in the same decision is dropped."""

    @signal
    def bad(self) -> None:
        raise ValueError("bad signal")

    def handle(self) -> Any:
        return await_signal("never")


class ParentOfNamed(Workflow):
    """Waits on a :class:`GoThenClose` child with the id it is given."""

    def handle(self, child_id: str) -> Any:
        return child(GoThenClose, workflow_id=child_id)
