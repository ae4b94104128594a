"""Decision loads that rode along with the completions waking their runs.

When this worker's main thread records an activity result that enqueues its run's
workflow task, and the run's driver is cached here, the load that decision needs is read
in the same round trip (:func:`workers.attempts.complete_and_preload`). The task itself
arrives in the read of that pass or of a later one; the load waits for it here.

A load is used only while its run's cached seq is unchanged (else the run is loaded afresh,
as a stale decider's commit would conflict anyway). Inputs that reached the inbox after it
are not lost: the commit re-wakes the run when its inbox is not empty, and they are decided
one task later.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from durable.store.loads import Loaded

PRELOAD_PASSES = 4
"""How many worker passes a load waits for its run's task (measured under W2: the woken task
came in the read of up to three passes after the completion's); then it is dropped (the task
went to another worker)."""


class Preloads:
    """Run id -> (cached seq when loaded, load): this pass's, then the previous passes'."""

    def __init__(self) -> None:
        self.current: dict[str, tuple[int, Loaded]] = {}
        self._older: deque[dict[str, tuple[int, Loaded]]] = deque(maxlen=PRELOAD_PASSES - 1)

    def add(self, loads: dict[str, tuple[int, Loaded]]) -> None:
        """Loads taken in this pass."""
        self.current.update(loads)

    def end_pass(self) -> None:
        """A worker pass is over: its loads wait for the next passes' reads."""
        self._older.appendleft(self.current)
        self.current = {}

    def forget(self, run_ids: Iterable[str]) -> None:
        """Drop the loads of runs that received new inputs since (they would miss them)."""
        for rid in run_ids:
            self.take(rid)

    def take(self, run_id: str) -> tuple[int, Loaded | None]:
        """The newest load of ``run_id``, taken out of every pass (``(-1, None)``: none)."""
        found = self.current.pop(run_id, None)
        for older in self._older:
            got = older.pop(run_id, None)
            if found is None:
                found = got
        return found if found is not None else (-1, None)
