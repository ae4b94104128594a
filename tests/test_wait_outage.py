"""A ``result()`` or ``update()`` wait rides out Redis being unreachable for a while (a restart,
a failover): the outcome still reaches it once Redis answers again; past ``OUTAGE_RIDE_S`` it
gets the error instead of hanging until its timeout.

A real Redis (a private embedded server, ``appendfsync always``) killed with SIGKILL and
started again on its AOF; a real worker in a thread of the test process rides the outage
out too. Sync and async waits.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import redis
from apps.basic import Waiter
from apps.updates import UpdCart
from outages import in_thread
from waiting import wait_for

from durable import AsyncWorkflowStub, RedisUnavailable, WorkflowStub
from durable.store import waits
from durable.store.embedded import EmbeddedRedis
from durable.store.redis_store import RedisStore
from durable.testing import TestEnvironment

pytestmark = pytest.mark.fault


def _reading(store: RedisStore) -> None:
    """Wait until a wait of this process blocks in its ``XREAD`` (it registered its run)."""
    wait_for(lambda: any(c.get("cmd") == "xread" for c in store.redis.client_list()), timeout=20)


def _signal_when_back(stub: WorkflowStub, value: str) -> None:
    def sent() -> bool:
        try:
            stub.signal("go", value)
        except RedisUnavailable:
            return False  # down for longer than the signal's own ride-out: try again
        return True

    wait_for(sent, timeout=30, interval=0.2)


@pytest.mark.parametrize("client", ["sync", "async"])
def test_a_result_wait_rides_out_a_redis_restart(killable_redis: EmbeddedRedis, client: str) -> None:
    store = RedisStore(killable_redis.url)
    with TestEnvironment(store=store):
        stub = WorkflowStub.make(Waiter, id=f"outage-{client}", store=store).start(0)
        wait_for(lambda: stub.status() == "suspended")
        if client == "sync":
            thread, out = in_thread(lambda: stub.result(timeout=60))
        else:
            thread, out = in_thread(lambda: asyncio.run(AsyncWorkflowStub(stub).result(timeout=60)))
        _reading(store)
        killable_redis.kill()
        time.sleep(1.5)
        assert thread.is_alive() and not out, out  # the outage did not end the wait
        killable_redis.ensure()  # again, on its AOF
        _signal_when_back(stub, "after the restart")
        thread.join(60)
    assert out == {"value": "after the restart"}


@pytest.mark.parametrize("client", ["sync", "async"])
def test_an_update_wait_rides_out_a_redis_restart(killable_redis: EmbeddedRedis, client: str) -> None:
    store = RedisStore(killable_redis.url)
    with TestEnvironment(store=store):
        stub = WorkflowStub.make(UpdCart, id=f"outage-upd-{client}", store=store).start()
        wait_for(lambda: stub.status() == "suspended")
        # The handler runs an activity, then a 3 s timer: the outcome comes after the restart.
        if client == "sync":
            thread, out = in_thread(lambda: stub.update("reserve", "sku-1", 3, timeout=60))
        else:
            update = AsyncWorkflowStub(stub).update("reserve", "sku-1", 3, timeout=60)
            thread, out = in_thread(lambda: asyncio.run(update))
        _reading(store)
        killable_redis.kill()
        time.sleep(1.5)
        assert thread.is_alive() and not out, out
        killable_redis.ensure()
        thread.join(60)
    assert out == {"value": "reserved:sku-1"}


def test_many_waits_through_one_outage_log_it_once(
    killable_redis: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """Update waits read on connections of their own, yet one outage is one WARNING for the
    process (it once logged one per waiting call)."""
    caplog.set_level(logging.INFO, logger="durable.client")
    store = RedisStore(killable_redis.url)
    with TestEnvironment(store=store):
        stubs = [WorkflowStub.make(UpdCart, id=f"outage-many-{i}", store=store).start() for i in range(3)]
        wait_for(lambda: all(s.status() == "suspended" for s in stubs))
        waits = [in_thread(lambda s=s: s.update("reserve", "sku-1", 3, timeout=60)) for s in stubs]
        waits.append(in_thread(lambda: stubs[0].result(timeout=60)))  # and a result() wait
        wait_for(lambda: sum(c.get("cmd") == "xread" for c in store.redis.client_list()) >= 2, timeout=20)
        killable_redis.kill()
        time.sleep(1.5)
        killable_redis.ensure()
        for thread, out in waits[:3]:
            thread.join(60)
            assert out == {"value": "reserved:sku-1"}, out
    said = [r.getMessage() for r in caplog.records if r.name == "durable.client"]
    assert sum(m.startswith("redis unavailable") for m in said) == 1, said


def test_a_result_wait_gets_the_error_once_the_outage_lasts_too_long(
    killable_redis: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waits, "OUTAGE_RIDE_S", 1.0)
    store = RedisStore(killable_redis.url)
    stub = WorkflowStub.make(Waiter, id="outage-long", store=store).start(0)  # no worker: stays open
    thread, out = in_thread(lambda: stub.result(timeout=60))
    _reading(store)
    started = time.monotonic()
    killable_redis.kill()
    thread.join(30)
    error = out.get("error")
    assert isinstance(error, RedisUnavailable), out
    assert isinstance(error.__cause__, redis.ConnectionError) and error.kind == "connection lost"
    assert f"cannot reach Redis at {killable_redis.url}" in str(error) and "result() or update() wait" in str(
        error
    )
    assert 1.0 <= time.monotonic() - started < 15  # after the ride-out, long before its timeout


def test_closing_a_store_leaves_its_waiter_read_alone(
    killable_redis: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """The waiter thread reads on a connection of its own: closing the store (its pool
    disconnects every connection) once closed the socket under the blocked read, which then
    failed (EBADF) and could read from whichever socket took that file descriptor next."""
    first = RedisStore(killable_redis.url)
    stub = WorkflowStub.make(Waiter, id="closing", store=first).start(0)
    with pytest.raises(TimeoutError):
        stub.result(timeout=0.3)  # the waiter thread stays, blocked in its XREAD, a while
    with caplog.at_level("WARNING", logger="durable.client"):
        first.close()
        time.sleep(1.5)  # past the read's block: an error would have been met and logged
        second = RedisStore(killable_redis.url)
        with pytest.raises(TimeoutError):
            WorkflowStub.load("closing", store=second).result(timeout=0.3)
        second.close()
    assert not [r.getMessage() for r in caplog.records], caplog.text
