"""The task streams of retired builds go: each deploy with a new build id added one workflow task
stream per partition and queue (``wq:<queue>@<build>``, with its group and the workers'
consumers), and nothing removed them once the build's workers were gone.

A worker's scheduler deletes a retired build's streams that are empty (no live worker serves the
build, and it is not the queue's current build). One holding a task is kept, and a run pinned to
the retired build loses nothing: a task added later recreates its stream, and the next worker of
that build reads it.

Real Redis (the shared test server); real worker processes (``tests/procs.py``), each stopped.
"""

from __future__ import annotations

import json

import pytest
from apps.basic import Waiter
from procs import spawn_worker, stop
from waiting import wait_for

from durable import WorkflowStub
from durable.store.queues import RetiredBuilds
from durable.store.redis_store import RedisStore
from durable.store.workers import WorkerInfo


def build_streams(store: RedisStore, build: str, queue: str = "default") -> list[str]:
    return [store.keys.workflow_tasks(p, queue, build) for p in range(store.keys.partitions)]


def existing(store: RedisStore, streams: list[str]) -> list[str]:
    return [s for s in streams if store.redis.exists(s)]


def served(store: RedisStore) -> set[tuple[str, str]]:
    return {tuple(json.loads(m)) for m in store.redis.smembers(store.keys.served_builds())}


def test_the_rule(store: RedisStore) -> None:
    """Empty streams of a build nobody serves go; the current build's, a live worker's, and a
    stream holding a task stay."""
    for build in ("old", "busy", "current", "live"):
        store.register_worker(WorkerInfo(name=f"w-{build}", queues=("default",), build=build))
        store.unregister_worker(f"w-{build}")
        store.ensure_groups(build_streams(store, build))
    store.promote_build(["default"], "current")
    store.redis.xadd(build_streams(store, "busy")[3], {"body": b"a task"})
    alive = WorkerInfo(name="w-live", queues=("default",), build="live")

    retired = store.drop_retired_builds([alive])

    assert retired.dropped == ["default@old"] and retired.waiting == ["default@busy"]
    assert existing(store, build_streams(store, "old")) == []
    assert existing(store, build_streams(store, "busy")) == [
        build_streams(store, "busy")[3]
    ]  # its empty ones go
    for build in ("current", "live"):
        assert existing(store, build_streams(store, build)) == build_streams(store, build)
    assert ("default", "old") not in served(store)
    assert {("default", "busy"), ("default", "current"), ("default", "live")} <= served(store)
    # The caller's own streams are never deleted, even when its registry entry lapsed.
    keep = build_streams(store, "busy")
    assert store.drop_retired_builds([alive], keep=keep) == RetiredBuilds(dropped=[], waiting=[])
    assert existing(store, keep) == [keep[3]]


@pytest.mark.slow
def test_a_retired_builds_streams_go_and_its_pinned_run_loses_nothing(
    redis_url: str, store: RedisStore
) -> None:
    v1 = spawn_worker(redis_url, extra=("--build-id", "v1"))
    try:
        stub = WorkflowStub.make(Waiter, store=store).start(0.01)
        # Waiting on its signal, past its timer: a timer fired once v1 is gone would put a task
        # in v1's stream, which then rightly stays (the run waits there for a v1 worker).
        wait_for(
            lambda: (
                stub.snapshot()["build_id"] == "v1"
                and [p["kind"] for p in stub.snapshot()["pending"]] == ["signal"]
            ),
            timeout=30,
        )
    finally:
        stop(v1)
    assert existing(store, build_streams(store, "v1"))
    assert ("default", "v1") in served(store)

    v2 = spawn_worker(redis_url, extra=("--build-id", "v2", "--claim-idle", "1"))
    try:
        wait_for(lambda: not existing(store, build_streams(store, "v1")), timeout=30)
        assert ("default", "v1") not in served(store)
        assert existing(store, build_streams(store, "v2"))  # its own stay
        stub.signal("go", "late")  # a task for v1 again: its stream comes back, holding it
        wait_for(lambda: existing(store, build_streams(store, "v1")), timeout=10)
        assert stub.status() == "suspended"  # v2 does not decide v1's run
    finally:
        stop(v2)

    v1 = spawn_worker(redis_url, extra=("--build-id", "v1"))
    try:
        assert stub.result(timeout=30) == "late"
    finally:
        stop(v1)
