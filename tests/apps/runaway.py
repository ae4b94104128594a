"""Workflows whose code never hands control back to durable (issue 13 item 9), and a normal
saga to run beside them. Worker processes import this module as ``apps.runaway``."""

from __future__ import annotations

import os
import time

from durable import Workflow, activity, query, signal, wait_until

SPINNING = {"on": True}
"""While true, :class:`Spin` busy-loops (an in-process test turns it off to free its thread)."""


def step(name: str) -> str:
    return name


class Spin(Workflow):
    """A busy loop in workflow code: the decision never returns."""

    def handle(self) -> str:
        while SPINNING["on"]:  # the runaway line
            pass
        return "released"

    @query
    def where(self) -> str:
        return "past the loop"


class LoopingQuery(Workflow):
    """A ``@query`` method that busy-loops (its run is fine)."""

    def handle(self) -> str:
        return activity(step, "only")

    @query
    def stuck(self) -> str:
        while SPINNING["on"]:  # the looping query line
            pass
        return "released"


class StepThenSpin(Workflow):
    """Busy-loops after its first activity (in eager mode, in the decision applying its result)."""

    def handle(self) -> str:
        activity(step, "first")
        while SPINNING["on"]:  # the runaway line after a step
            pass
        return "released"


class Sleepy(Workflow):
    """``time.sleep`` in workflow code (it should be a ``timer()``)."""

    def handle(self, seconds: float) -> str:
        time.sleep(seconds)  # the sleeping line
        return "woke"


class ThreeSteps(Workflow):
    """An ordinary saga of three activities."""

    def handle(self) -> list[str]:
        return [activity(step, name) for name in ("reserve", "charge", "ship")]


QUERY_SLEEP_S = {"s": float(os.environ.get("QUERY_SLEEP_S", "0"))}
"""How long :class:`SleepyQuery`'s query sleeps (a call that does not return for a while)."""


class SleepyQuery(Workflow):
    """A ``@query`` method blocked in a call (``time.sleep``): no bytecode runs meanwhile."""

    def handle(self) -> str:
        return activity(step, "only")

    @query
    def slow(self) -> str:
        time.sleep(QUERY_SLEEP_S["s"])  # the blocked query line
        return "woke"


POLLING = {"on": True}
"""While true, :class:`PollingQuery`'s query polls (a test turns it off to free its thread)."""


class PollingQuery(Workflow):
    """A ``@query`` method that polls for ever, sleeping: a loop that uses next to no CPU."""

    def handle(self) -> str:
        return activity(step, "only")

    @query
    def poll(self) -> str:
        while POLLING["on"]:
            time.sleep(0.05)  # the polling query line
        return "stopped"

    @query
    def ping(self) -> str:
        return "pong"


class Crunch(Workflow):
    """A healthy ``@query`` that needs ``cpu_s`` seconds of its thread's CPU, without a switch."""

    def handle(self) -> str:
        return activity(step, "only")

    @query
    def work(self, cpu_s: float) -> int:
        began, n = time.thread_time(), 0
        while time.thread_time() - began < cpu_s:
            n += 1
        return 1


def slow_step(seconds: float) -> str:
    time.sleep(seconds)
    return "slow"


class LongActivityStep(Workflow):
    """One activity of ``seconds``: a worker finishes it before it stops or restarts."""

    def handle(self, seconds: float) -> str:
        return activity(slow_step, seconds)


class Tally(Workflow):
    """Sums ``add`` signals until ``stop``: a long history that replays handler after handler
    without a greenlet switch (healthy code a query takes a while to replay)."""

    def __init__(self) -> None:
        self.n = 0
        self.done = False

    @signal
    def add(self, k: int) -> None:
        self.n += k

    @signal
    def stop(self) -> None:
        self.done = True

    def handle(self) -> int:
        wait_until(lambda: self.done)
        return self.n

    @query
    def count(self) -> int:
        return self.n
