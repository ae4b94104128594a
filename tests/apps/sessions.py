"""Workflows for the worker-session tests."""

from __future__ import annotations

import time

from durable import (
    ActivityFailed,
    SessionLost,
    Workflow,
    activity_context,
    await_signal,
    query,
    worker_session,
)


def nap(seconds: float) -> str:
    time.sleep(seconds)
    return activity_context().worker


class NapsInSession(Workflow):
    def handle(self, seconds: float) -> str:
        with worker_session() as session:
            return session.activity(nap, seconds)


def where() -> str:
    """Which worker ran this attempt."""
    return activity_context().worker


class Pinned(Workflow):
    def __init__(self) -> None:
        self.stage = "start"

    @query
    def progress(self) -> str:
        return self.stage

    def handle(self, steps: int) -> dict:
        ran_on = []
        with worker_session() as session:
            for _ in range(steps):
                ran_on.append(session.activity(where))
            self.stage = "waiting"
            await_signal("continue")
            try:
                ran_on.append(session.activity(where))
            except ActivityFailed as exc:
                return {"ran_on": ran_on, "lost": isinstance(exc.cause, SessionLost), "error": str(exc.cause)}
        return {"ran_on": ran_on, "lost": False}
