"""Build-id pinning (Flow's runtime build id): a rolling deploy with old and new workers side by side."""

from __future__ import annotations

import time

from apps.basic import Looper, Waiter
from waiting import wait_for

from durable import WorkflowStub
from durable.store.redis_store import RedisStore
from workers.worker import Worker, WorkerThread


def versioned(store: RedisStore, build: str, *compatible: str, promote: bool = False) -> WorkerThread:
    return WorkerThread(
        Worker(store, build_id=build, compatible=compatible, grace=5, block_ms=100, promote=promote)
    )


def test_rolling_deploy_old_runs_stay_on_old_code(store: RedisStore) -> None:
    old = versioned(store, "v1")
    old.__enter__()
    old_running = True
    try:
        first = WorkflowStub.make(Waiter).start(0.01)
        wait_for(lambda: first.snapshot()["build_id"] == "v1" and first.status() == "suspended")
        with versioned(store, "v2", promote=True):  # the operator moves new runs to v2
            time.sleep(1.2)  # the old worker notices it is no longer the current build
            second = WorkflowStub.make(Waiter).start(0.01)
            wait_for(lambda: second.snapshot()["build_id"] == "v2" and second.status() == "suspended")
            old.__exit__(None, None, None)  # the old deployment goes away
            old_running = False
            first.signal("go", "old")
            second.signal("go", "new")
            assert second.result(timeout=10) == "new"
            time.sleep(0.5)
            assert first.status() == "suspended", "a v2 worker decided a run pinned to v1"
        # A build that declares v1 compatible (it replays v1 histories) takes the old run.
        with versioned(store, "v3", "v1"):
            assert first.result(timeout=10) == "old"
    finally:
        if old_running:
            old.__exit__(None, None, None)


def test_continue_as_new_keeps_the_build_id(store: RedisStore) -> None:
    with versioned(store, "v7"):
        stub = WorkflowStub.make(Looper, id="pinned-loop").start(2, 0)
        assert stub.result(timeout=15) == 3
        assert stub.snapshot()["build_id"] == "v7"
        assert stub.history()[0].data["build_id"] == "v7"
        assert stub.history()[0].data["options"]["continued_from"]


def test_unversioned_workers_pin_nothing(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(Waiter).start(0.01)
    stub.signal("go", 1)
    assert stub.result(timeout=10) == 1
    assert stub.snapshot()["build_id"] is None
