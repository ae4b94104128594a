"""The benchmark workflows for DBOS (same shapes as ``bench_apps.py``).

Fan-out uses DBOS's documented pattern for parallel work inside a workflow:
enqueue child workflows on a queue (default polling interval) and wait for their handles.
"""

from __future__ import annotations

from typing import Any

from dbos import DBOS

FANOUT_QUEUE = "bench_fanout"  # registered by the engine after launch (DBOS.register_queue)


@DBOS.step()
def noop(i: int) -> int:
    return i


@DBOS.workflow()
def ten_steps(n: int) -> int:
    for i in range(n):
        noop(i)
    return n


@DBOS.workflow()
def one_step(i: int) -> int:
    return noop(i)


@DBOS.workflow()
def fan_out(n: int) -> int:
    queue = DBOS.retrieve_queue(FANOUT_QUEUE)
    assert queue is not None
    handles = [queue.enqueue(one_step, i) for i in range(n)]
    return len([h.get_result() for h in handles])


@DBOS.workflow()
def sleeper(seconds: float) -> float:
    DBOS.sleep(seconds)  # a durable sleep
    return seconds


@DBOS.workflow()
def wait_signal() -> Any:
    return DBOS.recv("go", timeout_seconds=60)
