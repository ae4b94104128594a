"""How many activity tasks a worker may hold beyond its free threads: a small, bounded prefetch.

A worker holds an activity task from the moment it takes it (a read, or its own commit's claim
or lease) until a thread runs it. While it holds a task no other worker can take it, and it is
gone from the queue's backlog (``durable workers``, ``durable_task_queue_backlog``), so a task
held behind busy threads is a run that neither moves nor says why. Temporal's workers poll only
for free slots; dramatiq and Celery prefetch a few messages, and a long task in front of the
prefetched ones is their best-known pitfall. So a worker takes a task for a free thread, and
beyond that only:

* an activity type known (by its recent run times here) to take microseconds: up to
  :data:`BACKLOG_MS` of its work per thread, at most :data:`MOST_PER_THREAD` tasks per thread
  (W2 needs them: without them its commits leave most tasks to a read round trip);
* on threads that are turning over: a thread running the same attempt for longer than
  :data:`STALLED_S` does not count (the tasks behind it would wait for it).

An unknown type gets no prefetch: the first tasks of a 30 s activity must not queue up behind
each other in one worker while others idle.
"""

from __future__ import annotations

import threading

from durable import codec

BACKLOG_MS = 5.0
"""How much activity work (by its type's recent run times) a worker holds per thread beyond the
task running on it: tasks read, claimed or leased beyond that stay in their stream for any
worker."""

MOST_PER_THREAD = 32
"""The most activities a worker holds per thread, however fast they ran lately: a bound on what an
activity that turns slow after a run of fast ones can keep waiting here (the recent run time
follows within a few runs). Eight per thread was too few for 200 concurrent workflows of
microsecond activities on 2 workers: commits left most of their tasks to a read and a begin round
trip on any worker, so the runs lost their sticky worker and were loaded again (W2, 12 turns:
x1.21 steps/s, worker CPU per step x0.80 with 32)."""

STALLED_S = 0.1
"""A thread running one attempt longer than this gets no tasks queued behind it (20 times
:data:`BACKLOG_MS`: far above a microsecond activity's attempt with its round trips and GIL
waits, far below the seconds a slow activity takes)."""


class Pace:
    """Recent run times per activity type, and the bound they put on the tasks a worker holds.

    Args:
        concurrency: The worker's activity threads.
    """

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self._ms: dict[str, float] = {}  # moving average of a type's own code, ms
        self._lock = threading.Lock()

    def ran(self, name: str, seconds: float) -> None:
        """An activity of type ``name`` ran its own code for ``seconds`` (an activity thread)."""
        ms = seconds * 1000
        with self._lock:
            # The attempt's own code, not its round trips: with the main thread deciding, a thread
            # waits up to the GIL's switch interval (5 ms) to go on, so microsecond activities
            # measured as whole attempts read as milliseconds and the prefetch fell to nothing.
            last = self._ms.get(name)
            # A slower run moves it halfway at once: a type that turned slow (30 s after a run of
            # microseconds) must stop being prefetched now, not after dozens of runs; one slowed by
            # a GIL switch halves its prefetch only, and faster runs bring it back gradually.
            if last is None:
                self._ms[name] = ms
            else:
                self._ms[name] = last + (0.5 if ms > last else 0.1) * (ms - last)

    def per_thread(self, name: str) -> float:
        """How many tasks of type ``name`` a turning thread may have, running or waiting (1: no
        prefetch; so for an unknown type)."""
        ms = self._ms.get(name)
        if ms is None:
            return 1.0
        return min(float(MOST_PER_THREAD), max(1.0, BACKLOG_MS / max(ms, 0.001)))

    def limit(self, name: str, stalled: int) -> int:
        """How many tasks the worker may hold (running or waiting) when it takes one of type
        ``name``, with ``stalled`` threads running a long attempt (each holds just that one)."""
        turning = max(0, self.concurrency - stalled)
        return max(self.concurrency, stalled + int(self.per_thread(name) * turning))

    def most(self) -> int:
        """The largest :meth:`limit` of any type now (what a task read may ask for at most)."""
        with self._lock:
            fastest = min(self._ms.values(), default=None)
        if fastest is None:
            return self.concurrency
        per_thread = min(float(MOST_PER_THREAD), max(1.0, BACKLOG_MS / max(fastest, 0.001)))
        return int(per_thread * self.concurrency)


def task_name(fields: dict[bytes, bytes]) -> str:
    """The activity type of a task read from a stream (``""`` when its body does not say: the
    task is taken only for a free thread, whose attempt parks it)."""
    try:
        body = codec.unpack(fields[b"body"])
    except Exception:  # noqa: BLE001 - a damaged entry; the attempt reports it
        return ""
    name = body.get("name") if isinstance(body, dict) else None
    return name if isinstance(name, str) else ""
