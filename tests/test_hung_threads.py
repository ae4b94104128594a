"""Activity threads held by abandoned attempts (Python cannot stop a thread), with real workers.

An activity that hangs past its timeout fails its run as it should, but keeps its thread for as
long as the process lives. Before, a worker whose threads were all held so ran nothing more, with
a healthy heartbeat, and a later run said only ``waiting for a worker``. Now the worker logs each
abandoned attempt once and, when none of its threads is usable, an ERROR; its registry entry
counts them (``durable workers``) and ``describe``/``status`` of a run waiting on its queue say
that its workers' threads are held by hung activities.
"""

from __future__ import annotations

import json
import logging
import signal
import time

import pytest
from apps.hangs import AfterHang, Hang, QuietHang
from clikit import cli_ok as _cli
from procs import spawn_worker
from waiting import wait_for

from durable import WorkflowFailed, WorkflowStub
from durable.store.held import STARVED_QUEUE, starved_queues
from durable.store.redis_store import RedisStore
from durable.store.tasks import ActivityTask
from durable.store.workers import WorkerInfo
from workers.cli.fleet import mark_unserved
from workers.hung import HungWatch
from workers.server.workflow_routes import _marked_rows

pytestmark = pytest.mark.slow


def _me(report: dict) -> dict:
    (worker,) = report["workers"]
    return worker


def test_threads_held_by_hung_activities_are_said_everywhere(redis_url: str, store: RedisStore) -> None:
    worker = spawn_worker(
        redis_url,
        app="apps.hangs",
        extra=("--concurrency", "2", "--queue", "default", "--queue", "starve", "--grace", "1"),
    )
    try:
        wait_for(store.live_workers, timeout=20)
        hangs = [WorkflowStub.make(Hang, store=store).start(f"h{i}") for i in range(2)]
        for stub in hangs:  # the attempts time out and the runs fail, as they should
            with pytest.raises(WorkflowFailed):
                stub.result(timeout=15)

        # The next heartbeats count the threads held (the entry is written every 2 s).
        wait_for(lambda: _me(json.loads(_cli("workers", "--json")))["threads_held"] == 2, timeout=10)
        me = _me(json.loads(_cli("workers", "--json")))
        assert me["threads"] == 2 and me["starved"] is True
        assert me["threads_note"] == "2/2 threads held by attempts past their timeout or of closed runs"
        assert len(me["stuck"]) == 2 and all(
            s.startswith("hang (1, attempt 1) of workflow ") for s in me["stuck"]
        )
        assert all("past its start_to_close 1 s timeout" in s for s in me["stuck"])
        table = _cli("workers")
        assert "2/2 threads held by attempts past their timeout" in table and "restart it" in table

        # A later run on that queue waits; describe and status say why, naming the worker.
        quick = WorkflowStub.make(AfterHang, store=store).start("q")
        wait_for(lambda: quick.describe().pending and quick.describe().pending[0].get("backlog"), timeout=10)
        why = f"its workers' threads are all held by hung activities ({me['name']}: hang x2)"
        step = quick.describe().pending[0]
        assert why in step["starved"] and why in step["state"]
        assert step["state"].startswith("attempt 1: not begun: queued on 'starve', waiting for a worker")
        # Blocked, as the runs lists say (status said only `running (... queued ...)` before).
        status = _cli("status", quick.id)
        assert status.startswith(f"running (blocked: activity 'quick' (id 1) waits on queue 'starve': {why}")
        assert "restart them" in status
        assert (quick.describe().blocked.kind, quick.describe().blocked.message) == (
            "starved_queue",
            status.removeprefix("running (blocked: ").strip().removesuffix(")"),
        )
        assert why in _cli("describe", quick.id)
        # The runs lists too: it waits until the workers are restarted, as a blocked run does.
        (row,) = [r for r in json.loads(_cli("list", "--json")) if r["workflow_id"] == quick.id]
        assert row["blocked_kind"] == "starved_queue" and why in row["blocked"], row
        assert quick.id in _cli("list", "--status", "blocked")
    finally:
        worker.send_signal(signal.SIGKILL)  # its threads hang: no graceful stop to wait for
        worker.wait(10)
        log = worker.stderr.read().decode() if worker.stderr else ""
        if worker.stderr:
            worker.stderr.close()
    assert "has run past its timeout (start_to_close 1 s) for" in log, log
    assert "still holds an activity thread (Python cannot stop a thread)" in log, log
    assert log.count("of run ") >= 2 and "can run no activity: all its 2 activity threads" in log, log


def test_a_thread_held_past_a_heartbeat_timeout_is_counted(redis_url: str, store: RedisStore) -> None:
    """An attempt ended only by its heartbeat timeout (no hard deadline), its run still open (its
    next attempt waits for a thread), holds its thread: counted and said as the other cases."""
    worker = spawn_worker(
        redis_url,
        app="apps.hangs",
        extra=("--concurrency", "1", "--queue", "default", "--queue", "quiet", "--grace", "30"),
    )
    try:
        wait_for(store.live_workers, timeout=20)
        stub = WorkflowStub.make(QuietHang, store=store).start("q")
        wait_for(lambda: _me(json.loads(_cli("workers", "--json")))["threads_held"] == 1, timeout=10)
        me = _me(json.loads(_cli("workers", "--json")))
        assert me["starved"] is True and me["threads_note"].startswith("1/1 threads held")
        (stuck,) = me["stuck"]
        assert stuck.startswith("hang (1, attempt 1) of workflow ") and "heartbeat 1 s timeout" in stuck
        assert stuck.endswith("attempt 2 is current") and stub.status() == "running"
        # A graceful stop does not wait out its 30 s grace for an attempt whose result cannot count.
        began = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        worker.wait(20)
        assert time.monotonic() - began < 8
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
        log = worker.stderr.read().decode() if worker.stderr else ""
        if worker.stderr:
            worker.stderr.close()
    assert "its attempt is over (no heartbeat within its heartbeat 1 s timeout" in log, log
    assert "can run no activity: all its 1 activity threads" in log, log
    assert "not waiting for the 1 activities still running: their attempts are abandoned" in log, log


def test_an_attempt_of_a_closed_run_is_abandoned(store: RedisStore) -> None:
    """Without a timeout, an attempt is abandoned once its run closed (or is gone)."""
    now = time.time()
    fields = {"partition": 0, "activity_id": "1", "name": "hang", "args": b"", "attempt": 1, "stream": "s"}
    task = ActivityTask(run_id="r-closed", workflow_id="w", **fields)
    gone = ActivityTask(run_id="r-gone", workflow_id="w2", **fields)
    store.redis.hset(store.keys.run(0, "r-closed"), "status", "terminated")
    watch = HungWatch(store, lambda: [(now - 30, task), (now - 30, gone)], 2, "w1")
    assert watch.check()[1] == 0  # seen once: it may be an attempt whose own result closed its run
    threads, held, stuck, *_ = watch.check()  # still there at the next look: held
    assert (threads, held) == (2, 2)
    assert stuck[0].endswith("its run is terminated") and stuck[1].endswith("its run is gone")
    store.redis.hset(store.keys.run(0, "r-closed"), "status", "running")
    store.redis.hset(store.keys.activities(0, "r-closed"), "1#", 1)  # attempt 1 is current
    fresh = HungWatch(store, lambda: [(now - 30, task)], 2, "w1")
    assert fresh.check()[1] == 0  # an open run's long attempt without a timeout is no hang


def test_an_attempt_gone_by_the_next_look_is_not_said_to_hold_its_thread(
    store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    """An attempt whose own result closed its run is on its thread a moment longer: 16 finishing
    together were each logged as holding a thread with a result that "will not count"."""
    now = time.time()
    fields = {"partition": 0, "activity_id": "1", "name": "done", "args": b"", "attempt": 1, "stream": "s"}
    task = ActivityTask(run_id="r-done", workflow_id="w", **fields)
    store.redis.hset(store.keys.run(0, "r-done"), "status", "completed")  # by this very result
    running = [(now - 30, task)]
    watch = HungWatch(store, lambda: list(running), 1, "w1")
    with caplog.at_level(logging.WARNING, logger="durable.worker"):
        assert watch.check()[1] == 0
        running.clear()  # the thread returned
        assert watch.check()[1] == 0
    assert not [r for r in caplog.records if "holds an activity thread" in r.getMessage()]


def test_an_attempt_the_scheduler_ended_is_abandoned(store: RedisStore) -> None:
    """An attempt the store no longer has as current (its heartbeat timeout passed, the scheduler
    retried or failed it; or it was cancelled) is abandoned, though no hard deadline passed."""
    now = time.time()
    fields = {"partition": 0, "activity_id": "1", "name": "quiet", "args": b"", "stream": "s"}
    beats = ActivityTask(run_id="r-hb", workflow_id="w", attempt=1, timeouts={"heartbeat": 1}, **fields)
    store.redis.hset(store.keys.run(0, "r-hb"), "status", "running")
    acts = store.keys.activities(0, "r-hb")
    store.redis.hset(acts, "1#", 1)
    assert HungWatch(store, lambda: [(now - 30, beats)], 1, "w1").check()[1] == 0  # still current
    store.redis.hset(acts, "1#", 2)  # the scheduler expired it (heartbeat) and scheduled attempt 2
    watch = HungWatch(store, lambda: [(now - 30, beats)], 1, "w1")
    watch.check()
    threads, held, stuck, *_ = watch.check()  # at two looks in a row
    assert (threads, held) == (1, 1)
    assert stuck[0].startswith("quiet (1, attempt 1) of workflow w run r-hb, since ")
    assert stuck[0].endswith(
        "its attempt is over (no heartbeat within its heartbeat 1 s timeout, or cancelled): attempt 2 is current"
    )
    store.redis.delete(acts)  # failed for good (or cancelled): the activity is no longer pending
    watch = HungWatch(store, lambda: [(now - 30, beats)], 1, "w1")
    watch.check()
    stuck = watch.check()[2]
    assert stuck[0].endswith("the activity is no longer pending")
    # A short call is not read at all (a thread busy for under a heartbeat is no hang yet).
    assert HungWatch(store, lambda: [(now - 1, beats)], 1, "w1").check()[1] == 0


def test_starved_queues_needs_every_live_worker_of_the_queue_starved() -> None:
    stuck = ("hang (1, attempt 1) of workflow w run r: 3 s past its start_to_close 1 s timeout",) * 2
    held = WorkerInfo(name="a", queues=("q", "p"), threads=2, held=2, stuck=stuck)
    free = WorkerInfo(name="b", queues=("p",), threads=2, held=1, stuck=stuck[:1])
    old = WorkerInfo(name="c", queues=("o",))  # an entry that does not say (older release)
    reasons = starved_queues([held, free, old])
    assert set(reasons) == {"q"}
    assert "(a: hang x2)" in reasons["q"] and "restart them" in reasons["q"]


def test_the_runs_lists_show_a_run_waiting_on_a_starved_queue_as_blocked() -> None:
    """`durable list` and the API's runs list said only `running` (describe and status said why)."""
    stuck = ("hang (1, attempt 1) of workflow w run r: 3 s past its start_to_close 1 s timeout",)
    live = [WorkerInfo(name="a", queues=("q",), threads=1, held=1, stuck=stuck)]
    waiting = {"workflow_id": "w2", "status": "running", "queue": "q", "type": "T"}
    waiting["snapshot"] = {"pending": [{"kind": "activity", "id": "1", "name": "quick", "queue": "q"}]}
    timer = {**waiting, "workflow_id": "w3", "snapshot": {"pending": [{"kind": "timer", "id": "1"}]}}
    closed = {**waiting, "workflow_id": "w4", "status": "completed"}
    rows = [dict(waiting), timer, closed]
    mark_unserved(rows, live)
    assert rows[0]["blocked_kind"] == STARVED_QUEUE
    assert rows[0]["blocked"].startswith("activity 'quick' (id 1) waits on queue 'q': its workers' threads")
    assert "blocked" not in rows[1] and "blocked" not in rows[2]
    (row,) = _marked_rows([dict(waiting)], live)  # the API's row, from the same marking
    assert (row["blocked_kind"], row["blocked"]) == (STARVED_QUEUE, rows[0]["blocked"])
