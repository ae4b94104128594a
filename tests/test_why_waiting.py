"""Why an open run is not moving, as the views tell it, with real ``durable worker`` processes.

* A run whose queue no live worker serves (none started yet, or all stopped or died) says so in
  every view -- ``status``, ``describe``, ``list`` (and ``--status blocked``),
  ``WorkflowStub.blocked`` -- and moves on, the reason gone, once a worker of that queue starts.
  ``result()`` keeps waiting meanwhile: starting the worker is the fix, not an error. The same
  for the queue of an activity the run waits on.
* ``describe`` shows where each pending activity's attempt is: on which worker it began, and
  whether that worker is still alive (a killed worker's task waits for ``--claim-idle``).
"""

from __future__ import annotations

import json
import signal
import time

import pytest
from apps.basic import PaysOnBilling, Sequence, SlowOnBilling, SlowSteps
from apps.failures import ParentOfWaiting
from apps.recovery import OneRecoveringActivity
from click.testing import CliRunner
from procs import spawn_worker, stop
from waiting import wait_for

from durable import Workflow, WorkflowStub, child
from durable.run_views import _handed_back
from durable.runinfo import with_children
from durable.store.redis_store import RedisStore
from durable.store.workers import HEARTBEAT_S, WorkerInfo
from workers.cli import cli
from workers.worker import Worker, WorkerThread


def _cli(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


pytestmark = pytest.mark.slow


def test_a_run_with_no_worker_on_its_queue_says_so_until_one_starts(
    redis_url: str, store: RedisStore
) -> None:
    stub = WorkflowStub.make(Sequence, store=store, queue="billing").start(3)

    blocked = stub.blocked()
    assert blocked is not None and blocked.kind == "no_live_worker"
    assert "no live worker serves queue 'billing'" in blocked.message
    assert "--queue billing" in blocked.message  # what to run
    assert _cli("status", stub.id).startswith("pending (blocked: no live worker serves queue 'billing'")
    described = json.loads(_cli("describe", stub.id, "--json"))
    assert described["blocked_kind"] == "no_live_worker"
    rows = json.loads(_cli("list", "--status", "blocked", "--json"))
    assert [(r["workflow_id"], r["blocked_kind"]) for r in rows] == [(stub.id, "no_live_worker")]
    # result() is not given up on (a pinned run's is, after the grace): its waiters' check of the
    # registry (store.unserved_reason) covers pinned runs only.
    assert store.unserved_reason(store.run_record(store.ref(stub.id))) is None
    with pytest.raises(TimeoutError):
        stub.result(timeout=1)

    # A worker of another queue does not help; one of this queue does.
    other = spawn_worker(redis_url, extra=("--queue", "default"))
    try:
        wait_for(lambda: "default" in _cli("workers"), timeout=30)
        assert stub.blocked() is not None
    finally:
        stop(other)
    worker = spawn_worker(redis_url, extra=("--queue", "billing"))
    try:
        assert stub.result(timeout=30) is not None
        assert stub.blocked() is None
        assert _cli("status", stub.id).strip() == "completed"
        assert json.loads(_cli("list", "--status", "blocked", "--json")) == []
    finally:
        stop(worker)


def test_an_activity_on_a_queue_no_live_worker_serves_says_so(redis_url: str, store: RedisStore) -> None:
    """The run's own queue has a worker; the queue of the activity it waits on has none."""
    default = spawn_worker(redis_url)
    billing = None
    try:
        wait_for(store.live_workers, timeout=30)
        stub = WorkflowStub.make(PaysOnBilling, store=store).start(41)
        reason = wait_for(stub.blocked, timeout=30)
        assert reason.kind == "no_live_worker"
        assert reason.message.startswith(
            "no live worker serves queue 'billing', where activity 'add' (id 1) waits"
        )
        assert "(blocked: no live worker serves queue 'billing'" in _cli("status", stub.id)
        billing = spawn_worker(redis_url, extra=("--queue", "billing"))
        assert stub.result(timeout=30) == 42
        assert stub.blocked() is None
    finally:
        stop(default)
        if billing is not None:
            stop(billing)


def test_describe_tells_whether_the_worker_of_a_running_attempt_is_alive(
    redis_url: str, store: RedisStore
) -> None:
    worker = spawn_worker(redis_url, app="apps.recovery", extra=("--claim-idle", "60"))
    try:
        stub = WorkflowStub.make(OneRecoveringActivity, store=store).start("resumes", "where")
        wait_for(lambda: store.redis.lrange("test:recovery:where", 0, -1), timeout=30)
        step = stub.describe().pending[0]
        assert step["kind"] == "activity" and step["attempt"] == 1 and step["worker_alive"] is True
        assert step["worker"].split(":")[1] == str(worker.pid) and step["started"] > 0
        assert f"attempt 1: running on {step['worker']}" in _cli("describe", stub.id)
        assert step["heartbeat_age_s"] is not None and step["heartbeat_age_s"] < 4
        assert "last heartbeat" not in step["state"]
        worker.kill()  # SIGKILL: its registry entry lapses, its task stays pending for --claim-idle
        worker.wait(10)

        # Until the entry lapses (10 s), the attempt still reads as running, but its worker's
        # silence is named once it has missed two heartbeats.
        # (The window is 6 s wide and describe is polled all along, so it is not missed.)
        def silent_or_gone() -> dict | None:
            step = stub.describe().pending[0]
            age = step["heartbeat_age_s"]
            return step if age is None or age > 4 else None

        silent = wait_for(silent_or_gone, timeout=30)
        assert silent["worker_alive"] is True, silent
        assert "but that worker's last heartbeat was" in silent["state"]
        assert "it may have died or be stalled" in silent["state"]
        gone = wait_for(lambda: (s := stub.describe().pending[0])["worker_alive"] is False and s, timeout=30)
        assert gone["worker"] == step["worker"] and gone["attempt"] == 1
        text = " ".join(_cli("describe", stub.id).split())
        assert "which is gone (stopped or died)" in text
        # And with no worker left on its queue at all, the run is reported as blocked too.
        assert (
            stub.blocked() is not None and "no live worker serves queue 'default'" in stub.blocked().message
        )
    finally:
        stop(worker)


def test_a_run_of_a_type_no_live_worker_defines_says_so_at_once(redis_url: str, store: RedisStore) -> None:
    """Not only after the unknown-type grace parks its task: the live workers of its queue say
    what they define, so every view names the missing type right away."""
    worker = spawn_worker(redis_url)
    try:
        wait_for(store.live_workers, timeout=30)
        stub = WorkflowStub.make("NoSuchFlow", store=store).start()
        reason = stub.blocked()
        assert reason is not None and reason.kind == "no_live_worker", reason
        assert reason.message.startswith(
            "no live worker of queue 'default' defines workflow type 'NoSuchFlow' (they define "
        ), reason.message
        assert "'AddsAtOnce'" in reason.message and "start a worker whose --app defines it" in reason.message
        assert "defines workflow type 'NoSuchFlow'" in _cli("status", stub.id)
        # A run of a type the worker defines is not reported.
        ok = WorkflowStub.make(Sequence, store=store).start(2)
        assert ok.result(timeout=30) is not None and ok.blocked() is None
    finally:
        stop(worker)


class WaitsOnAGhost(Workflow):
    """Waits on a child whose type no worker defines."""

    def handle(self) -> str:
        return child("NoSuchChildType")


def test_a_parent_waiting_on_a_blocked_child_says_so(store: RedisStore) -> None:
    """The child is blocked (its task parked); the parent would read as plainly 'running'."""
    with WorkerThread(Worker(store, concurrency=2, grace=5, block_ms=100, unknown_type_grace=0)):
        parent = WorkflowStub.make(WaitsOnAGhost, store=store).start()
        reason = wait_for(parent.blocked, timeout=30)
        child_id = f"{parent.id}/1"
        assert reason.kind == "unknown_type", reason
        assert reason.message.startswith(f"waits on child {child_id!r}, which is blocked: "), reason.message
        assert "NoSuchChildType" in reason.message
        assert f"(blocked: waits on child {child_id!r}" in _cli("status", parent.id)
        parent.terminate("test over")


def test_describe_shows_a_pending_childs_workflow_id_and_state(store: RedisStore) -> None:
    """The pending steps of a parent named the child's type only: not which workflow it is, nor
    whether it runs, waits or already closed."""
    with WorkerThread(Worker(store, concurrency=2, grace=5, block_ms=100)):
        parent = WorkflowStub.make(ParentOfWaiting, store=store).start()
        kid = "ParentOfWaiting-kid"  # the id the parent gives its child
        wait_for(
            lambda: [s.get("child_status") for s in parent.describe().pending] == ["suspended"], timeout=30
        )
        (step,) = parent.describe().pending
        assert step["kind"] == "child" and step["workflow_id"] == kid, step
        assert step["state"] == f"child {kid}: suspended", step
        table = _cli("describe", parent.id)
        assert "ChildWaits" in table and f"child {kid}: suspended" in table, table
        assert json.loads(_cli("describe", parent.id, "--json"))["pending"][0]["child_status"] == "suspended"
        WorkflowStub.load(kid, store=store).terminate("test over")
        assert parent.result(timeout=30) == {"status": "terminated"}


@pytest.mark.parametrize(
    ("status", "state"),
    [
        (None, "child k: not started yet (its start is on its way)"),
        ("running", "child k: running"),
        ("failed", "child k: failed (its outcome reaches this run with its next decision)"),
    ],
)
def test_a_child_steps_state_in_words(status: str | None, state: str) -> None:
    pending = [{"kind": "child", "id": "1", "name": "Ship", "workflow_id": "k"}, {"kind": "timer", "id": "2"}]
    child_step, timer = with_children(pending, {"k": status})
    assert child_step == {**pending[0], "child_status": status, "state": state}
    assert timer == pending[1]


def test_a_closed_parents_child_is_said_without_promising_it_an_outcome() -> None:
    """A terminated parent's describe said its terminated child's outcome "reaches this run with
    its next decision": a closed run decides no more."""
    pending = [{"kind": "child", "id": "1", "name": "Ship", "workflow_id": "k"}]
    [step] = with_children(pending, {"k": "terminated"}, parent_closed=True)
    assert step["state"] == "child k: terminated"


def test_an_activity_queued_behind_busy_threads_says_what_holds_them(
    redis_url: str, store: RedisStore, tmp_path
) -> None:
    """It said only "waiting for a worker (backlog 1)" beside a live worker with a thread, and
    `durable workers` showed no busy thread: nothing said the one thread ran a long activity."""
    worker = spawn_worker(redis_url, extra=("--queue", "busyq", "--concurrency", "1"))
    try:
        slow = WorkflowStub.make(SlowSteps, store=store, queue="busyq").start(str(tmp_path / "s.log"), 1, 6)
        wait_for(lambda: (tmp_path / "s.log").exists(), timeout=30)
        queued = WorkflowStub.make(Sequence, store=store, queue="busyq").start(2)

        def status_if_busy() -> str | None:
            line = _cli("status", queued.id)
            return line if "are busy" in line else None

        said = wait_for(status_if_busy, timeout=2 * HEARTBEAT_S + 5)
        assert (
            "activity add (1) queued on 'busyq': all 1 activity thread(s) of its workers are busy (" in said
        )
        assert f"Slow of workflow {slow.id} for " in said and "(no timeout)" in said, said
        assert "1/1 threads busy" in _cli("workers")
        assert slow.result(timeout=30) == ["s0", "end"] and queued.result(timeout=30) == 1
        assert "are busy" not in _cli("status", queued.id)
    finally:
        stop(worker)


def test_an_activity_a_stopping_worker_finishes_is_not_called_blocked(
    redis_url: str, store: RedisStore, tmp_path
) -> None:
    """Its worker, the only one of the activity's queue, stops gracefully and finishes it: the
    run read "blocked: no live worker serves queue 'billing', where activity ... waits" for the
    whole grace, though it completed by itself."""
    default = spawn_worker(redis_url)
    billing = spawn_worker(redis_url, extra=("--queue", "billing", "--grace", "60"))
    try:
        log = tmp_path / "b.log"
        stub = WorkflowStub.make(SlowOnBilling, store=store).start(str(log), 8)
        wait_for(log.exists, timeout=30)
        billing.send_signal(signal.SIGTERM)
        wait_for(lambda: any(w.stopping for w in store.live_workers()), timeout=2 * HEARTBEAT_S + 5)
        time.sleep(HEARTBEAT_S + 0.5)  # its entry says it is stopping, and what it runs
        assert stub.blocked() is None, stub.blocked()
        assert "blocked" not in _cli("status", stub.id)
        (step,) = json.loads(_cli("describe", stub.id, "--json"))["pending"]
        assert "(that worker is stopping: it finishes this attempt first" in step["state"], step
        assert stub.result(timeout=30) == "billed"
        # Once gone, an activity queued there is blocked as before.
        billing.wait(30)
        again = WorkflowStub.make(PaysOnBilling, store=store).start(1)
        assert wait_for(again.blocked, timeout=30).kind == "no_live_worker"
        again.terminate()
    finally:
        stop(billing)
        stop(default)


def test_a_draining_worker_serves_the_activities_of_its_queues() -> None:
    """A draining worker starts no new run but runs activities: a run whose activity waits on a
    queue only such a worker serves read "blocked: no live worker serves queue 'billing'"."""
    from durable.store.workers import no_worker_reason

    record = {
        "status": "running",
        "queue": "default",
        "workflow_id": "w-1",
        "snapshot": {"pending": [{"kind": "activity", "id": "1", "name": "charge", "queue": "billing"}]},
    }
    deciding = WorkerInfo(name="d", queues=("default",))
    draining = WorkerInfo(name="b", build="v1", queues=("billing",), draining=1)
    assert no_worker_reason(record, [deciding, draining]) is None
    stopping = WorkerInfo(name="b", build="v1", queues=("billing",), stopping=1)
    said = no_worker_reason(record, [deciding, stopping])
    assert said is not None and said.startswith("no live worker serves queue 'billing'"), said


def test_a_handed_back_task_is_said_by_the_build_that_takes_its_runs(store: RedisStore) -> None:
    """A worker of the queue's current build lacks the type; one of an older build has it but
    starts no new run: the words guessed "a newer release of durable decided it?" (a re-check)."""
    from durable.store.workers import WorkerInfo  # noqa: PLC0415

    stub = WorkflowStub.make(Sequence, store=store).start(1)  # no worker: its first event only
    assert store.claim_current_build("default", "", "b1")
    live = [
        WorkerInfo("w-b1", build="b1", queues=("default",), workflows=("Other",), complete=True),
        WorkerInfo("w-b0", build="b0", queues=("default",), workflows=("Sequence",), complete=True),
    ]
    ref = store.ref(stub.id)
    said = _handed_back(store, ref, store.run_record(ref), live, store.server_time_ms() - 3_000, 60_000)
    assert said.startswith(
        "no live worker of queue 'default' of build 'b1' (it takes the queue's new runs) defines workflow "
        "type 'Sequence', for 3 s"
    ), said
    assert "after 60 s (--unknown-type-grace)" in said and "newer release" not in said
    stub.terminate("test over")
