"""Activities that never return (a thread Python cannot stop): worker processes import this
module as ``apps.hangs``. ``Hang`` runs on queue ``starve`` with a 1 s start-to-close timeout
and a single attempt, so its run fails while the activity keeps its worker's thread;
``QuietHang`` on queue ``quiet`` has only a 1 s heartbeat timeout, and its run stays open."""

from __future__ import annotations

import time

from durable import ActivityFailed, RetryPolicy, Workflow, activity


def hang(tag: str) -> str:
    """Sleeps for ever, in a loop that checks nothing: its thread is held until the process ends."""
    while True:
        time.sleep(0.2)
    return tag  # never reached


def quick(tag: str) -> str:
    return tag


class Hang(Workflow):
    """Runs ``hang`` once with a short timeout: fails after about 1 s, its thread stays held."""

    def handle(self, tag: str) -> str:
        try:
            return activity(
                hang, tag, queue="starve", start_to_close_timeout=1, retry=RetryPolicy(max_attempts=1)
            )
        except ActivityFailed as exc:
            raise RuntimeError(f"hang {tag} timed out") from exc


class AfterHang(Workflow):
    """One quick activity on queue ``starve`` (it waits there while every thread is held)."""

    def handle(self, tag: str) -> str:
        return activity(quick, tag, queue="starve")


class QuietHang(Workflow):
    """Runs ``hang`` with only a heartbeat timeout (no hard deadline) and 2 attempts: the scheduler
    ends attempt 1 after about 1 s without a heartbeat and queues attempt 2; the run stays open,
    and attempt 1 keeps its thread."""

    def handle(self, tag: str) -> str:
        return activity(hang, tag, queue="quiet", heartbeat_timeout=1, retry=RetryPolicy(max_attempts=2))
