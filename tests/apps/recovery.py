"""Workflows the recovery tests run (importable by worker processes as ``apps.recovery``).

Activities note what they do in the Redis the worker serves (``DURABLE_REDIS_URL``), under
keys of their own, so a test can see which attempts started, and when.
"""

from __future__ import annotations

import os
import time

import redis

from durable import Activity, CancelledError, RetryPolicy, Workflow, activity, all

NOTES = "test:recovery:"
"""Prefix of the keys these activities write."""


def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ["DURABLE_REDIS_URL"])


def note(key: str, value: object) -> None:
    """Append ``value`` to the list ``NOTES + key``."""
    _redis().rpush(NOTES + key, str(value))


class BeatingUntilKilled(Activity):
    """Heartbeats every 0.2 s (timeout 2 s). The first attempt runs until its worker is killed;
    a later one returns at once with the attempt number."""

    heartbeat_timeout = 2
    retry = RetryPolicy(initial_interval=0.1, backoff_coefficient=1)

    def handle(self, key: str) -> int:
        ctx = self.context
        note(key, f"attempt {ctx.attempt}")
        if ctx.attempt == 1:
            for _ in range(600):
                ctx.heartbeat()
                time.sleep(0.2)
        return ctx.attempt


class ResumesFromDetails(Activity):
    """No heartbeat timeout: when its worker dies the task is reclaimed after ``--claim-idle``
    (attempt 1 again). It records progress in its heartbeat details, then hangs; an execution
    that finds details returns them with its attempt number."""

    def handle(self, key: str) -> list:
        ctx = self.context
        if ctx.heartbeat_details is not None:
            return [ctx.heartbeat_details, ctx.attempt]
        ctx.heartbeat({"step": 3})
        note(key, "beat")
        time.sleep(120)
        return [None, ctx.attempt]


def send_mail(key: str, n: int) -> int:
    """An e-mail going out: notes when it started (wall clock), takes 0.1 s."""
    note(key, time.time())
    time.sleep(0.1)
    return n


class OneRecoveringActivity(Workflow):
    def handle(self, kind: str, key: str) -> object:
        return activity(BeatingUntilKilled if kind == "beating" else ResumesFromDetails, key)


class MailingToStop(Workflow):
    """Sends ``n`` e-mails at once."""

    def handle(self, key: str, n: int) -> list:
        return all([lambda i=i: activity(send_mail, key, i) for i in range(n)])


class MailingWithCleanup(Workflow):
    """Sends ``n`` e-mails; cancelled, it stays open and sends one apology instead."""

    def handle(self, key: str, n: int) -> str:
        try:
            all([lambda i=i: activity(send_mail, key, i) for i in range(n)])
            return "sent"
        except CancelledError:
            activity(send_mail, key + ":cleanup", -1)
            return "cleaned up"


class UnprintableError(Exception):
    """An exception whose ``__str__`` and ``__repr__`` raise (a user's broken error class)."""

    def __str__(self) -> str:
        raise RuntimeError("str exploded")

    def __repr__(self) -> str:
        raise RuntimeError("repr exploded")


def raises_unprintable(key: str) -> None:
    note(key, "ran")
    raise UnprintableError("boom")


class FailsUnprintably(Workflow):
    """One attempt of an activity that raises an exception nothing can print."""

    def handle(self, key: str) -> str:
        try:
            activity(raises_unprintable, key, retry=RetryPolicy(max_attempts=1))
        except Exception as exc:  # noqa: BLE001 - the test reads what reached workflow code
            return f"caught {type(exc).__name__}"
        return "no error"
