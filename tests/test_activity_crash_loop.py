"""An activity that kills its worker process (``os._exit``: as a segfault or the OOM killer)
is not reclaimed and run again forever: after ``MAX_ACTIVITY_DELIVERIES`` deaths its attempt
fails with ``ActivityWorkerLost`` and its retry policy decides (``workers/crash_loops.py``).

Real worker processes, one at a time, restarted by the test each time one dies (as a
supervisor would), with ``--claim-idle 1`` so each reclaim comes within about a second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from apps.crashing import CrashingRun, LeasedCrashingRun, QuickRun
from procs import ROOT, TESTS, spawn_worker, stop

from durable import ActivityFailed, ActivityWorkerLost, WorkflowFailed, WorkflowStub
from durable.store.keys import attempt_member, begun_by
from durable.store.redis_store import RedisStore
from durable.store.tasks import ActivityTask
from workers import scheduler as scheduler_module
from workers.crash_loops import MAX_ACTIVITY_DELIVERIES, fail_if_crash_loop
from workers.scheduler import EXPIRY_HOLD_MS, Scheduler
from workers.worker_deaths import lapsed_lease

pytestmark = [pytest.mark.fault, pytest.mark.slow]

EXTRA = ("--claim-idle", "1")


class Restarter:
    """One ``durable worker`` at a time: a dead one is replaced; every one is stopped by the end."""

    def __init__(self, redis_url: str, extra: tuple[str, ...] = EXTRA) -> None:
        self.redis_url = redis_url
        self.extra = extra
        self.procs: list[subprocess.Popen] = []
        self.deaths = 0

    def keep_one(self) -> None:
        """Start a worker if none runs (counting the death of the one that did)."""
        if self.procs and self.procs[-1].poll() is None:
            return
        if self.procs:
            self.deaths += 1
        self.procs.append(spawn_worker(self.redis_url, app="apps.crashing", extra=self.extra))

    def until(self, done: object, timeout: float) -> None:
        """Keep a worker running until ``done()`` is true."""
        deadline = time.monotonic() + timeout
        while not done():  # type: ignore[operator]
            assert time.monotonic() < deadline, f"not done within {timeout} s ({self.deaths} worker deaths)"
            self.keep_one()
            time.sleep(0.05)

    def stop_all(self) -> str:
        """Stop every worker started (by its pid); returns the stderr of those that were alive."""
        err = ""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
            if proc.stderr is not None and not proc.stderr.closed:
                err += proc.stderr.read().decode(errors="replace")
            stop(proc)
        return err


def _closed(stub: WorkflowStub) -> bool:
    return stub.status() in ("completed", "failed")


def _describe(workflow_id: str, redis_url: str) -> dict:
    environ = dict(os.environ, DURABLE_REDIS_URL=redis_url, PYTHONPATH=f"{TESTS}{os.pathsep}{ROOT}")
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", "describe", workflow_id, "--json"],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(out.stdout)


def test_an_activity_killing_its_workers_fails_after_the_bound_and_others_go_on(
    redis_url: str, tmp_path: Path
) -> None:
    fatal, once = tmp_path / "fatal.log", tmp_path / "once.log"
    workers = Restarter(redis_url)
    try:
        crashing = WorkflowStub.make(CrashingRun).start(str(fatal))
        retried = WorkflowStub.make(CrashingRun).start(str(once), True)
        workers.until(lambda: workers.deaths >= 1, timeout=20)
        # Meanwhile a healthy run on the same queue is not held up by the crash loop.
        quick = WorkflowStub.make(QuickRun).start(1)
        workers.until(lambda: _closed(crashing) and _closed(retried) and _closed(quick), timeout=40)
        assert quick.result(timeout=5) == 3
        # Attempt 1 killed a worker on each delivery until the bound; then a new attempt ran.
        assert retried.result(timeout=5) == "attempt 2 ran"
        with pytest.raises(WorkflowFailed) as failed:
            crashing.result(timeout=5)
    finally:
        err = workers.stop_all()
    cause = failed.value.cause
    assert isinstance(cause, ActivityFailed), cause
    lost = cause.cause
    assert isinstance(lost, ActivityWorkerLost), lost
    assert f"died {MAX_ACTIVITY_DELIVERIES} times (os._exit, a crash, the OOM killer?)" in str(lost)
    assert "KillsItsWorker (" in str(lost) and "attempt 1" in str(lost)
    assert lost.deliveries == MAX_ACTIVITY_DELIVERIES + 1 and lost.worker
    # Each began exactly as often as the bound allows, no more: the loop ended there.
    assert fatal.read_text().splitlines() == ["attempt 1"] * MAX_ACTIVITY_DELIVERIES
    assert once.read_text().splitlines() == ["attempt 1"] * MAX_ACTIVITY_DELIVERIES + ["attempt 2"]
    # Both crashing tasks usually die in the same worker; a worker that read them apart dies twice.
    assert MAX_ACTIVITY_DELIVERIES <= workers.deaths <= 2 * MAX_ACTIVITY_DELIVERIES
    assert "its worker died 3 times running it" in err, err[-3000:]

    info = _describe(crashing.id, redis_url)
    assert info["status"] == "failed"
    text = json.dumps(info)
    assert "ActivityWorkerLost" in text and "died 3 times" in text, text[:3000]


def test_a_leased_attempt_killing_its_workers_fails_after_the_same_bound(
    redis_url: str, tmp_path: Path
) -> None:
    """``--eager`` and local activities run their attempt under the deciding worker's lease. Before,
    the first death ended that attempt (its lease lapsed: ``ActivityTimeout`` ``lease``, one attempt
    of the policy spent per death, ``ActivityWorkerLost`` never said). Now the lapsed lease runs the
    same attempt again from its queue, and it fails with ``ActivityWorkerLost`` after the same bound."""
    eager_log, local_log = tmp_path / "eager.log", tmp_path / "local.log"
    workers = Restarter(redis_url, (*EXTRA, "--eager"))
    try:
        eager = WorkflowStub.make(LeasedCrashingRun).start(str(eager_log))
        local = WorkflowStub.make(LeasedCrashingRun).start(str(local_log), True)
        workers.until(lambda: _closed(eager) and _closed(local), timeout=40)
        causes = []
        for stub in (eager, local):
            with pytest.raises(WorkflowFailed) as failed:
                stub.result(timeout=5)
            causes.append(failed.value.cause)
    finally:
        err = workers.stop_all()
    for cause in causes:
        assert isinstance(cause, ActivityFailed), cause
        assert isinstance(cause.cause, ActivityWorkerLost), cause.cause
        assert f"attempt 1 died {MAX_ACTIVITY_DELIVERIES} times" in str(cause.cause)
    # Each began as often as the bound allows (once leased, then from its queue), no more.
    assert eager_log.read_text().splitlines() == ["attempt 1"] * MAX_ACTIVITY_DELIVERIES
    assert local_log.read_text().splitlines() == ["attempt 1"] * MAX_ACTIVITY_DELIVERIES
    assert "(its lease lapsed); it runs again, as the same attempt, from its queue" in err, err[-3000:]


def test_only_the_deliveries_that_began_the_attempt_count(store: RedisStore) -> None:
    """A task reclaimed from dying workers that never began it there (it waited for a thread while
    another attempt killed the process) is not failed; its begins are what count."""
    k, r = store.keys, store.redis
    task = ActivityTask("r-waits", "w", 0, "1", "Quick", b"", 1, k.activity_tasks(0, "crash-begins"))
    r.hset(k.run(0, task.run_id), "status", "running")
    store.ensure_groups([task.stream])
    entry_id = r.xadd(task.stream, {"run": task.run_id, "act": "1", "body": task.encode()}).decode()
    r.xreadgroup("workers", "w1", {task.stream: ">"})
    for dead in ("w2", "w3", "w4"):  # three reclaims: four deliveries
        r.xclaim(task.stream, "workers", dead, 0, [entry_id])
    assert store.delivery_count(task.stream, entry_id) == MAX_ACTIVITY_DELIVERIES + 1
    fields = {b"body": task.encode()}
    acts = k.activities(0, task.run_id)
    r.hset(acts, mapping={"1": task.encode(), "1#": 1, "1@": task.stream, "1:worker": begun_by(1, "w1", 1)})
    assert not fail_if_crash_loop(store, task.stream, entry_id, fields, consumer="w5")  # began once
    r.hset(acts, "1:worker", begun_by(1, "w4", 3))  # it began on each of three workers that died
    assert fail_if_crash_loop(store, task.stream, entry_id, fields, consumer="w5")


def test_a_lapsed_lease_runs_the_attempt_again_once(store: RedisStore) -> None:
    """Every scheduler sees a lapsed lease: only the first puts the attempt in its queue again;
    an attempt begun as often as the bound allows fails instead."""
    k, r = store.keys, store.redis
    task = ActivityTask("r-lapsed", "w", 0, "1", "Quick", b"", 1, k.activity_tasks(0, "crash-leases"))
    r.hset(k.run(0, task.run_id), "status", "running")
    acts = k.activities(0, task.run_id)
    r.hset(acts, mapping={"1": task.encode(), "1#": 1, "1@": task.stream, "1:worker": begun_by(1, "w1", 1)})
    assert lapsed_lease(store, task) is None and lapsed_lease(store, task) is None
    assert [f[b"body"] for _, f in r.xrange(task.stream)] == [task.encode()]  # once, the same attempt
    r.hset(acts, "1:worker", begun_by(1, "w3", MAX_ACTIVITY_DELIVERIES))
    lost = lapsed_lease(store, task)
    assert isinstance(lost, ActivityWorkerLost) and lost.worker == "w3"
    assert f"died {MAX_ACTIVITY_DELIVERIES} times" in str(lost)


def test_a_lapsed_lease_whose_scheduler_dies_taking_it_is_run_by_another(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheduler removed the lapsed lease's deadline, then ran the attempt again: killed in
    between (its worker SIGKILLed, Redis gone), the attempt had no deadline, task or lease any more
    and its run waited forever (a fault-suite run: "pending activities=['3.1.1'] running=[]")."""
    k, r = store.keys, store.redis
    task = ActivityTask("r-taken", "w", 0, "1", "Quick", b"", 1, k.activity_tasks(0, "crash-taken"))
    r.hset(k.run(0, task.run_id), "status", "running")
    acts = k.activities(0, task.run_id)
    r.hset(acts, mapping={"1": task.encode(), "1#": 1, "1@": task.stream})
    now = store.server_time_ms()
    r.zadd(k.running(0), {attempt_member(task.run_id, "1", 1): now - 1})

    def dies_here(*_args: object) -> None:
        raise ConnectionError("the scheduler's process died")

    first, second = (Scheduler(store, streams=[], consumer=c, reclaimed=lambda *_: None) for c in ("a", "b"))
    with monkeypatch.context() as m:
        m.setattr(scheduler_module, "lapsed_lease", dies_here)
        with pytest.raises(ConnectionError):
            first._expire_attempts(0, now)
    second._expire_attempts(0, now)  # the first one's to deal with a while
    assert r.xlen(task.stream) == 0
    lapsed: list[str] = []  # counted as a lease timeout: it was in no metric (observability pass)
    monkeypatch.setattr(scheduler_module.metrics, "lease_lapsed", lapsed.append)
    second._expire_attempts(0, now + EXPIRY_HOLD_MS + 1)  # it never did: another takes it
    assert [f[b"body"] for _, f in r.xrange(task.stream)] == [task.encode()]
    assert lapsed == ["Quick"]
    assert r.zscore(k.running(0), attempt_member(task.run_id, "1", 1)) is None


def test_a_reclaimed_task_is_said_with_its_runs_ids(
    store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    """ "reclaimed task 1796...-0 from durable:{0}:aq:long" named a stream entry only: a run could
    not be followed by its id on the crash path (observability pass)."""
    k, r = store.keys, store.redis
    task = ActivityTask(
        "r-reclaimed", "wf-reclaimed", 0, "2", "Quick", b"", 1, k.activity_tasks(0, "reclaims")
    )
    r.xgroup_create(task.stream, "workers", id="0", mkstream=True)
    r.xadd(task.stream, {"body": task.encode()})
    r.xreadgroup("workers", "dead-worker", {task.stream: ">"})  # read by a worker that then died
    got: list[str] = []
    scheduler = Scheduler(
        store, streams=[task.stream], consumer="b", reclaimed=lambda *a: got.append(a[1]), claim_idle_ms=1
    )
    time.sleep(0.01)
    with caplog.at_level("WARNING", logger="durable.scheduler"):
        scheduler._reclaim()
    assert got, "nothing reclaimed"
    (line,) = [rec for rec in caplog.records if rec.getMessage().startswith("reclaimed task")]
    assert (line.run_id, line.workflow_id, line.activity_type, line.attempt) == (  # type: ignore[attr-defined]
        "r-reclaimed",
        "wf-reclaimed",
        "Quick",
        1,
    )
