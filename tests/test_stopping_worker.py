"""A stopping worker (SIGTERM: it finishes its running activities, up to --grace):

* ends its blocking task reads at once (``CLIENT UNBLOCK``) instead of waiting out their BLOCK:
  it takes no new task after its stop signal (in a deploy, a new run would otherwise start on
  the old code), and it stops sooner;
* records each result as it comes, and hands the workflow tasks of its runs to the workers that
  go on, instead of holding them until its slowest activity is done;
* says so in the registry: the views count it out of the workers that serve a queue, and say
  why an attempt running on it has not finished.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from apps.basic import Sequence, SlowSteps, Waiter
from procs import durable_cli, spawn_worker, stop
from waiting import wait_for

from durable import WorkflowStub
from durable.runinfo import with_attempts
from durable.store.activities import AttemptBegun
from durable.store.keys import GROUP
from durable.store.redis_store import RedisStore
from durable.store.workers import WorkerInfo, no_worker_reason
from workers.reader import TaskReader
from workers.worker import Worker, WorkerThread


def test_an_unblocked_read_returns_at_once_and_takes_no_task_added_after(store: RedisStore) -> None:
    stream = store.keys.workflow_tasks(0, "stop-reads")
    store.ensure_groups([stream])
    reader = TaskReader(store.open_read, "c", group_of=store.read_group)
    try:
        assert reader.read({"lane": ([stream], 10)}, block_ms=30_000, wait=False) is None  # outstanding
        started = time.monotonic()
        reader.unblock()
        reply = reader.read({}, block_ms=30_000)
        assert time.monotonic() - started < 2, "the read waited out its BLOCK"
        assert reply == [("lane", [])]
        store.redis.xadd(stream, {"run": "r"})
        time.sleep(0.1)
        assert store.redis.xpending(stream, GROUP)["pending"] == 0  # delivered to no one
    finally:
        reader.close()


def test_a_stopping_worker_ends_its_reads_and_leaves_a_new_run_to_the_next_worker(
    store: RedisStore,
) -> None:
    worker = Worker(store, grace=5, block_ms=30_000)
    thread = WorkerThread(worker)
    thread.__enter__()
    time.sleep(0.5)  # idle, in a read that would block for another ~29 s
    started = time.monotonic()
    worker.stop()
    thread.thread.join(timeout=40)
    took = time.monotonic() - started
    assert not thread.thread.is_alive()
    assert took < 5, f"the stop took {took:.1f} s: it waited for its blocking reads to time out"

    stub = WorkflowStub.make(Sequence, store=store).start(3)
    time.sleep(0.3)
    assert stub.status() == "pending"  # no stopped worker's read took its task
    with WorkerThread(Worker(store, grace=5, block_ms=100)):
        assert stub.result(timeout=30) == 0 + 1 + 2


def test_what_comes_for_a_stopping_workers_runs_goes_to_the_workers_that_go_on(
    store: RedisStore, tmp_path: Path
) -> None:
    """A stopping worker lets its running activities finish (up to --grace). A short one's result
    was recorded only once the slowest was done too: its run waited for the whole stop, shown
    as still running on that worker. And the workflow tasks of its runs (that result's, a
    signal's) went to its private stream, where nothing read them until --sticky-timeout."""
    journal = str(tmp_path / "journal")
    stopping = Worker(store, grace=30, block_ms=100, concurrency=4)
    thread = WorkerThread(stopping)
    thread.__enter__()
    waiter = WorkflowStub.make(Waiter, store=store).start(0)
    short = WorkflowStub.make(SlowSteps, store=store).start(journal, 1, 0.5)
    long = WorkflowStub.make(SlowSteps, store=store).start(journal, 1, 8.0)
    wait_for(lambda: Path(journal).exists() and Path(journal).read_text().count("start") == 2)
    wait_for(lambda: waiter.status() == "suspended")  # decided here: sticky to this worker
    stopping.stop()  # both activities are running on its threads
    # The next worker, with the default --sticky-timeout (5 s).
    with WorkerThread(Worker(store, grace=5, block_ms=100)):
        assert short.result(timeout=3) == ["s0", "end"]
        waiter.signal("go", "now")
        assert waiter.result(timeout=3) == "now"
        assert thread.thread.is_alive(), "the stopping worker is still finishing the long one"
        assert long.result(timeout=30) == ["s0", "end"]
    thread.thread.join(timeout=30)
    assert not thread.thread.is_alive()


def test_a_stopping_worker_does_not_serve_its_queue_in_the_views() -> None:
    record = {"status": "pending", "queue": "default", "type": "Order"}
    stopping = WorkerInfo(name="w1", queues=("default",), workflows=("Order",), stopping=1)
    reason = no_worker_reason(record, [stopping])
    assert reason is not None and reason.startswith("no live worker serves queue 'default'")
    assert reason.endswith("(worker w1 is stopping: finishing running activities, taking no new task)")
    taking = WorkerInfo(name="w2", queues=("default",), workflows=("Order",))
    assert no_worker_reason(record, [stopping, taking]) is None
    elsewhere = WorkerInfo(name="w3", queues=("other",), stopping=1)
    assert "stopping" not in str(no_worker_reason(record, [elsewhere]))  # not of this run's queues

    step = {"kind": "activity", "id": "1", "name": "charge", "queue": "default"}
    begun = {"1": AttemptBegun(attempt=1, worker="w1", started_ms=1)}
    state = with_attempts([step], begun, {"w1": 1}, stopping={"w1"})[0]["state"]
    assert state.endswith("(that worker is stopping: it finishes this attempt first, up to its --grace)")


def test_the_commands_say_a_worker_is_stopping(redis_url: str, store: RedisStore, tmp_path: Path) -> None:
    """A real worker, SIGTERMed while it runs a 12 s activity: `durable workers` lists it as
    stopping, `describe` says the attempt finishes there first, and a new run on its queue is
    said to have no live worker (this one takes no task), naming the stopping one, and `durable
    start` warns so too."""
    journal = str(tmp_path / "journal")
    proc = spawn_worker(redis_url)
    try:
        # 12 s: the CLI calls below take seconds each on a loaded machine (6 s was over before them)
        running = WorkflowStub.make(SlowSteps, store=store).start(journal, 1, 12.0)
        wait_for(lambda: Path(journal).exists() and "start" in Path(journal).read_text())
        proc.send_signal(signal.SIGTERM)
        workers = wait_for(
            lambda: (
                (w := json.loads(durable_cli(redis_url, "workers", "--json").stdout)["workers"])
                and w[0]["stopping_since"]
                and w
            )
        )
        assert len(workers) == 1 and workers[0]["pid"] == proc.pid
        assert "stopping for" in durable_cli(redis_url, "workers").stdout

        described = durable_cli(redis_url, "describe", running.id, "--json").stdout
        assert "that worker is stopping: it finishes this attempt first" in described
        waiting = WorkflowStub.make(Sequence, store=store).start(2)
        status = durable_cli(redis_url, "status", waiting.id).stdout
        assert "no live worker serves queue 'default'" in status, status
        assert f"(worker {workers[0]['name']} is stopping: finishing running activities" in status, status
        started = durable_cli(redis_url, "start", "Sequence", "1")  # warned as the views say it
        assert (
            f"warning: no live worker on queue 'default' runs workflow type 'Sequence'; worker "
            f"{workers[0]['name']} is stopping; the run waits" in started.stderr
        ), started.stderr

        assert stop(proc, timeout=20) == 0
        # Its result was recorded before the worker left (the run's next step waits for a worker).
        described = running.describe()
        assert [a["outcome"] for a in described.attempts] == ["completed"]
        (step,) = [s for s in described.pending if s["kind"] == "activity"]  # said, not blank
        assert step["state"] == "attempt 1 completed; its result waits for the run's next decision"
    finally:
        stop(proc)


def test_a_hangup_stops_a_single_worker_as_sigterm_does(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    """SIGHUP (a terminal closed, a service manager's reload) ended a worker process at once,
    its running activity cut short (run again after --claim-idle). A single worker cannot reload
    itself (`--processes N` can): it stops gracefully instead, finishing the activity first.
    Started with SIGHUP ignored (`nohup`), it keeps ignoring it."""
    ignoring = spawn_worker(redis_url, hangup=signal.SIG_IGN)
    try:
        wait_for(lambda: any(w.pid == ignoring.pid for w in store.live_workers()))
        ignoring.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert ignoring.poll() is None
    finally:
        assert stop(ignoring) == 0

    journal = str(tmp_path / "journal")
    proc = spawn_worker(redis_url, hangup=signal.SIG_DFL)
    try:
        running = WorkflowStub.make(SlowSteps, store=store).start(journal, 1, 2.0)
        wait_for(lambda: Path(journal).exists() and "start" in Path(journal).read_text())
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=20) == 0
        assert [a["outcome"] for a in running.describe().attempts] == ["completed"]
        assert b"received SIGHUP: finishing in-flight work" in proc.stderr.read()
    finally:
        stop(proc)


def test_an_attempt_a_stopping_worker_hands_back_is_said_so_and_is_no_workers_death(
    store: RedisStore, tmp_path: Path
) -> None:
    """An attempt still running at the end of --grace goes back to its queue: describe called it
    "lost ... (it died, hung or was taken for dead ...)", and each such hand-back counted as a
    worker's death toward the 3 that fail an activity ActivityWorkerLost (a long activity across
    three rolling deploys)."""
    journal = tmp_path / "journal"
    stopping = Worker(store, grace=1, block_ms=100)
    thread = WorkerThread(stopping)
    thread.__enter__()
    run = WorkflowStub.make(SlowSteps, store=store).start(str(journal), 1, 4.0)
    wait_for(lambda: journal.exists() and "start" in journal.read_text())
    stopping.stop()
    thread.thread.join(timeout=20)  # past its grace: the running attempt's task went back
    assert not thread.thread.is_alive()
    with WorkerThread(Worker(store, grace=5, block_ms=100)):
        wait_for(lambda: journal.read_text().count("start") == 2, timeout=20)  # begun again
        ref = store.ref(run.id)
        begins = store.attempt_begins(ref.partition, ref.run_id, "1")
        assert begins is not None and begins.begins == 1, begins  # not counted as a death
        assert run.result(timeout=30) == ["s0", "end"]
    described = durable_cli(store.url, "describe", run.id, "--json").stdout
    assert '"handed_back"' in described, described
    assert "handed it back (it was stopping, the attempt still running past its --grace)" in described
    assert "never reported its outcome" not in described
