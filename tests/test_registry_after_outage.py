"""A worker's registry entry that lapsed while Redis was away is written again as soon as Redis
answers, not at the worker's next heartbeat: meanwhile its runs read as ``no_live_worker``.

Redis restarts without the entry (deleted just before, as a lapse during a long outage would
leave it), right after a heartbeat: the next one is two seconds or more away.
"""

from __future__ import annotations

import re
import threading
import time

import pytest
from apps.basic import Waiter
from procs import spawn_worker, stop
from waiting import wait_for

from durable import WorkflowStub
from durable.store.embedded import EmbeddedRedis
from durable.store.redis_store import RedisStore
from durable.store.workers import HEARTBEAT_S
from workers.worker import Worker

QUEUE = "registry-after-outage"

BACK_WITHIN_S = 1.0
"""Well below a heartbeat: what an operator may see is a blip, not a wrong reason."""


def _seen(store: RedisStore, name: str) -> int:
    return next((w.seen for w in store.live_workers() if w.name == name), 0)


def test_a_worker_is_live_again_as_soon_as_redis_is_back(fresh_redis: EmbeddedRedis) -> None:
    store = RedisStore(fresh_redis.url)
    proc = spawn_worker(fresh_redis.url, extra=("--build-id", "v1", "--queue", QUEUE))
    try:
        stub = WorkflowStub.make(Waiter, queue=QUEUE, store=store).start(0.01)
        wait_for(lambda: stub.snapshot()["build_id"] == "v1" and stub.status() == "suspended", timeout=30)
        (name,) = [w.name for w in store.live_workers()]
        last = _seen(store, name)
        wait_for(lambda: _seen(store, name) != last, timeout=2 * HEARTBEAT_S + 2, interval=0.01)
        store.redis.delete(store.keys.worker(name))
        blocked = stub.blocked()
        assert blocked is not None and blocked.kind == "no_live_worker"
        store.close()
        fresh_redis.stop()  # SHUTDOWN writes the AOF out: the entry stays gone
        time.sleep(0.3)
        fresh_redis.ensure()
        back = time.monotonic()
        store = RedisStore(fresh_redis.url)
        reloaded = WorkflowStub.load(stub.id, store=store)
        wait_for(lambda: reloaded.blocked() is None, timeout=5, interval=0.01)
        took = time.monotonic() - back
        assert took < BACK_WITHIN_S, f"the worker was taken for gone {took:.1f} s after Redis was back"
        assert [w.name for w in store.live_workers()] == [name]
        assert proc.poll() is None
    finally:
        stop(proc)
        store.close()


def test_no_live_worker_just_after_a_restart_says_redis_restarted(fresh_redis: EmbeddedRedis) -> None:
    """Until the live workers write their entries again (seconds after Redis is back), a run older
    than the restart reads as served by no worker: the reason says Redis just restarted, so the
    operator does not start a worker that is running. A run started after it: not said."""
    store = RedisStore(fresh_redis.url)
    before = WorkflowStub.make(Waiter, queue=QUEUE, store=store).start(0.01)
    store.close()
    fresh_redis.stop()
    time.sleep(2.1)  # the restart is surely after the run (the uptime is whole seconds)
    fresh_redis.ensure()
    store = RedisStore(fresh_redis.url)
    try:
        blocked = WorkflowStub.load(before.id, store=store).blocked()
        assert blocked is not None and blocked.kind == "no_live_worker"
        assert blocked.message.startswith(f"no live worker serves queue '{QUEUE}'"), blocked.message
        # Whole seconds of uptime: 0 s, or 1 s on a loaded machine (a CI run read 1).
        assert re.search(
            r"\(Redis restarted [01] s ago: a live worker writes its registry entry again", blocked.message
        )
        after = WorkflowStub.make(Waiter, queue=QUEUE, store=store).start(0.01)
        blocked_after = after.blocked()
        assert blocked_after is not None and "Redis restarted" not in blocked_after.message
    finally:
        store.close()


def test_a_worker_whose_entry_lapsed_says_its_activities_may_have_run_again(
    store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker stopped or starved past the registry's time to live is taken for gone and its
    activities run elsewhere; resumed, it said nothing at WARNING."""
    caplog.set_level("WARNING", logger="durable.worker")
    w = Worker(store, concurrency=1, block_ms=100)
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: any(x.name == w.consumer for x in store.live_workers()), timeout=10)
        assert not [r for r in caplog.records if "registry entry had lapsed" in r.getMessage()]
        store.redis.delete(store.keys.worker(w.consumer))  # as its time to live running out does
        said = wait_for(
            lambda: [r.getMessage() for r in caplog.records if "registry entry had lapsed" in r.getMessage()],
            timeout=2 * HEARTBEAT_S + 2,
        )
        assert "may have taken it for gone and run its unfinished activities again" in said[0], said
    finally:
        w.stop()
        thread.join(10)
