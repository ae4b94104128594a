"""``result()`` on a run pinned to a build with no live worker (issue 13, items 1 and 12).

The views report it at once; ``result()`` raises ``WorkflowBlocked(kind="no_live_worker")``
once it has held for the grace (the registry's time to live), so restarting the build's
only worker is no error. Real ``durable worker`` processes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from apps.basic import Waiter
from procs import spawn_worker, stop
from waiting import wait_for

from durable import AsyncWorkflowStub, WorkflowBlocked, WorkflowStub
from durable.store import waits
from durable.store.redis_store import RedisStore
from durable.store.waits import NO_LIVE_WORKER_GRACE_S

pytestmark = pytest.mark.slow


GRACE = 3.0
"""The grace these tests give the waiters (the product's is the registry's TTL,
:data:`~durable.store.waits.NO_LIVE_WORKER_GRACE_S`): what is tested is that they raise after it."""


def _suspended_pinned_run(redis_url: str, store: RedisStore) -> WorkflowStub:
    stub = WorkflowStub.make(Waiter, store=store).start(0.01)
    wait_for(lambda: stub.snapshot()["build_id"] == "v1" and stub.status() == "suspended", timeout=30)
    return stub


def test_result_raises_once_no_worker_of_the_pinned_build_lived_for_the_grace(
    redis_url: str, store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waits, "NO_LIVE_WORKER_GRACE_S", GRACE)
    proc = spawn_worker(redis_url, extra=("--build-id", "v1"))
    try:
        stub = _suspended_pinned_run(redis_url, store)
    finally:
        stop(proc)
    assert stub.blocked() is not None  # the views say so at once
    started = time.monotonic()
    with pytest.raises(WorkflowBlocked) as info:
        stub.result(timeout=60)
    waited = time.monotonic() - started
    assert GRACE <= waited < GRACE + 5
    assert info.value.kind == "no_live_worker" and "build 'v1'" in info.value.reason


def test_the_async_client_raises_it_too(
    redis_url: str, store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``await stub.result()`` says so as ``stub.result()`` does (its waiter checks the builds)."""
    monkeypatch.setattr(waits, "NO_LIVE_WORKER_GRACE_S", GRACE)
    proc = spawn_worker(redis_url, extra=("--build-id", "v1"))
    try:
        stub = _suspended_pinned_run(redis_url, store)
    finally:
        stop(proc)

    async def wait() -> float:
        loaded = await AsyncWorkflowStub.load(stub.id, store=store)
        started = time.monotonic()
        with pytest.raises(WorkflowBlocked) as info:
            await loaded.result(timeout=60)
        assert info.value.kind == "no_live_worker" and "build 'v1'" in info.value.reason
        return time.monotonic() - started

    waited = asyncio.run(wait())
    assert GRACE <= waited < GRACE + 5


def test_restarting_the_builds_worker_within_the_grace_is_no_error(redis_url: str, store: RedisStore) -> None:
    proc = spawn_worker(redis_url, extra=("--build-id", "v1"))
    try:
        stub = _suspended_pinned_run(redis_url, store)
        outcome: dict[str, Any] = {}

        def wait() -> None:
            try:
                outcome["value"] = stub.result(timeout=60)
            except Exception as exc:  # noqa: BLE001 - the assertion below shows it
                outcome["error"] = exc

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(1.5)  # the waiter is watching the run
        stop(proc)
        wait_for(lambda: stub.blocked() is not None, timeout=10)  # no live worker of v1 now
        proc = spawn_worker(redis_url, extra=("--build-id", "v1"))
        wait_for(lambda: stub.blocked() is None, timeout=NO_LIVE_WORKER_GRACE_S - 1)
        stub.signal("go", "still here")
        waiter.join(30)
        assert outcome == {"value": "still here"}
    finally:
        stop(proc)
