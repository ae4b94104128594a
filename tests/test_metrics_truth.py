"""What `/metrics` and the JSON log lines say against what happened (an observability pass):
an attempt whose result came after its deadline was counted ``timed_out`` and ``completed``;
the run cache gauge kept the size of its last store (runs taken out and closed stayed counted);
a run's failure line had its ids only in the message text; a terminated run's driver stayed
cached until the LRU reached it; every new run counted as a cache miss and a replay, and a
late activity result as a decision error. A real worker process, scraped."""

from __future__ import annotations

import json
import time

import pytest
from apps.basic import Waiter
from apps.observe import ObservedSteps, ObservedTimesOut
from procs import spawn_worker
from test_observability import _finish, _free_port, _scrape, _value
from waiting import wait_for

from durable import EventConflict, WorkflowFailed, WorkflowStub
from durable.client import default_store
from durable.errors import WorkflowClosed
from durable.store.records import StaleCompletion
from durable.store.redis_store import RedisStore
from workers.metrics import decision_outcome
from workers.run_cache import CLOSED_CHECK_S

pytest.importorskip("prometheus_client")


def _sum(samples: dict, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        value
        for (sample, have), value in samples.items()
        if sample == name and set(labels.items()) <= set(have)
    )


def _attempts(port: int, activity_type: str) -> dict[str, float]:
    return {
        dict(labels)["outcome"]: value
        for (name, labels), value in _scrape(port).items()
        if name == "durable_activity_attempts_total" and dict(labels)["activity_type"] == activity_type
    }


@pytest.mark.slow
def test_a_terminated_runs_driver_leaves_the_cache(redis_url: str) -> None:
    """Terminating a run writes its closing without a decision: no task of it comes back to
    the worker that holds its suspended greenlet, which must still let it go."""
    port = _free_port()
    proc = spawn_worker(redis_url, app="apps.basic", extra=("--metrics-port", str(port)))
    try:
        kept, ended = (WorkflowStub.make(Waiter).start(0.05) for _ in range(2))

        def cached() -> float:
            try:
                return _value(_scrape(port), "durable_sticky_cache_runs")
            except OSError:  # its metrics server is not up yet
                return -1

        wait_for(lambda: cached() == 2, timeout=20)  # both wait for "go" (the timer fired)
        ended.terminate("test")
        wait_for(lambda: cached() == 1, timeout=CLOSED_CHECK_S + 10)
        kept.signal("go", "yes")
        assert kept.result(timeout=20) == "yes"  # the other one's driver was not touched
    finally:
        _finish(proc)


@pytest.mark.slow
def test_attempts_cache_gauge_and_failure_lines_say_what_happened(redis_url: str) -> None:
    port = _free_port()
    proc = spawn_worker(
        redis_url, app="apps.observe", extra=("--metrics-port", str(port), "--log-format", "json")
    )
    try:
        began = time.monotonic()
        late = [WorkflowStub.make(ObservedTimesOut).start() for _ in range(2)]
        for stub in late:
            with pytest.raises(WorkflowFailed, match="timed out|ActivityTimeout"):
                stub.result(timeout=30)
        failed = WorkflowStub.make(ObservedSteps).start("fail")
        with pytest.raises(WorkflowFailed):
            failed.result(timeout=30)
        for _ in range(5):
            assert WorkflowStub.make(ObservedSteps).start("ok").result(timeout=30) == "two"
        wait_for(lambda: _attempts(port, "ObservedLate").get("timed_out") == 2, timeout=20)
        # The late results come back 2.5 s after their attempts began (1.5 s after the timeout)
        # and are discarded: not counted. Wait until the worker's threads are all free again.
        time.sleep(max(0.0, began + 3.0 - time.monotonic()))
        wait_for(lambda: all(w.held == 0 for w in default_store().live_workers()), timeout=20)
        samples = _scrape(port)
        assert _attempts(port, "ObservedLate") == {"timed_out": 2.0}
        assert _value(samples, "durable_sticky_cache_runs") == 0  # every run closed: none cached
        # One worker decided every run from its cache: a new run's first decision is no cache
        # miss nor a replay (each start counted as both), a late result is no decision error.
        assert _sum(samples, "durable_sticky_cache_requests_total", result="miss") == 0, samples
        assert _sum(samples, "durable_sticky_cache_requests_total", result="hit") > 0
        assert _sum(samples, "durable_replays_total") == 0
        assert _sum(samples, "durable_decisions_total", outcome="error") == 0
    finally:
        err = _finish(proc)
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    (failure,) = [r for r in lines if r["message"].startswith(f"run {failed.run_id} ")]
    assert failure.get("run_id") == failed.run_id and failure.get("workflow_id") == failed.id, failure
    # Which worker process said it (under --processes N all write to one stderr).
    assert failure.get("pid") == proc.pid and f":{proc.pid}:" in failure.get("worker", ""), failure
    # One line per timed-out attempt (the scheduler said it too: two WARNINGs for one timeout).
    timeouts = [
        r for r in lines if r["message"].startswith("activity") and "timed out (start_" in r["message"]
    ]
    assert len(timeouts) == 2 and {r["level"] for r in timeouts} == {"WARNING"}, timeouts
    discarded = [r for r in lines if "late result of activity" in r["message"]]
    assert len(discarded) == 2 and {r.get("run_id") for r in discarded} == {s.run_id for s in late}, discarded


def test_timers_fired_counts_timers_and_backoffs_only(store: RedisStore) -> None:
    """``durable_timers_fired_total`` counted every member a pass took: hand-backs of tasks of a
    type no worker had, members of closed runs. The script now says which were timers."""
    open_run = WorkflowStub.make(Waiter, store=store).start(60)  # no worker: it stays open
    p = store.ref(open_run.id).partition
    store.redis.zadd(
        store.keys.timers(p),
        {f"t|{open_run.run_id}|9": 1, f"w|{open_run.run_id}|0": 1, "t|no-such-run|1": 1},
    )
    ((taken, next_due, timers),) = store.fire_timers([p])
    assert (taken, next_due, timers) == (3, -1, 1)


def test_a_void_commit_is_no_decision_error() -> None:
    """A late result an eager commit carried (its attempt timed out, the retry won) and a run
    closed meanwhile were counted ``error``, with no log line to explain them (the observability
    pass: a steady "decision error" rate on a fleet whose activities sometimes time out)."""
    assert decision_outcome(StaleCompletion("late")) == decision_outcome(WorkflowClosed("closed")) == "void"
    assert decision_outcome(EventConflict("raced")) == "conflict"
    assert decision_outcome(RuntimeError("boom")) == "error"
    assert decision_outcome(None) == "committed"
