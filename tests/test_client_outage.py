"""Client calls ride out a short Redis outage, and a call resent after its reply was lost is not
done twice.

* A real Redis killed with SIGKILL and started again on its AOF while ``start()`` waits.
* A real TCP proxy that lets a command reach Redis and run, then cuts the client's connection
  instead of passing the reply on (:class:`lossy_proxy.LossyProxy`): the client cannot tell
  whether its command ran and sends it again. The start, signal, signal-with-start and terminate
  scripts must find their own earlier work.
* Past its ride-out a call raises :class:`durable.RedisUnavailable`, naming the Redis, the call
  and what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest
import redis
from apps.basic import Hooked, Sequence, Waiter
from apps.starts import Guardian
from lossy_proxy import LossyProxy
from outages import in_thread
from waiting import wait_for

from durable import (
    AsyncWorkflowStub,
    HookError,
    RedisUnavailable,
    Schedule,
    ScheduleExists,
    ScheduleHandle,
    ScheduleNotFound,
    WorkflowStub,
    count_runs,
)
from durable.store.embedded import EmbeddedRedis
from durable.store.outage import unavailable_error
from durable.store.redis_store import RedisStore
from durable.testing import TestEnvironment

pytestmark = pytest.mark.fault


def test_a_start_during_a_redis_restart_goes_through_once_redis_is_back(
    killable_redis: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="durable.client")
    store = RedisStore(killable_redis.url)
    with TestEnvironment(store=store):
        killable_redis.kill()
        stub = WorkflowStub.make(Sequence, id="start-in-outage", store=store)
        status = WorkflowStub.make(Sequence, id="read-in-outage", store=store)
        thread, out = in_thread(lambda: stub.start(4))
        reader, read = in_thread(status.status)
        lister, listed = in_thread(lambda: count_runs("type = 'NoSuchType'", store=store))
        time.sleep(1.5)
        assert thread.is_alive() and not out, out  # it waits for Redis, it does not fail
        killable_redis.ensure()
        for waiting in (thread, reader, lister):
            waiting.join(30)
        assert out == {"value": stub}, out
        assert isinstance(read.get("error"), Exception) and "no workflow" in str(read["error"]), read
        assert listed == {"value": 0}, listed
        assert stub.result(timeout=30) == 6
    said = [r.getMessage() for r in caplog.records if r.name == "durable.client"]
    # One WARNING for the outage, however many calls rode it out; one INFO line when it ended.
    assert sum("redis unavailable" in m and "client of this process" in m for m in said) == 1, said


def _lossy_store(proxy: LossyProxy) -> RedisStore:
    """A store through ``proxy``, the scripts the tests lose replies of loaded (else the reply
    lost would be a NOSCRIPT one, to a script that did not run)."""
    store = RedisStore(proxy.url)
    warm = WorkflowStub.make(Waiter, id="loads-the-scripts", store=store).start(0)  # start_run
    warm.signal("warm-up")  # deliver
    warm.terminate()  # terminate
    with contextlib.suppress(HookError):
        WorkflowStub.resume_hook("0.unknown", store=store)  # resume_hook
    ScheduleHandle.create(
        "loads-the-scripts", Schedule(workflow="Waiter", every="1h", args=[0]), store=store
    ).delete()
    return store


def test_a_signal_whose_reply_is_lost_is_delivered_once(killable_redis: EmbeddedRedis) -> None:
    with LossyProxy(str(killable_redis.socket_path)) as proxy:
        store = _lossy_store(proxy)
        stub = WorkflowStub.make(Waiter, id="lost-signal", store=store).start(0)  # no worker yet
        ref = store.ref(stub.id)
        proxy.lose_reply_to(b"EVALSHA")
        stub.signal("go", "once")
        assert proxy.lost == 1  # the script ran, its reply never came: the client sent it again
        assert store.redis.llen(store.keys.inbox(ref.partition, ref.run_id)) == 1
        with TestEnvironment(store=store):
            assert stub.result(timeout=30) == "once"
        signals = [e for e in stub.history() if e.type == "SignalReceived"]
        assert len(signals) == 1, signals


def test_a_start_whose_reply_is_lost_starts_one_run(killable_redis: EmbeddedRedis) -> None:
    with LossyProxy(str(killable_redis.socket_path)) as proxy:
        store = _lossy_store(proxy)
        stub = WorkflowStub.make(Waiter, id="lost-start", store=store)  # id conflict policy: fail
        proxy.lose_reply_to(b"EVALSHA")
        stub.start(0)  # the resend finds its own run: no WorkflowAlreadyStarted
        assert proxy.lost == 1
        ref = store.ref("lost-start")
        assert stub.run_id == ref.run_id
        assert store.redis.zcard(store.keys.runs(ref.partition)) == 1
        assert stub.status() == "pending"


def test_a_signal_with_start_whose_reply_is_lost_signals_the_open_run_once(
    killable_redis: EmbeddedRedis,
) -> None:
    with LossyProxy(str(killable_redis.socket_path)) as proxy:
        store = _lossy_store(proxy)
        first = WorkflowStub.make(Waiter, id="lost-sws", store=store).start(0)
        ref = store.ref(first.id)
        proxy.lose_reply_to(b"EVALSHA")
        again = WorkflowStub.make(Waiter, id="lost-sws", store=store).signal_with_start(
            "go", "v", start_args=[0]
        )
        assert proxy.lost == 1
        assert again.run_id == ref.run_id  # the open run took the signal, once
        assert store.redis.llen(store.keys.inbox(ref.partition, ref.run_id)) == 1


def test_a_cancel_whose_reply_is_lost_is_requested_once(killable_redis: EmbeddedRedis) -> None:
    with LossyProxy(str(killable_redis.socket_path)) as proxy:
        store = _lossy_store(proxy)
        stub = WorkflowStub.make(Waiter, id="lost-cancel", store=store).start(60)
        ref = store.ref(stub.id)
        proxy.lose_reply_to(b"EVALSHA")
        stub.cancel("enough")  # the resend finds the note of its delivery
        assert proxy.lost == 1
        assert store.redis.llen(store.keys.inbox(ref.partition, ref.run_id)) == 1
        stub.cancel("again")  # another call is another request (dropped by the run, as ever)
        assert store.redis.llen(store.keys.inbox(ref.partition, ref.run_id)) == 2


def test_a_hook_resume_whose_reply_is_lost_is_delivered_once(killable_redis: EmbeddedRedis) -> None:
    with LossyProxy(str(killable_redis.socket_path)) as proxy:
        store = _lossy_store(proxy)
        with TestEnvironment(store=store):
            stub = WorkflowStub.make(Hooked, id="lost-hook", store=store).start()
            token = wait_for(lambda: stub.query("hook_token"), timeout=30)
            proxy.lose_reply_to(b"EVALSHA")
            WorkflowStub.resume_hook(token, {"paid": True}, store=store)  # the resend finds its delivery
            assert proxy.lost == 1
            assert stub.result(timeout=30) == {"paid": True}
            # The token stays single-use for any other call.
            with pytest.raises(HookError, match="unknown or already used"):
                WorkflowStub.resume_hook(token, {"paid": False}, store=store)


def test_a_schedule_create_or_delete_whose_reply_is_lost_succeeds(killable_redis: EmbeddedRedis) -> None:
    with LossyProxy(str(killable_redis.socket_path)) as proxy:
        store = _lossy_store(proxy)
        spec = Schedule(workflow="Waiter", every="1h", args=[0])
        proxy.lose_reply_to(b"EVALSHA")
        handle = ScheduleHandle.create("nightly", spec, store=store)  # the resend finds it: no ScheduleExists
        assert proxy.lost == 1
        assert handle.describe().spec == spec
        with pytest.raises(ScheduleExists):  # another create of the id is refused as ever
            ScheduleHandle.create("nightly", spec, store=store)
        proxy.lose_reply_to(b"EVALSHA")
        handle.delete()  # the resend finds it gone: no ScheduleNotFound
        assert proxy.lost == 2
        assert [d.id for d in ScheduleHandle.list(store=store)] == []


def test_a_delete_of_no_schedule_resent_after_an_outage_still_says_so(killable_redis: EmbeddedRedis) -> None:
    """Its first try never reached Redis: the resend must not take "gone" for its own doing."""
    store = RedisStore(killable_redis.url)
    ScheduleHandle.create("real", Schedule(workflow="Waiter", every="1h", args=[0]), store=store)
    killable_redis.kill()
    thread, out = in_thread(lambda: ScheduleHandle("never-was", store=store).delete())
    time.sleep(1.5)
    killable_redis.ensure()
    thread.join(30)
    assert isinstance(out.get("error"), ScheduleNotFound), out


def test_a_schedule_read_rides_out_a_redis_restart(killable_redis: EmbeddedRedis) -> None:
    store = RedisStore(killable_redis.url)
    handle = ScheduleHandle.create("hourly", Schedule(workflow="Waiter", every="1h", args=[0]), store=store)
    killable_redis.kill()
    thread, out = in_thread(lambda: handle.describe().state)
    time.sleep(1.5)
    assert thread.is_alive() and not out, out
    killable_redis.ensure()
    thread.join(30)
    assert out == {"value": "active"}, out


def test_a_terminate_whose_reply_is_lost_succeeds_and_closes_the_children(
    killable_redis: EmbeddedRedis,
) -> None:
    with LossyProxy(str(killable_redis.socket_path)) as proxy:
        store = _lossy_store(proxy)
        with TestEnvironment(store=store):
            stub = WorkflowStub.make(Guardian, id="lost-terminate", store=store).start("terminate", "its-kid")
            wait_for(lambda: store.instance_statuses(["its-kid"])[0] is not None, timeout=30)
            kid = WorkflowStub.load("its-kid", store=store)
            wait_for(lambda: any(p.get("kind") == "child" for p in stub.snapshot()["pending"]), timeout=30)
            proxy.lose_reply_to(b"EVALSHA")
            stub.terminate("done with it")  # the resend finds it terminated: no WorkflowClosed
            assert proxy.lost == 1
            assert stub.status() == "terminated"
            # The script that terminated it left the messages closing its children (a worker's
            # outbox pass delivers them: asserted at once, it failed a loaded CI run).
            wait_for(lambda: kid.status() == "terminated", timeout=10)


def test_a_replacing_start_whose_reply_is_lost_closes_the_replaced_runs_children(
    killable_redis: EmbeddedRedis,
) -> None:
    with LossyProxy(str(killable_redis.socket_path)) as proxy:
        store = _lossy_store(proxy)
        with TestEnvironment(store=store):
            old = WorkflowStub.make(Guardian, id="lost-swap", store=store).start("terminate", "swap-kid")
            wait_for(lambda: any(p.get("kind") == "child" for p in old.snapshot()["pending"]), timeout=30)
            new = WorkflowStub.make(
                Waiter, id="lost-swap", store=store, id_conflict_policy="terminate_existing"
            )
            proxy.lose_reply_to(b"EVALSHA")
            new.start(60)  # the resend finds its run started
            assert proxy.lost == 1
            assert new.run_id != old.run_id and new.status() in ("pending", "suspended")
            # The replaced run's children were closed by the script that replaced it.
            wait_for(lambda: store.instance_statuses(["swap-kid"]) == ["terminated"], timeout=30)


def test_calls_give_up_after_their_ride_out_with_a_clear_error(killable_redis: EmbeddedRedis) -> None:
    store = RedisStore(killable_redis.url, client_ride_s=1.0)
    stub = WorkflowStub.make(Waiter, id="gives-up", store=store).start(0)
    killable_redis.kill()
    started = time.monotonic()
    with pytest.raises(RedisUnavailable) as caught:
        stub.status()
    assert 1.0 <= time.monotonic() - started < 5
    said = str(caught.value)
    assert said.startswith(f"cannot reach Redis at {killable_redis.url} (connection lost: "), said
    assert "for 1 s, so status() of workflow 'gives-up' gave up" in said and "DURABLE_REDIS_URL" in said
    assert caught.value.kind == "connection lost" and caught.value.url == killable_redis.url
    # A write says it may have landed, and how to look.
    with pytest.raises(RedisUnavailable, match=r"may have landed .* `durable status gives-up`"):
        stub.signal("go", "x")
    # The async client's calls raise the same.
    with pytest.raises(RedisUnavailable, match="start\\(\\) of workflow 'async-gives-up'"):
        asyncio.run(AsyncWorkflowStub.make(Waiter, id="async-gives-up", store=store).start(0))


def test_a_store_with_no_ride_out_fails_at_once(killable_redis: EmbeddedRedis) -> None:
    """The CLI's and the HTTP server's stores (an operator wants the answer now)."""
    store = RedisStore(killable_redis.url, client_ride_s=0)
    stub = WorkflowStub.make(Waiter, id="at-once", store=store).start(0)
    killable_redis.kill()
    started = time.monotonic()
    with pytest.raises(RedisUnavailable, match="^cannot reach Redis at .*: check that it runs"):
        stub.describe()
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("client", ["sync", "async"])
def test_a_result_wait_that_cannot_begin_is_tried_again(killable_redis: EmbeddedRedis, client: str) -> None:
    store = RedisStore(killable_redis.url)
    with TestEnvironment(store=store):
        stub = WorkflowStub.make(Sequence, id=f"result-in-outage-{client}", store=store)
        killable_redis.kill()
        if client == "sync":
            thread, out = in_thread(lambda: stub.start(4).result(timeout=30))
        else:
            thread, out = in_thread(lambda: asyncio.run(_start_and_wait(AsyncWorkflowStub(stub))))
        time.sleep(1.5)
        assert thread.is_alive() and not out, out
        killable_redis.ensure()
        thread.join(30)
    assert out == {"value": 6}, out


async def _start_and_wait(stub: AsyncWorkflowStub) -> object:
    await stub.start(4)
    return await stub.result(timeout=30)


def test_a_result_wait_on_a_down_redis_gives_up_within_its_timeout(killable_redis: EmbeddedRedis) -> None:
    store = RedisStore(killable_redis.url)
    stub = WorkflowStub.make(Waiter, id="result-gives-up", store=store).start(0)
    killable_redis.kill()
    started = time.monotonic()
    with pytest.raises(RedisUnavailable, match="result\\(\\) of workflow 'result-gives-up' gave up"):
        stub.result(timeout=1.5)
    assert 1.4 <= time.monotonic() - started < 4
    killable_redis.ensure()
    # On a live Redis the deadline is a TimeoutError, as always (not taken for an outage).
    with pytest.raises(TimeoutError, match="did not close within 0.5 s"):
        stub.result(timeout=0.5)


def test_a_refusal_for_now_is_said_as_such() -> None:
    """Redis answering but refusing (OOM at maxmemory, LOADING, READONLY...) is not "cannot reach";
    out of memory or unable to persist, it says which, and what an operator can do."""
    refused = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
    error = unavailable_error(refused, "redis://app:secret@db:6379/0", "start() of workflow 'w'", 10.0)
    assert str(error) == (
        "Redis is out of memory at redis://app:***@db:6379/0: it refuses writes (OOM: command not "
        "allowed when used memory > 'maxmemory'.) for 10 s, so start() of workflow 'w' gave up: raise "
        "maxmemory (CONFIG SET maxmemory / redis.conf), purge old closed runs (`durable purge`), and "
        "check the runs' retention"
    )
    assert error.kind == "OOM" and error.url == "redis://app:***@db:6379/0" and error.__cause__ is refused
    loading = redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory")
    error = unavailable_error(loading, "redis://db:6379/0", "start() of workflow 'w'", 10.0)
    assert str(error).startswith("Redis at redis://db:6379/0 refuses commands for now (")
    assert str(error).endswith("gave up: see `durable workers` and Redis's log")
