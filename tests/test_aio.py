"""asyncio (issue 18 item 1): the async client against real worker processes, and ``async def``
activities with heartbeats, cancellation and timeouts."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from apps.async_app import (
    CancelsBeating,
    Doubles,
    Gate,
    LeavesQuiet,
    Spins,
    SpunPastDeadline,
    SwallowedTimeout,
    TimesOut,
)
from procs import ROOT, TESTS, durable_cli, workers

from durable import AsyncWorkflowStub, ConfigurationError, WorkflowFailed, WorkflowNotFound, WorkflowStub, aio
from durable.client import default_store
from durable.store.aio import _waiters, async_waiter_for

WAITERS = 500


def _blocked_in_xread() -> int:
    return sum(1 for c in default_store().redis.client_list() if c.get("cmd") == "xread")


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.timeout(180)
def test_500_awaits_in_one_loop_share_one_read(redis_url: str) -> None:
    """500 coroutines await result() at once: one blocking read, no thread per waiter."""

    async def scenario() -> list[int]:
        stubs = [AsyncWorkflowStub.make(Gate, id=f"gate-{i}") for i in range(WAITERS)]
        await asyncio.gather(*(s.start(i) for i, s in enumerate(stubs)))
        waiting = [asyncio.ensure_future(s.result(timeout=120)) for s in stubs]
        await asyncio.sleep(1.5)  # every coroutine is parked in the loop's waiter now
        assert not any(w.done() for w in waiting)
        assert _blocked_in_xread() <= others + 1
        assert threading.active_count() <= threads_before + aio.THREADS + 2  # the executor's, not 500
        await asyncio.gather(*(s.signal("go", 1000) for s in stubs))
        return await asyncio.gather(*waiting)

    with workers(redis_url, app="apps.async_app"):
        others = _blocked_in_xread()
        threads_before = threading.active_count()
        assert asyncio.run(scenario()) == [i + 1000 for i in range(WAITERS)]


def test_async_client_signal_query_update_and_errors(redis_url: str) -> None:
    async def scenario() -> None:
        stub = await AsyncWorkflowStub.make(Gate, id="gate-one").start(1)
        assert await stub.query("seen") == 0
        assert await stub.update("bump", 5, timeout=30) == 10  # the update ran an async activity
        loaded = await AsyncWorkflowStub.load("gate-one")
        await loaded.signal("go", 100)
        assert await stub.result(timeout=30) == 111
        assert await stub.status() == "completed"
        with pytest.raises(TimeoutError):
            await (await AsyncWorkflowStub.make(Gate, id="gate-two").start(0)).result(timeout=0.3)
        other = await AsyncWorkflowStub.load("gate-two")
        with pytest.raises(ConfigurationError, match="timeout must be"):
            await other.result(timeout=-1)
        with pytest.raises(ConfigurationError, match="timeout must be"):
            await other.update("bump", 1, timeout=float("nan"))
        await other.terminate("test over")
        with pytest.raises(WorkflowFailed, match="terminated"):
            await other.result(timeout=10)
        with pytest.raises(WorkflowNotFound):
            await AsyncWorkflowStub.make(Gate, id="gate-none").result()
        # A stub follows its id's current run, also when another run took its run's place.
        old = await AsyncWorkflowStub.make(Doubles, id="doubles-again").start(2)
        assert await old.result(timeout=30) == [0, 2]
        newer = await AsyncWorkflowStub.make(Doubles, id="doubles-again").start(3)
        assert await old.result(timeout=30) == [0, 2, 4]
        assert old.run_id == newer.run_id
        await _cancelled_await_leaves_the_others()

    with workers(redis_url, app="apps.async_app"):
        asyncio.run(scenario())


async def _cancelled_await_leaves_the_others() -> None:
    """A cancelled ``await stub.result()`` stops watching its run; the other awaits go on."""
    a = await AsyncWorkflowStub.make(Gate, id="gate-a").start(1)
    b = await AsyncWorkflowStub.make(Gate, id="gate-b").start(2)
    waiting_a, waiting_b = (asyncio.ensure_future(s.result(timeout=30)) for s in (a, b))
    await asyncio.sleep(0.5)
    waiting_a.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting_a
    store = a.sync.store
    watched = set(async_waiter_for(store)._watches)
    assert watched == {store.keys.history(store.keys.partition("gate-b"), b.run_id or "")}
    await a.signal("go", 10)
    await b.signal("go", 20)
    assert await waiting_b == 22
    assert await a.result(timeout=30) == 11  # awaiting again after a cancelled await


def test_batched_commands_each_get_their_own_reply(redis_url: str) -> None:
    """The waits' short commands share round trips; an error reply fails only its caller."""

    async def scenario() -> None:
        store = default_store()
        store.redis.xadd("a-stream", {"e": b"x"})
        batch = async_waiter_for(store).batch
        sets = [batch.call("SET", f"k{i}", str(i)) for i in range(50)]
        wrong = batch.call("HGET", "a-stream", "run")
        after = batch.call("GET", "k7")
        assert await asyncio.gather(*sets) == [b"OK"] * 50
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            await wrong
        assert await after == b"7"

    asyncio.run(scenario())


def test_async_activities_run_heartbeat_cancel_and_time_out(redis_url: str, tmp_path: Path) -> None:
    beat_log, slow_log = tmp_path / "beat.log", tmp_path / "slow.log"

    async def scenario() -> tuple[object, ...]:
        doubles = await AsyncWorkflowStub.make(Doubles).start(20)
        cancels = await AsyncWorkflowStub.make(CancelsBeating).start(str(beat_log))
        times_out = await AsyncWorkflowStub.make(TimesOut).start(str(slow_log))
        swallows = await AsyncWorkflowStub.make(SwallowedTimeout).start()
        runs = (doubles, cancels, times_out, swallows)
        return tuple(await asyncio.gather(*(s.result(timeout=60) for s in runs)))

    with workers(redis_url, app="apps.async_app"):
        doubled, cancelled, timed_out, swallowed = asyncio.run(scenario())
    # A coroutine that swallows its timeout's cancel and returns: its late value was a success.
    assert swallowed == {"cause": "ActivityTimeout", "kind": "start_to_close"}
    assert doubled == [2 * i for i in range(20)]
    # The sibling failed after 1.5 s: Beating outlived its 0.5 s heartbeat timeout only
    # because its heartbeats reached Redis; its cancel reached the coroutine.
    assert cancelled == "caught RuntimeError"
    lines = _lines(beat_log)
    assert lines[0] == "started 1" and lines[-1].startswith("saw cancel after ")
    assert int(lines[-1].rsplit(" ", 1)[1]) > 25
    assert timed_out == {"cause": "ActivityTimeout", "kind": "start_to_close", "attempts": 2}
    assert _lines(slow_log).count("slow cancelled") == 2  # asyncio.timeout cancelled each attempt


def test_an_async_activity_that_returns_past_its_deadline_without_awaiting_times_out(redis_url: str) -> None:
    """It never awaits, so the loop never ran its timeout's timer: its late value was a success
    (a thread activity's fails). Alone: it holds the loop the async activities share."""
    with workers(redis_url, app="apps.async_app"):
        spun = WorkflowStub.make(SpunPastDeadline).start().result(timeout=60)
    assert spun == {"cause": "ActivityTimeout", "kind": "start_to_close"}


@pytest.mark.timeout(120)
def test_a_closed_event_loop_leaves_no_connection_open(redis_url: str) -> None:
    """Each ``asyncio.run`` (a loop per request, per Celery task, per pytest-asyncio test)
    kept one or more Redis connections open for ever: the loop's waiter held them, and the
    registry of waiters kept the loop alive. Its shutdown closes them now."""

    async def one(i: int) -> int:
        stub = await AsyncWorkflowStub.make(Gate, id=f"gate-loop-{i}").start(i)
        assert await stub.update("bump", 1, timeout=30) == 2
        await stub.signal("go", 10)
        return await stub.result(timeout=30)

    with workers(redis_url, app="apps.async_app"):
        client = default_store().redis
        assert asyncio.run(one(0)) == 12  # the workers' connections are all open by now
        before = len(client.client_list())
        for i in range(1, 11):
            assert asyncio.run(one(i)) == i + 12
        gc.collect()
        assert len(client.client_list()) <= before + 2, client.client_list()
        assert not [loop for loop in _waiters if loop.is_closed()]


_LOOP_STALL = """
import asyncio, sys, time
sys.path.insert(0, sys.argv[1])
from apps.async_app import Gate
from durable import AsyncWorkflowStub, RedisUnavailable

async def main():
    worst, last, done = 0.0, time.monotonic(), asyncio.Event()

    async def tick():
        nonlocal worst, last
        while not done.is_set():
            await asyncio.sleep(0.02)
            now = time.monotonic()
            worst, last = max(worst, now - last), now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.1)
    try:
        await AsyncWorkflowStub.make(Gate, id="unreachable").start(1)
    except RedisUnavailable as exc:
        print("raised", type(exc).__name__)
    done.set()
    await ticker
    print(f"worst {worst:.2f}")

asyncio.run(main())
"""


@pytest.mark.timeout(60)
def test_make_and_start_with_redis_unreachable_never_stall_the_loop(tmp_path: Path) -> None:
    """``make`` opened the process's default store on the loop: with Redis unreachable, every
    coroutine of the process stood still for the 10 s the opening rides out."""
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, DURABLE_REDIS_URL=f"redis://127.0.0.1:{port}", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", _LOOP_STALL, str(TESTS)], env=env, capture_output=True, text=True, timeout=50
    )
    assert "raised RedisUnavailable" in out.stdout, (out.stdout, out.stderr)
    worst = float(out.stdout.split("worst ")[1])
    assert worst < 1.0, out.stdout


_OUTAGE_CALLS = """
import asyncio, sys, time
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, sys.argv[1])
from apps.async_app import Gate
from durable import AsyncWorkflowStub, RedisUnavailable

async def main():
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(2))  # small, as on a small machine
    began = time.monotonic()

    async def start(i):
        try:
            await AsyncWorkflowStub.make(Gate, id=f"unreachable-{i}").start(1)
        except RedisUnavailable:
            return time.monotonic() - began

    async def resolve():
        await asyncio.sleep(1.0)
        at = time.monotonic()
        await loop.getaddrinfo("localhost", 80)
        return time.monotonic() - at

    *failed, resolved = await asyncio.gather(*(start(i) for i in range(4)), resolve())
    print("failed", " ".join(f"{t:.1f}" for t in failed))
    print(f"resolved {resolved:.2f}")

asyncio.run(main())
"""


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_calls_during_an_outage_fail_together_and_leave_the_default_executor_free(tmp_path: Path) -> None:
    """Four first calls with Redis unreachable failed after 10, 20, 30 and 40 s (each rode the
    outage out in turn to open the store); and they held the loop's default executor, so
    ``loop.getaddrinfo`` (every httpx/aiohttp connection to another service) waited behind them."""
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, DURABLE_REDIS_URL=f"redis://127.0.0.1:{port}", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", _OUTAGE_CALLS, str(TESTS)], env=env, capture_output=True, text=True, timeout=80
    )
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert "failed" in lines and "resolved" in lines, (out.stdout, out.stderr)
    failed = [float(t) for t in lines["failed"].split()]
    assert len(failed) == 4 and max(failed) < 16, failed  # one opening's 10 s, shared
    assert float(lines["resolved"]) < 2.0, out.stdout


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_async_activity_of_a_closed_run_is_cancelled(redis_url: str, tmp_path: Path) -> None:
    """Its run closed (the workflow stopped waiting for it on a cancel), a quiet async activity
    ran its full course: the worker said it held a thread "Python cannot stop", of a coroutine
    it can cancel."""
    marker = tmp_path / "quiet.log"

    async def scenario() -> str:
        stub = await AsyncWorkflowStub.make(LeavesQuiet).start(str(marker))
        while "started" not in _lines(marker):
            await asyncio.sleep(0.05)
        await stub.cancel()
        return await stub.result(timeout=30)

    with workers(redis_url, app="apps.async_app"):
        assert asyncio.run(scenario()) == "saw cancel"
        deadline = time.monotonic() + 40  # found at its next look (every 10 s per attempt)
        while "cancelled" not in _lines(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
    assert _lines(marker) == ["started", "cancelled"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_stalled_loop_of_async_activities_is_said_by_describe_and_workers(redis_url: str) -> None:
    """Only the worker's log said it: `durable status` showed the waiting activity "running"."""
    with workers(redis_url, app="apps.async_app"):
        spinning = WorkflowStub.make(Spins).start(12.0)
        time.sleep(1.0)  # the spin holds the loop now
        waiting = WorkflowStub.make(Doubles).start(1)

        def said() -> str:
            steps = waiting.describe().pending
            return next(
                (s["state"] for s in steps if "event loop of async activities" in s.get("state", "")), ""
            )

        deadline = time.monotonic() + 10
        while not said() and time.monotonic() < deadline:
            time.sleep(0.2)
        state = said()
        assert "has not run for" in state and "in spin)" in state, waiting.describe().pending
        warnings = json.loads(durable_cli(redis_url, "workers", "--json").stdout)["warnings"]
        assert any("event loop of async activities has not run for" in w for w in warnings), warnings
        assert waiting.result(timeout=60) == [0] and spinning.result(timeout=60) == "spun"
