"""The replay driver: (workflow class, history) -> the next decision. No I/O.

A :class:`Driver` owns one run's workflow code, executed in greenlets:

* the **root** branch runs ``handle(*args)``; each :func:`durable.all` call
  starts one branch per callable;
* every durable call builds a command event and switches to the driver (the
  *hub*); the driver resumes a branch when an input event resolves what it
  waits on;
* events are applied **one at a time, in seq order**, and runnable branches
  run to quiescence after each, so replay reproduces the live interleaving.

Replay checks every command the code issues against the recorded history by
encoded bytes (:meth:`Event.fingerprint`); a difference, or a recorded
command the code did not issue by the time replay reaches it, raises
:class:`NondeterminismError`.

Lifecycle, as a worker uses it::

    driver = Driver(run_id=..., workflow_id=...)
    driver.replay(history_entries)        # committed history, from seq 1
    decision = driver.decide(inbox)       # live: apply new inputs
    store.commit(decision)                # the worker commits it: atomic, expected seq
    driver.committed()                    # keep it cached for next time
    ...
    driver.close()                        # always, when evicted or on error

The driver never touches Redis, the clock or randomness of its own: time is
the ``ts`` of the last applied input event, so a fresh replay of the same
history produces the same decision byte for byte.

The driver is one class assembled from the modules of this package:
:mod:`.core` (state, greenlet machinery, the check of each command against
history), :mod:`.commands` (the durable calls, implementing
:class:`durable.runtime.WorkflowRuntime`), :mod:`.inputs` (applying input
events, cancellation, closing), :mod:`.decision` (what a decision commits) and
:mod:`.driver` (the lifecycle above).
"""

from __future__ import annotations

from .decision import Decision
from .driver import Driver, current_driver, replay_history

__all__ = ["Decision", "Driver", "current_driver", "replay_history"]
