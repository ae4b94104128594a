"""A history stream that is not whole is said, not replayed as if it were.

A tester deleted entries of a run's history stream (XDEL: by hand, or a bug): with a gap the
run went on and completed, `durable history` showing the hole without a word; with its last
entry gone the worker read a newer history than its own ("another decider won") on every
delivery, and after five the run was blamed on its code. A commit script that failed half-way
(a key of the wrong type) left entries past the record's count, likewise. Each is now a
blocked run (``history_corrupt``) naming what is wrong, and the views refuse to show a history
with a gap.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from apps.basic import SlowSteps, Waiter
from apps.child_blocks import ParentOfNamed
from click.testing import CliRunner
from waiting import wait_for

from durable import DurableError, HistoryCorrupt, WorkflowClosed, WorkflowStub
from durable.store.redis_store import RedisStore
from durable.testing import TestEnvironment
from workers import broken_streams, run_cache
from workers.cli import cli
from workers.worker import Worker, WorkerThread


def _suspended(store: RedisStore, wid: str) -> tuple[WorkflowStub, str, int]:
    """A Waiter run waiting for its signal, and no worker holding it in a cache."""
    with TestEnvironment(store=store) as env:
        stub = env.start(Waiter, 0.01, id=wid)
        wait_for(lambda: stub.history()[-1].type == "SignalWaitStarted", timeout=20)
    key = store.keys.history(stub._ref().partition, stub.run_id)
    return stub, key, len(stub.history())


def _blocked_after_a_signal(store: RedisStore, stub: WorkflowStub) -> str:
    stub.signal("go", "now")
    with TestEnvironment(store=store):
        reason = wait_for(stub.blocked, timeout=20)
    assert reason.kind == "history_corrupt", reason
    return reason.message


@pytest.mark.parametrize(
    ("case", "tamper", "said"),
    [
        (
            "tail",
            lambda r, key, n: r.xdel(key, f"0-{n}"),
            "holds {m} events but the run record counts {n}: its last entries were deleted",
        ),
        ("gap", lambda r, key, n: r.xdel(key, "0-2"), "its history skips from seq 1 to seq 3"),
        (
            "past",
            lambda r, key, n: r.xadd(
                key, {"e": r.xrange(key, f"0-{n}", f"0-{n}")[0][1][b"e"]}, id=f"0-{n + 1}"
            ),
            "holds {p} events but the run record counts {n}: entries past it were written by a commit that failed half-way",
        ),
    ],
)
def test_a_history_that_is_not_whole_blocks_its_run_naming_it(
    store: RedisStore, case: str, tamper: Callable[..., object], said: str
) -> None:
    stub, key, n = _suspended(store, f"holes-{case}")
    tamper(store.redis, key, n)
    message = _blocked_after_a_signal(store, stub)
    assert said.format(n=n, m=n - 1, p=n + 1) in message, message
    assert "restore Redis from a backup, or `durable terminate` the run" in message
    if case == "gap":
        with pytest.raises(HistoryCorrupt, match="skips from seq 1 to seq 3"):
            stub.history()
    stub.terminate("its history was tampered with")


def test_a_run_whose_history_key_holds_a_string_is_blocked_and_the_worker_serves_on(
    store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    # One key of the wrong kind (made by hand, another program sharing the database) failed the
    # whole batch's load with WRONGTYPE, naming no key: the worker exited, and every worker that
    # took the task after it, every run of the queue stopped.
    stub, key, _ = _suspended(store, "wrongtype-history")
    store.redis.delete(key)
    store.redis.set(key, "not a stream")
    stub.signal("go", "now")
    with TestEnvironment(store=store) as env:
        reason = wait_for(stub.blocked, timeout=20)
        assert reason.kind == "history_corrupt", reason
        assert f"its keys hold the wrong kind of value: {key} is a string, not a stream" in reason.message
        # The run's own state: put back, not deleted (deleted as once advised, the run was gone).
        assert "put the key back as it was" in reason.message, reason.message
        other = env.start(Waiter, 0.01, id="wrongtype-other")
        other.signal("go", "fine")
        assert other.result(timeout=20) == "fine"
    store.redis.delete(key)
    stub.terminate("its history key was overwritten")


def test_a_task_that_cannot_be_parked_stays_pending_and_the_worker_serves_on(
    store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    # Parking is how every bad task is set aside; with the dead-letter stream of the wrong kind
    # it raised, and the worker exited on every task it could not run.
    stub, _, _ = _suspended(store, "wrongtype-dead")
    p = stub._ref().partition
    store.redis.set(store.keys.dead(p), "not a stream")
    stream = store.keys.workflow_tasks(p, "default")
    store.redis.xadd(stream, {"run": "no-such-run"})
    with TestEnvironment(store=store) as env:
        wait_for(
            lambda: any("could not park workflow task" in r.getMessage() for r in caplog.records), timeout=20
        )
        other = env.start(Waiter, 0.01, id="wrongtype-dead-other")
        other.signal("go", "fine")
        assert other.result(timeout=20) == "fine"
    [line] = {r.getMessage() for r in caplog.records if "could not park" in r.getMessage()}
    assert f"{store.keys.dead(p)} is a string, not a stream" in line and "stays pending" in line, line
    store.redis.delete(store.keys.dead(p))
    stub.terminate("test over")


def test_a_task_stream_of_the_wrong_kind_is_set_aside_and_a_start_into_it_writes_nothing(
    store: RedisStore, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One read takes all of a worker's streams: one made a string failed it, naming no key, and
    # the worker exited (every worker started after it too). A start into it wrote its run
    # record, then failed at the task: a run waiting for ever for a task that did not exist.
    monkeypatch.setattr(broken_streams, "RECHECK_S", 0.5)
    k = store.keys
    bad = k.workflow_tasks(0, "default")
    store.redis.delete(bad)
    store.redis.set(bad, "not a stream")
    in_bad = next(f"kinds-{i}" for i in range(100) if k.partition(f"kinds-{i}") == 0)
    with pytest.raises(
        DurableError, match=rf"Redis key {re.escape(bad)} is a string, not a stream.*nothing was written"
    ):
        WorkflowStub.make(Waiter, id=in_bad, store=store).start(0.01)
    assert not store.redis.exists(k.instance(0, in_bad))
    elsewhere = next(f"kinds-{i}" for i in range(100) if k.partition(f"kinds-{i}") != 0)
    with TestEnvironment(store=store) as env:
        fine = env.start(Waiter, 0.01, id=elsewhere)
        fine.signal("go", "served")
        assert fine.result(timeout=20) == "served"
        said = [r.getMessage() for r in caplog.records if f"task stream {bad} is a string" in r.getMessage()]
        assert len(said) == 1 and "the other streams are read meanwhile" in said[0], said
        store.redis.delete(bad)  # the worker makes it again, and reads it
        late = env.start(Waiter, 0.01, id=in_bad)
        late.signal("go", "read again")
        assert late.result(timeout=20) == "read again"


def test_timers_of_the_wrong_kind_block_their_run_by_name_and_the_other_partitions_fire(
    store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    # A partition's timers made a string: the scheduler's pass failed for every partition, a
    # traceback a second, and a run there sat "not decided yet" while its commit failed half-way.
    k = store.keys
    timers = k.timers(0)
    there = next(f"timers-{i}" for i in range(100) if k.partition(f"timers-{i}") == 0)
    elsewhere = next(f"timers-{i}" for i in range(100) if k.partition(f"timers-{i}") != 0)
    stuck = WorkflowStub.make(Waiter, id=there, store=store).start(0.05)  # (a start would be refused now)
    store.redis.delete(timers)
    store.redis.set(timers, "not a zset")
    with TestEnvironment(store=store) as env:
        fine = env.start(Waiter, 0.05, id=elsewhere)
        fine.signal("go", "fired")
        assert fine.result(timeout=20) == "fired"
        reason = wait_for(stuck.blocked, timeout=20)
        assert reason.kind == "history_corrupt"
        assert f"its keys hold the wrong kind of value: {timers} is a string, not a zset" in reason.message
        said = [
            r.getMessage() for r in caplog.records if "timers of partition 0 cannot fire" in r.getMessage()
        ]
        assert len(said) == 1 and f"{timers} is a string, not a zset" in said[0], said
    store.redis.delete(timers)
    stuck.terminate("its partition's timers were overwritten")


def test_start_arguments_that_do_not_decode_are_a_corrupt_history_not_an_input_to_drop(
    store: RedisStore,
) -> None:
    # A raw msgpack ExtType goes through the encoder (msgpack packs it itself) and no worker can
    # read it back. The run was blocked "parked_input", whose remedy (`durable repair
    # --drop-input`) did nothing: the value is in WorkflowStarted, not an input.
    stub = WorkflowStub.make(Waiter, id="ext-args", store=store).start(msgpack.ExtType(42, b"hello"))
    with TestEnvironment(store=store):
        reason = wait_for(stub.blocked, timeout=20)
    assert reason.kind == "history_corrupt", reason
    assert (
        "seq 1: a recorded payload does not decode: cannot decode: unknown msgpack extension type 42"
        in reason.message
    )
    stub.terminate("its arguments do not decode")


def test_a_cached_run_whose_record_becomes_a_string_does_not_stop_the_worker(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's pass asks whether its cached runs are still open: a record made a string
    # failed that read (WRONGTYPE) and the worker exited, with no task of the run in flight.
    monkeypatch.setattr(run_cache, "CLOSED_CHECK_S", 0.2)
    with TestEnvironment(store=store) as env:
        cached = env.start(Waiter, 0.01, id="record-string")
        wait_for(lambda: cached.history()[-1].type == "SignalWaitStarted", timeout=20)
        record = store.keys.run(cached._ref().partition, cached.run_id)
        store.redis.delete(record)
        store.redis.set(record, "not a hash")
        time.sleep(1.0)  # several passes of the cache's check
        other = env.start(Waiter, 0.01, id="record-string-other")
        other.signal("go", "still served")
        assert other.result(timeout=20) == "still served"
    store.redis.delete(record)


def test_client_calls_on_a_run_with_a_key_of_another_kind_name_the_key(store: RedisStore) -> None:
    # signal() and terminate() raised a bare WRONGTYPE naming no key; terminate, the operator's
    # way out, could not close the run either, and said nothing of what to delete.
    stub = WorkflowStub.make(Waiter, id="wrongtype-calls", store=store).start(60)
    p = stub._ref().partition
    inbox, history = store.keys.inbox(p, stub.run_id), store.keys.history(p, stub.run_id)
    store.redis.set(inbox, "not a list")
    with pytest.raises(
        DurableError,
        match=rf"signal\('go'\) of workflow 'wrongtype-calls' failed: {re.escape(inbox)} is a string, not a list",
    ):
        stub.signal("go", "x")
    store.redis.delete(inbox, history)
    store.redis.set(history, "not a stream")
    with pytest.raises(
        DurableError,
        # The run's own state: put back, not made again (deleted as the message said, the run was lost).
        match=rf"terminate\(\) of workflow 'wrongtype-calls' failed: {re.escape(history)} is a string, not a stream.*"
        "put the key back as it was .* if that is lost, the run is too: delete the key, and `durable start` the "
        "workflow id again with --id-conflict-policy terminate_existing",
    ):
        stub.terminate("cleanup")
    assert stub.status() != "terminated"  # nothing was written
    store.redis.delete(history)
    stub.terminate("cleanup")
    assert stub.status() == "terminated"


def test_a_run_record_of_another_kind_is_a_row_of_the_list_not_its_end(store: RedisStore) -> None:
    # One record made a string failed `durable list` and GET /api/v1/workflows for everyone.
    bad = WorkflowStub.make(Waiter, id="list-bad-record", store=store).start(60)
    WorkflowStub.make(Waiter, id="list-good-record", store=store).start(60)
    record = store.keys.run(bad._ref().partition, bad.run_id)
    store.redis.delete(record)
    store.redis.set(record, "not a hash")
    rows = {row["run_id"]: row for row in store.list_runs_page(limit=50).runs}
    assert rows[bad.run_id]["blocked_kind"] == "history_corrupt"
    assert f"its run record {record} is not a hash" in rows[bad.run_id]["blocked"]
    assert any(row.get("workflow_id") == "list-good-record" for row in rows.values())
    listed = CliRunner().invoke(cli, ["list", "--limit", "50"])
    assert listed.exit_code == 0 and "list-good-record" in listed.output, listed.output
    store.redis.delete(record)


def _scripts_run(store: RedisStore) -> int:
    stats = store.redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval"))


@pytest.mark.parametrize("gap", [0.0, 0.3])
def test_a_result_a_key_of_another_kind_refuses_is_kept_and_recorded_once_the_key_is_mended(
    store: RedisStore, caplog: pytest.LogCaptureFixture, tmp_path: Any, gap: float
) -> None:
    # The completion script failed half-way on the run's activities hash made a list: the worker
    # exited ("could not record ... (Redis unavailable?)") and the task was acked and lost. The
    # worker keeps the result, says why, and serves the other runs. The mend (the list deleted,
    # then the hash renamed back, ``gap`` s apart) leaves the key absent a moment: the kept result
    # tried then was discarded as "no longer pending", and the run waited on its activity for
    # ever (7 runs in 10 with no gap). Kept results were also retried in a busy loop.
    with TestEnvironment(store=store) as env:
        stub = env.start(SlowSteps, str(tmp_path / "log"), 1, 1.5, id="wrongtype-acts")
        wait_for(lambda: (tmp_path / "log").exists(), timeout=20)  # the attempt began
        acts = store.keys.activities(stub._ref().partition, stub.run_id)
        store.redis.rename(acts, acts + ".aside")
        store.redis.rpush(acts, "not a hash")
        said = wait_for(
            lambda: [r.getMessage() for r in caplog.records if "cannot be recorded" in r.getMessage()],
            timeout=20,
        )
        assert f"{acts} is a list, not a hash" in said[0] and "kept and tried again" in said[0], said
        scripts = _scripts_run(store)
        time.sleep(1.0)
        assert _scripts_run(store) - scripts < 500  # tried again a pass at a time (was 5,300 a second)
        other = env.start(Waiter, 0.01, id="wrongtype-acts-other")  # the worker goes on
        other.signal("go", "served")
        assert other.result(timeout=20) == "served"
        store.redis.delete(acts)
        time.sleep(gap)
        store.redis.rename(acts + ".aside", acts)
        assert stub.result(timeout=30) == ["s0", "end"]


def test_a_due_timer_whose_run_has_a_key_of_another_kind_waits_for_the_fix_and_fires(
    store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    # The timer's member was removed, then its RPUSH to the run's inbox (a string) failed: the
    # timer was lost, and after the fix status said "overdue: no live worker's scheduler fired it".
    with TestEnvironment(store=store) as env:
        stub = env.start(Waiter, 1.5, id="wrongtype-timer")
        wait_for(lambda: stub.history()[-1].type == "TimerStarted", timeout=20)
        inbox = store.keys.inbox(stub._ref().partition, stub.run_id)
        store.redis.set(inbox, "not a list")
        said = wait_for(
            lambda: [r.getMessage() for r in caplog.records if "cannot fire" in r.getMessage()], timeout=20
        )
        assert f"{inbox} is a string, not a list" in said[0] and "stays due" in said[0], said
        assert store.redis.zcard(store.keys.timers(stub._ref().partition)) >= 1  # still there
        store.redis.delete(inbox)
        wait_for(lambda: "TimerFired" in [e.type for e in stub.history()], timeout=20)
        stub.signal("go", "fired after the fix")
        assert stub.result(timeout=20) == "fired after the fix"


def test_a_worker_starts_and_serves_beside_a_sticky_set_of_another_kind(
    store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    # The lease's SADD to a partition's set of sticky hosts failed: no worker could start (a crash
    # loop under --processes), and those running logged a traceback every second.
    sticky = store.keys.sticky_hosts(2)
    store.redis.hset(sticky, "a", "b")
    try:
        with TestEnvironment(store=store) as env:
            run = env.start(Waiter, 0.01, id="sticky-kind")
            run.signal("go", "served")
            assert run.result(timeout=20) == "served"
            time.sleep(2.5)  # a few scheduler passes
        said = [r.getMessage() for r in caplog.records if f"{sticky} is not a set" in r.getMessage()]
        assert len(said) == 1, said
        tracebacks = [r for r in caplog.records if "scheduler pass failed" in r.getMessage()]
        assert len(tracebacks) <= 1, [r.getMessage() for r in tracebacks]
    finally:
        store.redis.delete(sticky)


def test_the_entries_a_half_written_commit_left_are_moved_aside_and_the_run_goes_on(
    store: RedisStore,
) -> None:
    # A commit that met a key of the wrong kind after writing its history left entries past the
    # record's count: the run was blocked for good, `durable terminate` its only way out.
    stub, key, n = _suspended(store, "uncommitted")
    stub.signal("go", "taken")
    inbox = store.keys.inbox(stub._ref().partition, stub.run_id)
    consumed = store.redis.lpop(inbox)  # as the failed commit consumed it ...
    store.redis.xadd(key, {"e": consumed}, id=f"0-{n + 1}")  # ... and wrote it, past seq n
    with TestEnvironment(store=store):
        reason = wait_for(stub.blocked, timeout=20)
        assert "--drop-uncommitted" in reason.message, reason
        moved = CliRunner().invoke(cli, ["repair", "uncommitted", "--drop-uncommitted"])
        assert moved.exit_code == 0 and "1 uncommitted history entries moved to its log" in moved.output, (
            moved.output
        )
        assert stub.result(timeout=20) == "taken"  # the input went back and was decided
    dropped = [e for e in store.log_entries(stub._ref()) if e.get("kind") == "dropped"]
    assert any(
        "--drop-uncommitted" in str(e.get("reason")) and "put back in the inbox" in str(e.get("reason"))
        for e in dropped
    )


def test_terminate_of_a_closed_run_says_it_is_closed_whatever_its_other_keys_hold(store: RedisStore) -> None:
    stub = WorkflowStub.make(Waiter, id="closed-then-kind", store=store).start(60)
    stub.terminate("first")
    acts = store.keys.activities(stub._ref().partition, stub.run_id)
    store.redis.set(acts, "not a hash")
    with pytest.raises(WorkflowClosed, match="is already terminated"):
        stub.terminate("again")
    store.redis.delete(acts)


def test_a_child_start_a_key_of_another_kind_refuses_waits_in_the_outbox_and_starts_once_mended(
    store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    # The start refused for the child's partition's timers made a string failed the parent for
    # good (ChildWorkflowFailed: an operator-fixable state of Redis, no business failure).
    k = store.keys
    parent_id = "outbox-kind-p"
    child_id = next(
        f"outbox-kind-c{i}" for i in range(100) if k.partition(f"outbox-kind-c{i}") != k.partition(parent_id)
    )
    timers = k.timers(k.partition(child_id))
    store.redis.set(timers, "not a zset")
    try:
        with WorkerThread(Worker(store, concurrency=2, grace=5, claim_idle_ms=1000, block_ms=100)):
            parent = WorkflowStub.make(ParentOfNamed, parent_id, store=store).start(child_id)
            wait_for(
                lambda: any(f"{timers} is a string" in r.getMessage() for r in caplog.records), timeout=20
            )
            assert parent.status() in ("running", "pending", "suspended"), parent.describe()
            store.redis.delete(timers)
            wait_for(lambda: store.instance_statuses([child_id])[0] == "suspended", timeout=30)
            WorkflowStub.load(child_id, store=store).signal("go", "started after the fix")
            assert parent.result(timeout=30) == "started after the fix"
    finally:
        store.redis.delete(timers)
