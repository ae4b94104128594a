"""A ``result()`` or ``update()`` wait rides out Redis being unreachable for a while (a restart,
a failover): the outcome still reaches it once Redis answers again; past ``OUTAGE_RIDE_S`` it
gets the error instead of hanging until its timeout.

A real Redis (a private embedded server, ``appendfsync always``) killed with SIGKILL and
started again on its AOF; a real worker in a thread of the test process rides the outage
out too. Sync and async waits.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from apps.basic import Waiter
from apps.updates import UpdCart
from waiting import wait_for

from durable import AsyncWorkflowStub, WorkflowStub
from durable.store import waits
from durable.store.embedded import EmbeddedRedis
from durable.store.redis_store import RedisStore
from durable.testing import TestEnvironment

pytestmark = pytest.mark.fault


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path / "redis", appendfsync="always")
    server.ensure()
    try:
        yield server
    finally:
        server.stop()


def _in_thread(wait: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``wait`` on a thread; its value or error lands in the dict returned."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = wait()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's assertions
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _reading(store: RedisStore) -> None:
    """Wait until a wait of this process blocks in its ``XREAD`` (it registered its run)."""
    wait_for(lambda: any(c.get("cmd") == "xread" for c in store.redis.client_list()), timeout=20)


def _signal_when_back(stub: WorkflowStub, value: str) -> None:
    def sent() -> bool:
        try:
            stub.signal("go", value)
        except redis.ConnectionError:
            return False  # the store's pool reconnects on a later try
        return True

    wait_for(sent, timeout=30, interval=0.2)


@pytest.mark.parametrize("client", ["sync", "async"])
def test_a_result_wait_rides_out_a_redis_restart(server: EmbeddedRedis, client: str) -> None:
    store = RedisStore(server.url)
    with TestEnvironment(store=store):
        stub = WorkflowStub.make(Waiter, id=f"outage-{client}", store=store).start(0)
        wait_for(lambda: stub.status() == "suspended")
        if client == "sync":
            thread, out = _in_thread(lambda: stub.result(timeout=60))
        else:
            thread, out = _in_thread(lambda: asyncio.run(AsyncWorkflowStub(stub).result(timeout=60)))
        _reading(store)
        server.kill()
        time.sleep(1.5)
        assert thread.is_alive() and not out, out  # the outage did not end the wait
        server.ensure()  # again, on its AOF
        _signal_when_back(stub, "after the restart")
        thread.join(60)
    assert out == {"value": "after the restart"}


@pytest.mark.parametrize("client", ["sync", "async"])
def test_an_update_wait_rides_out_a_redis_restart(server: EmbeddedRedis, client: str) -> None:
    store = RedisStore(server.url)
    with TestEnvironment(store=store):
        stub = WorkflowStub.make(UpdCart, id=f"outage-upd-{client}", store=store).start()
        wait_for(lambda: stub.status() == "suspended")
        # The handler runs an activity, then a 3 s timer: the outcome comes after the restart.
        if client == "sync":
            thread, out = _in_thread(lambda: stub.update("reserve", "sku-1", 3, timeout=60))
        else:
            update = AsyncWorkflowStub(stub).update("reserve", "sku-1", 3, timeout=60)
            thread, out = _in_thread(lambda: asyncio.run(update))
        _reading(store)
        server.kill()
        time.sleep(1.5)
        assert thread.is_alive() and not out, out
        server.ensure()
        thread.join(60)
    assert out == {"value": "reserved:sku-1"}


def test_a_result_wait_gets_the_error_once_the_outage_lasts_too_long(
    server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waits, "OUTAGE_RIDE_S", 1.0)
    store = RedisStore(server.url)
    stub = WorkflowStub.make(Waiter, id="outage-long", store=store).start(0)  # no worker: stays open
    thread, out = _in_thread(lambda: stub.result(timeout=60))
    _reading(store)
    started = time.monotonic()
    server.kill()
    thread.join(30)
    assert isinstance(out.get("error"), redis.ConnectionError), out
    assert 1.0 <= time.monotonic() - started < 15  # after the ride-out, long before its timeout


def test_closing_a_store_leaves_its_waiter_read_alone(
    server: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """The waiter thread reads on a connection of its own: closing the store (its pool
    disconnects every connection) once closed the socket under the blocked read, which then
    failed (EBADF) and could read from whichever socket took that file descriptor next."""
    first = RedisStore(server.url)
    stub = WorkflowStub.make(Waiter, id="closing", store=first).start(0)
    with pytest.raises(TimeoutError):
        stub.result(timeout=0.3)  # the waiter thread stays, blocked in its XREAD, a while
    with caplog.at_level("WARNING", logger="durable.client"):
        first.close()
        time.sleep(1.5)  # past the read's block: an error would have been met and logged
        second = RedisStore(server.url)
        with pytest.raises(TimeoutError):
            WorkflowStub.load("closing", store=second).result(timeout=0.3)
        second.close()
    assert not [r.getMessage() for r in caplog.records], caplog.text
