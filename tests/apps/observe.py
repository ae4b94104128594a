"""Workflows and activities of the observability tests (metrics, run ids in logs, the
workflow logger), importable by worker processes as ``apps.observe``."""

from __future__ import annotations

import logging
import time

from durable import Activity, RetryPolicy, Workflow, activity, await_signal, workflow_logger

log = workflow_logger()
activity_log = logging.getLogger("apps.observe")


class ObservedEcho(Activity):
    def handle(self, value: str) -> str:
        activity_log.info("echo %s", value)
        return value


class ObservedBroken(Activity):
    retry = RetryPolicy(max_attempts=1)

    def handle(self) -> None:
        raise ValueError("broken for good")


class ObservedFailsOnce(Activity):
    retry = RetryPolicy(initial_interval=0.05, max_attempts=3)

    def handle(self) -> int:
        if self.context.attempt == 1:
            raise ValueError("first attempt fails")
        return self.context.attempt


class ObservedLate(Activity):
    """Returns after its start-to-close timeout: the scheduler times it out first."""

    retry = RetryPolicy(max_attempts=1)
    start_to_close_timeout = 1

    def handle(self) -> str:
        time.sleep(2.5)
        return "too late"


class ObservedTimesOut(Workflow):
    def handle(self) -> str:
        return activity(ObservedLate)


class ObservedSteps(Workflow):
    """Two activities; ``fail``: the second one fails for good; ``retry``: it is retried once."""

    def handle(self, mode: str = "ok") -> str:
        activity(ObservedEcho, "one")
        if mode == "fail":
            activity(ObservedBroken)
        elif mode == "retry":
            activity(ObservedFailsOnce)
        return activity(ObservedEcho, "two")


class ObservedChatty(Workflow):
    """Logs with the workflow logger around each step: every line once per run."""

    def handle(self) -> str:
        log.info("chatty begins")
        activity(ObservedEcho, "a")
        log.info("chatty after activity")
        value = await_signal("go")
        log.info("chatty got %s", value)
        activity(ObservedEcho, "b")
        log.info("chatty ends")
        return value
