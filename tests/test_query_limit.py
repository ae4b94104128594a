"""A query whose workflow code never hands control back fails in time, naming the line.

A query replays the run's history in the calling process (the CLI, the HTTP server, an app)
and then calls the ``@query`` method. Code that busy-loops -- the very run a worker blocked
as a runaway decision, or a looping ``@query`` method -- held that thread for ever: the CLI
hung, each HTTP request took a server thread for good, and SIGTERM no longer stopped the
server (:mod:`durable.time_limit`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
from apps import runaway
from apps.runaway import Crunch, LoopingQuery, PollingQuery, SleepyQuery, Spin, Tally
from procs import ROOT, TESTS, spawn_worker, stop
from server_procs import ServerProc
from waiting import wait_for

import durable
import durable.client
from durable import DurableError, QueryBusy, QueryFailed, WorkflowStub, time_limit
from durable.store.redis_store import RedisStore
from durable.time_limit import code_position

SPIN_LINE = r"apps/runaway\.py:\d+ in handle"


def test_a_query_replaying_code_that_loops_fails_in_time_and_the_thread_goes_on(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(durable.client, "QUERY_TIMEOUT", 1.0)
    spin = WorkflowStub.make(Spin, id="q-spin", store=store).start()  # no worker: history is its start
    started = time.monotonic()
    with pytest.raises(
        QueryFailed, match=rf"did not return within 1 s: workflow code ran without yielding at .*{SPIN_LINE}"
    ):
        spin.query("where")
    assert time.monotonic() - started < 4
    # An unknown name is refused before any code runs: at once, naming the ones there are.
    started = time.monotonic()
    with pytest.raises(DurableError, match=r"has no @query 'nope'; it has \['where'\]"):
        spin.query("nope")
    assert time.monotonic() - started < 0.5
    # The same thread answers the next query, and nothing of the stopped one reaches it late.
    time.sleep(0.2)
    with pytest.raises(QueryFailed, match="did not return within 1 s"):
        spin.query("where")
    looping = WorkflowStub.make(LoopingQuery, id="q-looping", store=store).start()
    with pytest.raises(QueryFailed, match=r"ran without yielding at .*apps/runaway\.py:\d+ in stuck"):
        looping.query("stuck")
    time.sleep(0.3)  # past the monitor's next look: a stray exception would have been delivered


def test_a_query_blocked_in_a_call_fails_in_time_and_holds_one_runner_at_most(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``time.sleep`` in a query takes the exception only when it returns: the caller (a CLI, a
    server thread) waited for it, and a server whose threads all did so answered nothing."""
    monkeypatch.setattr(durable.client, "QUERY_TIMEOUT", 1.0)
    monkeypatch.setattr(time_limit, "RUNNERS", 1)
    monkeypatch.setattr(time_limit, "_slot_count", None)  # one slot, for this test
    monkeypatch.setitem(runaway.QUERY_SLEEP_S, "s", 6.0)  # past both waits below
    stub = WorkflowStub.make(SleepyQuery, id="q-sleepy", store=store).start()  # no worker
    began = time.monotonic()
    with pytest.raises(
        QueryFailed, match=r"did not return within 1 s: .*runaway\.py:\d+ in slow \(blocked in a call\)"
    ):
        stub.query("slow")
    # (once its thread is seen using no CPU for a few looks: not slowed, blocked)
    assert time.monotonic() - began < 1 + time_limit.BLOCKED_GRACE_S + 1.5 + 1
    # Its runner is still held: the next query says so, naming the run whose code holds it, instead
    # of waiting behind it (a QueryBusy: the HTTP API's 429 busy, not a fault of this run's).
    with pytest.raises(
        QueryBusy,
        match=r"all 1 query threads .* held by earlier queries blocked in workflow code \(q-sleepy at ",
    ):
        stub.query("slow")
    monkeypatch.setitem(runaway.QUERY_SLEEP_S, "s", 0.0)
    time.sleep(6 - (time.monotonic() - began) + 0.5)  # the blocked call returns: its runner is free
    assert stub.query("slow") == "woke"


def test_a_query_that_polls_sleeping_is_stopped_and_frees_its_thread(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit counts CPU time, which a loop of sleeps hardly uses: such a query was never
    stopped, its thread held for good, and after four every query of the run was refused. It is
    stopped on the wall clock at SLOW_FACTOR times the limit."""
    monkeypatch.setattr(durable.client, "QUERY_TIMEOUT", 1.0)
    monkeypatch.setitem(runaway.POLLING, "on", True)
    stub = WorkflowStub.make(PollingQuery, id="q-polling", store=store).start()  # no worker
    began = time.monotonic()
    with pytest.raises(QueryFailed, match=r"did not return within 1 s: .*runaway\.py:\d+ in poll"):
        stub.query("poll")
    assert time.monotonic() - began < 6
    # Its thread is freed once the wall clock reaches SLOW_FACTOR + 1 times the limit (it polled for ever).
    wait_for(lambda: not time_limit._stuck, timeout=time_limit.SLOW_FACTOR + 5)
    assert stub.query("ping") == "pong"


def test_query_threads_held_by_one_runs_code_leave_room_for_others(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One run's code blocked in a call held all 16 query threads, and every query of every other
    run failed, told to fix and `durable repair` itself."""
    monkeypatch.setattr(durable.client, "QUERY_TIMEOUT", 1.0)
    monkeypatch.setattr(time_limit, "RUNNERS", 3)
    monkeypatch.setattr(time_limit, "STUCK_PER_RUN", 2)
    monkeypatch.setattr(time_limit, "_slot_count", None)  # three slots, for this test
    monkeypatch.setitem(runaway.QUERY_SLEEP_S, "s", 12.0)  # past the three calls below
    stub = WorkflowStub.make(SleepyQuery, id="q-cap", store=store).start()  # no worker
    began = time.monotonic()
    for _ in range(2):
        with pytest.raises(QueryFailed, match=r"\(blocked in a call\)"):
            stub.query("slow")
    started = time.monotonic()
    with pytest.raises(QueryFailed, match=r"blocked in a call; 2 earlier queries of it still are") as info:
        stub.query("slow")
    assert time.monotonic() - started < 0.5 and not isinstance(info.value, QueryBusy)
    monkeypatch.setitem(runaway.QUERY_SLEEP_S, "s", 0.0)
    other = WorkflowStub.make(SleepyQuery, id="q-other", store=store).start()
    assert other.query("slow") == "woke"  # the third thread: the first run could not take it
    time.sleep(max(0.0, 12 - (time.monotonic() - began) + 0.5))  # the blocked calls return
    assert stub.query("slow") == "woke"


def test_the_http_api_answers_a_looping_query_and_the_server_still_stops(
    durable_redis_url: str, tmp_path: Path
) -> None:
    server = ServerProc(durable_redis_url, tmp_path / "server.log", app="apps.runaway")
    try:
        with server.client(**{"X-Durable-Request": "1"}) as c:
            started = c.post("/api/v1/workflows", json={"type": "Spin", "id": "q-http-spin"})
            assert started.status_code == 201, started.text
            began = time.monotonic()
            resp = c.post("/api/v1/workflows/q-http-spin/query/where", json={"args": []})
            assert resp.status_code == 422 and resp.json()["error"]["code"] == "rejected", resp.text
            assert "did not return within 5 s" in resp.json()["error"]["message"]
            assert time.monotonic() - began < 12
            assert c.get("/healthz").status_code == 200
        began = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=15) is not None
        assert time.monotonic() - began < 10
    finally:
        server.stop()


def test_the_cli_query_of_a_run_blocked_as_a_runaway_fails_in_time(
    durable_redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    worker = spawn_worker(durable_redis_url, app="apps.runaway", extra=("--decision-timeout", "0.5"))
    try:
        spin = WorkflowStub.make(Spin, id="q-blocked-spin", store=store).start()
        wait_for(lambda: getattr(spin.blocked(), "kind", "") == "runaway_decision", timeout=30)
    finally:
        stop(worker)
    env = dict(os.environ, DURABLE_REDIS_URL=durable_redis_url, PYTHONPATH=f"{TESTS}{os.pathsep}{ROOT}")
    began = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", "query", "q-blocked-spin", "where", "--app", "apps.runaway"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1, out
    assert "did not return within 5 s" in out.stderr and "durable repair q-blocked-spin" in out.stderr, (
        out.stderr
    )
    assert time.monotonic() - began < 20


def test_the_position_named_is_the_apps_line_not_durables_nor_generated_code() -> None:
    """A runaway side_effect() loop was reported at ``<string>:2 in __init__`` (a dataclass's
    generated __init__ inside durable), not at the workflow's line."""
    stack = traceback.StackSummary.from_list(
        [
            ("/srv/app/shop.py", 287, "handle", ""),
            (str(Path(durable.__file__).parent / "workflow.py"), 233, "side_effect", ""),
            ("<string>", 2, "__init__", ""),
        ]
    )
    assert code_position(stack).endswith("shop.py:287 in handle")


def test_the_cli_exits_after_a_query_blocked_in_a_call(durable_redis_url: str, store: RedisStore) -> None:
    """The error came after 5 s, then the process waited at exit for the blocked call's thread."""
    stub = WorkflowStub.make(SleepyQuery, id="q-cli-sleepy", store=store).start()
    env = dict(
        os.environ,
        DURABLE_REDIS_URL=durable_redis_url,
        PYTHONPATH=f"{TESTS}{os.pathsep}{ROOT}",
        QUERY_SLEEP_S="60",
    )
    began = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", "query", stub.id, "slow", "--app", "apps.runaway"],
        env=env,
        capture_output=True,
        text=True,
        timeout=40,
    )
    assert out.returncode == 1 and "(blocked in a call)" in out.stderr, out
    assert time.monotonic() - began < 20


def test_queries_slowed_by_each_other_are_answered_not_called_runaway_code(
    worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrent queries of a long history share the interpreter: each replay took longer than
    the limit on the wall clock though its code was healthy, and failed "ran without yielding
    ... fix the code". The limit counts the replay's own CPU time; a caller waits on while the
    code still runs (up to SLOW_FACTOR times the limit)."""
    stub = WorkflowStub.make(Tally).start()
    for _ in range(3000):
        stub.signal("add", 1)
    wait_for(lambda: stub.query("count") == 3000, timeout=60)
    began = time.perf_counter()
    stub.query("count")
    alone = time.perf_counter() - began
    monkeypatch.setattr(durable.client, "QUERY_TIMEOUT", 2.5 * alone)
    monkeypatch.setattr(time_limit, "BLOCKED_GRACE_S", alone)  # 8 replays at once take ~8x alone
    monkeypatch.setattr(time_limit, "SLOW_FACTOR", 40)  # waiting on while they run: whatever the load
    # Eight replays beside a loaded CI machine: one may get no CPU for a few looks in a row
    # (a CI run of this stop: called blocked); the idle verdict is tested on its own elsewhere.
    monkeypatch.setattr(time_limit, "IDLE_CHECKS", 30)
    results = _at_once(lambda: stub.query("count"), 8)
    assert results == [3000] * 8, (alone, results)


def test_queries_slowed_past_the_wait_are_busy_not_runaway_code(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Healthy queries of 0.6 s CPU, six at once under a 1 s limit and a wait of 2x: their threads
    were stopped as runaway code (wall clock past 2x) just before their callers gave up, and the
    callers got "ran without yielding ... fix the code" instead of QueryBusy (try again)."""
    monkeypatch.setattr(durable.client, "QUERY_TIMEOUT", 1.0)
    monkeypatch.setattr(time_limit, "SLOW_FACTOR", 2)
    stub = WorkflowStub.make(Crunch, id="q-crunch", store=store).start()  # no worker
    results = _at_once(lambda: stub.query("work", 0.6), 6)
    assert all(r == 1 or isinstance(r, QueryBusy) for r in results), results


def _at_once(call: Callable[[], object], n: int) -> list[object]:
    """``call()`` on ``n`` threads at once: what each returned or raised."""
    results: list[object] = []

    def ask() -> None:
        try:
            results.append(call())
        except Exception as exc:  # noqa: BLE001 - the assertion shows it
            results.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results
