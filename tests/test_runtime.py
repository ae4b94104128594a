"""End to end through the public API: WorkflowStub + a real worker + real Redis."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import pytest
from apps.basic import (
    EVERYTHING_RESULT,
    Boom,
    Everything,
    Failing,
    Hooked,
    Looper,
    Parent,
    Saga,
    Sequence,
    Waiter,
)
from scenarios import assert_history_sound
from waiting import wait_for

from durable import (
    ConfigurationError,
    SerializationError,
    WorkflowAlreadyStarted,
    WorkflowClosed,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowStub,
)
from durable.store.redis_store import RedisStore


def test_every_call_end_to_end(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(Everything, id="everything-1").start(10)
    assert stub.id == "everything-1" and stub.run_id
    wait_for(lambda: stub.query("progress")["stage"] == "signal")
    assert stub.status() == "suspended"
    stub.signal("approve", "alice")
    wait_for(lambda: stub.query("progress")["stage"] == "bumps")
    stub.signal("bump", 1)
    stub.signal("bump", 1)
    result = stub.result(timeout=15)
    assert result == EVERYTHING_RESULT
    assert stub.status() == "completed"
    assert stub.query("progress") == {"stage": "done", "bumps": 2}
    history = stub.history()
    assert history[0].type == "WorkflowStarted" and history[-1].type == "WorkflowCompleted"
    types = {e.type for e in history}
    assert {
        "ActivityScheduled",
        "TimerStarted",
        "TimerFired",
        "SignalWaitStarted",
        "SignalReceived",
        "SideEffectRecorded",
        "VersionMarker",
        "ChildStarted",
        "ChildCompleted",
    } <= types
    assert all(isinstance(e.ts, int) for e in history)
    assert_history_sound(stub)
    snap = stub.snapshot()
    assert snap["status"] == "completed" and snap["run_id"] == stub.run_id


def test_load_and_status_of_unknown_id(worker) -> None:
    with pytest.raises(WorkflowNotFound, match="no-such"):
        WorkflowStub.load("no-such")
    WorkflowStub.make(Sequence, id="seq-1").start(3)
    assert WorkflowStub.load("seq-1").result(timeout=10) == 3


def test_second_start_of_open_id_is_refused(store) -> None:
    WorkflowStub.make(Waiter, id="dup").start(60)
    with pytest.raises(WorkflowAlreadyStarted, match="dup"):
        WorkflowStub.make(Waiter, id="dup").start(60)


def test_bad_arguments_fail_before_anything_is_written(store) -> None:
    with pytest.raises(SerializationError, match=r"args\[1\]"):
        WorkflowStub.make(Sequence, id="bad-args").start(1, object())
    with pytest.raises(WorkflowNotFound):
        WorkflowStub.load("bad-args")
    with pytest.raises(ConfigurationError, match="workflow id"):
        WorkflowStub.make(Sequence, id="has space")
    with pytest.raises(ConfigurationError):
        WorkflowStub.make(object)  # type: ignore[arg-type]


def test_activity_retries_then_succeeds(worker, tmp_path: Path) -> None:
    log = tmp_path / "flaky.log"
    stub = WorkflowStub.make(Failing).start(str(log), 2)
    assert stub.result(timeout=10) == 3
    assert log.read_text().split("\n")[:3] == ["attempt 1", "attempt 2", "attempt 3"]
    attempts = stub.describe()["attempts"]
    assert [a["outcome"] for a in attempts] == ["retry", "retry", "completed"]
    assert "flaky failure 1" in attempts[0]["record"]["error"]


def test_activity_failure_reaches_workflow_with_cause(worker, tmp_path: Path) -> None:
    stub = WorkflowStub.make(Failing).start(str(tmp_path / "f.log"), 10)
    assert stub.result(timeout=10) == {"failed": "ValueError", "attempts": 3, "message": "flaky failure 3"}


def test_workflow_exception_fails_run(worker) -> None:
    stub = WorkflowStub.make(Boom).start()
    with pytest.raises(WorkflowFailed) as info:
        stub.result(timeout=10)
    assert info.value.status == "failed"
    assert isinstance(info.value.cause, KeyError)
    assert stub.status() == "failed"


def test_cancel_runs_compensation_in_reverse(worker, tmp_path: Path) -> None:
    path = tmp_path / "saga.log"
    stub = WorkflowStub.make(Saga).start(str(path))
    wait_for(lambda: path.exists() and path.read_text().count("\n") == 2)
    wait_for(lambda: stub.status() == "suspended")
    stub.cancel("customer changed mind")
    with pytest.raises(WorkflowFailed) as info:
        stub.result(timeout=10)
    assert info.value.status == "cancelled"
    assert path.read_text().split("\n")[:4] == ["reserve", "charge", "undo charge", "undo reserve"]
    assert stub.history()[-1].type == "WorkflowCancelled"


def test_terminate_closes_now_and_refuses_signals(worker) -> None:
    stub = WorkflowStub.make(Waiter).start(60)
    wait_for(lambda: stub.status() == "suspended")
    stub.terminate("operator")
    assert stub.status() == "terminated"
    with pytest.raises(WorkflowFailed) as info:
        stub.result(timeout=5)
    assert info.value.status == "terminated"
    with pytest.raises(WorkflowClosed, match="terminated"):
        stub.signal("go", 1)
    assert stub.history()[-1].type == "WorkflowTerminated"


def test_signal_to_unknown_workflow(store) -> None:
    with pytest.raises(WorkflowNotFound, match="ghost"):
        WorkflowStub.make(Waiter, id="ghost").signal("go")


def test_timer_then_signal(worker) -> None:
    stub = WorkflowStub.make(Waiter).start(0.2)
    stub.signal("go", "early")  # buffered until await_signal
    assert stub.result(timeout=10) == "early"


def test_continue_as_new_result_follows_runs(worker) -> None:
    stub = WorkflowStub.make(Looper, id="loop").start(3, 0)
    first_run = stub.run_id
    assert stub.result(timeout=15) == 6
    assert stub.run_id != first_run
    assert WorkflowStub.load("loop").status() == "completed"


def test_result_waits_for_the_ids_current_run_when_another_took_the_stubs_place(worker) -> None:
    # A stub is a handle on its workflow id: its result is its id's current run's, also when
    # the run it started has been replaced (the known run is checked in the first look).
    old = WorkflowStub.make(Sequence, id="replaced").start(3)
    assert old.result(timeout=10) == 3
    newer = WorkflowStub.make(Sequence, id="replaced").start(5)
    assert newer.run_id != old.run_id
    assert old.result(timeout=10) == 10
    assert old.run_id == newer.run_id


def test_result_of_a_closed_run_takes_one_round_trip(worker, store: RedisStore, monkeypatch) -> None:
    stub = WorkflowStub.make(Sequence, store=store).start(2)
    assert stub.result(timeout=10) == 1
    trips: list[str] = []  # this thread's round trips (the worker's threads share the store)
    me = threading.get_ident()

    def counted(name: str, call: Any) -> Any:
        def spy(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == me:
                trips.append(name or args[0])
            return call(*args, **kwargs)

        return spy

    # Every way the store speaks to Redis: redis-py's pipelines and commands, and the raw wire.
    monkeypatch.setattr(store.redis, "pipeline", counted("pipeline", store.redis.pipeline))
    monkeypatch.setattr(store.redis, "execute_command", counted("", store.redis.execute_command))
    monkeypatch.setattr(store._wire, "_round_trip", counted("wire", store._wire._round_trip))
    assert stub.result(timeout=10) == 1
    assert trips == ["wire"]


def test_hook_resumed_by_token(worker) -> None:
    stub = WorkflowStub.make(Hooked).start()
    token = wait_for(lambda: stub.query("hook_token"))
    WorkflowStub.resume_hook(token, {"paid": True})
    assert stub.result(timeout=10) == {"paid": True}
    from durable import HookError

    with pytest.raises(HookError):
        WorkflowStub.resume_hook(token, {"paid": True})


def test_parallel_children(worker) -> None:
    stub = WorkflowStub.make(Parent).start(3)
    assert stub.result(timeout=15) == [1, 3, 6]


def test_result_timeout(worker) -> None:
    stub = WorkflowStub.make(Waiter).start(60)
    with pytest.raises(TimeoutError):
        stub.result(timeout=0.3)
    for bad in (float("nan"), -1, "5"):
        with pytest.raises(ConfigurationError, match="timeout must be"):
            stub.result(timeout=bad)  # type: ignore[arg-type]


def test_an_infinite_timeout_waits_as_long_as_it_takes(worker) -> None:
    """``math.inf`` reached the thread wait and raised OverflowError."""
    stub = WorkflowStub.make(Parent).start(2)
    assert stub.result(timeout=math.inf) == [1, 3]
