"""Versioning defaults and routing with real `durable worker` processes (issue 13, items 1, 2, 4).

* Restarting the only worker after editing the app continues the in-flight runs (default:
  unversioned); with build pinning (`--build-id auto`) the stranded run is reported.
* A worker start never takes new runs from live workers of the current build; the current
  build changes by `--promote`/`durable promote`, or when it has no live worker left (logged).
* `durable workers --json` lists the live workers, their builds, queues and types.

Every worker process a test starts is stopped in a ``finally``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from apps.basic import PaysOnBilling, Waiter
from click.testing import CliRunner, Result
from procs import ROOT, TESTS, spawn_worker, stop
from waiting import wait_for

from durable import WorkflowStub
from durable.release import VERSION, release
from durable.store.embedded import EmbeddedRedis
from durable.store.records import REGISTRY_TTL_MS
from durable.store.redis_store import RedisStore
from durable.store.workers import HEARTBEAT_S
from workers.cli import cli
from workers.membership import Membership

pytestmark = pytest.mark.slow

APP_V1 = """
from durable import Workflow, activity, await_signal


def edited_step(x):
    return x + 1


class EditedFlow(Workflow):
    def handle(self, n):
        first = activity(edited_step, n)
        return [first, activity(edited_step, await_signal("go"))]
"""

# The same workflow after an edit: a comment, and different activity code.
APP_V2 = APP_V1.replace("    return x + 1", "    # edited: steps now multiply\n    return x * 10")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def write_app(folder: Path, source: str) -> None:
    (folder / "edited_app.py").write_text(textwrap.dedent(source))
    for cached in folder.glob("__pycache__/edited_app*"):
        cached.unlink()


@contextmanager
def worker(
    redis_url: str, *extra: str, app: str = "apps.basic", path: Path | None = None
) -> Iterator[subprocess.Popen]:
    env = {"PYTHONPATH": os.pathsep.join([str(path), str(TESTS), str(ROOT)])} if path else None
    proc = spawn_worker(redis_url, app=app, extra=extra, env=env)
    try:
        yield proc
    finally:
        stop(proc)


def live_names(store: RedisStore) -> set[str]:
    return {w.name for w in store.live_workers()}


def wait_registered(store: RedisStore, n: int) -> None:
    wait_for(lambda: len(store.live_workers()) == n, timeout=30)


def waits_for_signal(stub: WorkflowStub) -> bool:
    return any(p.get("kind") == "signal" for p in stub.describe().get("pending") or [])


def test_restarting_the_only_worker_after_an_edit_continues_in_flight_runs(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    write_app(tmp_path, APP_V1)
    stubs = [WorkflowStub.make("EditedFlow", store=store) for _ in range(3)]
    with worker(redis_url, app="edited_app", path=tmp_path):
        for stub in stubs:
            stub.start(1)
        for stub in stubs:
            wait_for(lambda stub=stub: waits_for_signal(stub), timeout=30)
    write_app(tmp_path, APP_V2)
    with worker(redis_url, app="edited_app", path=tmp_path):
        for i, stub in enumerate(stubs):
            stub.signal("go", i)
        # The first step ran on the old code, the second on the edited code.
        assert [stub.result(timeout=30) for stub in stubs] == [[2, 0], [2, 10], [2, 20]]
        assert all(stub.snapshot()["build_id"] is None for stub in stubs)


def test_a_pinned_run_without_a_live_worker_of_its_build_is_reported(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    write_app(tmp_path, APP_V1)
    stub = WorkflowStub.make("EditedFlow", id="pinned-1", store=store)
    with worker(redis_url, "--build-id", "auto", app="edited_app", path=tmp_path):
        stub.start(1)
        wait_for(lambda: waits_for_signal(stub), timeout=30)
        assert invoke("status", "pinned-1").stdout.strip() == "suspended (waiting for signal 'go')"
    old = stub.snapshot()["build_id"]
    assert old
    # The only worker stopped: its entry left the registry at once.
    status = invoke("status", "pinned-1").stdout.strip()
    assert status.startswith("suspended (blocked: no live worker serves build")
    assert old in status
    described = json.loads(invoke("describe", "pinned-1", "--json").stdout)
    assert described["blocked_kind"] == "no_live_worker"
    listed = json.loads(invoke("list", "--status", "blocked", "--json").stdout)
    assert [r["workflow_id"] for r in listed] == ["pinned-1"]

    write_app(tmp_path, APP_V2)
    with worker(redis_url, "--build-id", "auto", app="edited_app", path=tmp_path):
        wait_registered(store, 1)
        new = store.live_workers()[0].build
        assert new and new != old
        assert "no live worker" in invoke("status", "pinned-1").stdout
        # The operator checked that the edited code replays the history: move the run.
        assert invoke("repair", "pinned-1", "--build-id", new).exit_code == 0
        stub.signal("go", 5)
        assert stub.result(timeout=30) == [2, 50]


def test_a_short_lived_worker_of_another_build_does_not_take_new_runs(
    redis_url: str, store: RedisStore
) -> None:
    with worker(redis_url, "--build-id", "v1") as _live:
        wait_for(lambda: store.current_build(["default"]) == ["v1"], timeout=30)
        with worker(redis_url, "--build-id", "typo", app="apps.features"):
            wait_registered(store, 2)
            assert store.current_build(["default"]) == ["v1"]
        wait_registered(store, 1)
        assert store.current_build(["default"]) == ["v1"]
        stub = WorkflowStub.make(Waiter, store=store).start(0.01)
        wait_for(lambda: stub.snapshot()["build_id"] == "v1", timeout=30)
        stub.signal("go", "ok")
        assert stub.result(timeout=30) == "ok"


def test_the_current_build_moves_when_its_last_worker_stops_and_it_is_logged(
    redis_url: str, store: RedisStore
) -> None:
    first = spawn_worker(redis_url, extra=("--build-id", "v1"))
    second = None
    try:
        wait_for(lambda: store.current_build(["default"]) == ["v1"], timeout=30)
        second = spawn_worker(redis_url, extra=("--build-id", "v2"))
        wait_registered(store, 2)
        stub = WorkflowStub.make(Waiter, store=store).start(0.01)
        wait_for(lambda: stub.snapshot()["build_id"] == "v1", timeout=30)
        stop(first)
        wait_for(lambda: store.current_build(["default"]) == ["v2"], timeout=15)
        fresh = WorkflowStub.make(Waiter, store=store).start(0.01)
        wait_for(lambda: fresh.snapshot()["build_id"] == "v2", timeout=30)
        fresh.signal("go", "new")
        assert fresh.result(timeout=30) == "new"
        # The v1 run stays pinned to v1 and says so.
        assert "no live worker serves build 'v1'" in invoke("status", stub.id).stdout
    finally:
        stop(first)
        if second is not None:
            assert second.stderr is not None
            second.send_signal(15)
            log = second.communicate(timeout=20)[1].decode()
            assert "build v1 has no live worker left; new runs now go to build v2" in log
            assert "Runs pinned to v1 wait for a worker of that build" in log


def test_promote_moves_new_runs_to_a_live_build(redis_url: str, store: RedisStore) -> None:
    with worker(redis_url, "--build-id", "v1"), worker(redis_url, "--build-id", "v2"):
        wait_registered(store, 2)
        assert store.current_build(["default"]) in (["v1"], ["v2"])  # whichever registered first
        out = invoke("promote", "v2")
        assert out.exit_code == 0 and "new runs go to build v2" in out.stdout
        again = invoke("promote", "v2").stdout
        assert "new runs go to build v2 (it was current already)" in again, again
        time.sleep(2.5)  # workers re-read the current build every second (and finish a 1 s read)
        stub = WorkflowStub.make(Waiter, store=store).start(0.01)
        wait_for(lambda: stub.snapshot()["build_id"] == "v2", timeout=30)
        # Nothing takes it back while v2 lives.
        assert store.current_build(["default"]) == ["v2"]


def test_durable_workers_lists_live_workers_with_their_types(redis_url: str, store: RedisStore) -> None:
    pinned_flags = ("--build-id", "b7", "--queue", "other", "--sticky-timeout", "7", "--claim-idle", "40")
    with worker(redis_url), worker(redis_url, *pinned_flags, app="apps.features"):
        wait_registered(store, 2)
        # A versioned worker registers first and claims its queue's current build just
        # after (Membership.join), so the list may briefly show no current build.
        wait_for(lambda: store.current_build(["other"]) == ["b7"], timeout=30)
        report = json.loads(invoke("workers", "--json").stdout)
        by_build = {w["build_id"]: w for w in report["workers"]}
        plain, pinned = by_build[None], by_build["b7"]
        assert plain["queues"] == ["default"] and pinned["queues"] == ["other"]
        assert "Waiter" in plain["workflows"] and "add" in plain["activities"]
        assert "Waiter" not in pinned["workflows"]
        assert plain["heartbeat_age_s"] < 10 and plain["pid"] > 0
        # The release of durable each runs, to follow a rolling upgrade (--version said 0.1.0 for all).
        assert plain["release"] == pinned["release"] == release() and release().startswith(VERSION)
        # How soon each takes over what a gone worker left, as its flags say (defaults: 30 s, 5 s).
        assert (plain["claim_idle_ms"], plain["sticky_timeout_ms"]) == (30_000, 5_000)
        assert (pinned["claim_idle_ms"], pinned["sticky_timeout_ms"]) == (40_000, 7_000)
        assert report["queues"]["default"]["new_runs_to"] == ["(unversioned)"]
        assert report["queues"]["other"]["current_build"] == "b7"
        assert report["queues"]["other"]["new_runs_to"] == ["b7"]
        table = invoke("workers").stdout
        assert "b7" in table and "(unversioned)" in table and f"durable {release()}" in table
    assert json.loads(invoke("workers", "--json").stdout)["workers"] == []


def test_durable_workers_lists_queues_no_live_worker_serves_while_tasks_wait(
    redis_url: str, store: RedisStore
) -> None:
    """A run started on a queue nobody serves, an activity sent to one: both queues are listed,
    with their backlog, as served by no worker (they used to be missing from the page)."""
    with worker(redis_url):
        wait_registered(store, 1)
        WorkflowStub.make(Waiter, queue="nobody").start(0.01)
        paying = WorkflowStub.make(PaysOnBilling).start(1)
        wait_for(lambda: store.queue_backlog(["billing"])["billing"]["activity_tasks"] == 1, timeout=30)
        report = json.loads(invoke("workers", "--json").stdout)
        assert set(report["queues"]) == {"default", "nobody", "billing"}
        assert report["queues"]["nobody"]["workers"] == [] and report["queues"]["billing"]["workers"] == []
        assert report["backlog"]["nobody"]["workflow_tasks"] == 1
        assert report["backlog"]["billing"] == {
            **report["backlog"]["billing"],
            "workflow_tasks": 0,
            "activity_tasks": 1,
        }
        assert report["backlog"]["billing"]["lag_ms"] >= 0
        table = invoke("workers").stdout
        assert table.count("none serves it") == 2, table
        with worker(redis_url, "--queue", "billing"):  # served: the task runs, the queue empties
            assert paying.result(timeout=30) == 2
            wait_for(
                lambda: "billing" in json.loads(invoke("workers", "--json").stdout)["queues"], timeout=30
            )
        # Unserved and empty again: no longer listed (the waiting run on "nobody" still is).
        wait_for(
            lambda: set(json.loads(invoke("workers", "--json").stdout)["queues"]) == {"default", "nobody"}
        )


def test_start_refuses_a_type_its_app_does_not_define(redis_url: str, store: RedisStore) -> None:
    refused = invoke("start", "Waitr", "--app", "apps.basic")
    assert refused.exit_code == 1
    assert "'Waitr' is not defined in --app apps.basic; did you mean 'Waiter'?" in refused.stderr
    assert store.list_runs() == []


def test_start_warns_about_the_queue_the_class_names(
    redis_url: str, store: RedisStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run starts on its class's queue: the warning is about that queue, not ``default``."""
    (tmp_path / "billing_app.py").write_text(
        "from durable import Workflow\n\n\nclass OnBilling(Workflow):\n    queue = 'billing'\n\n"
        "    def handle(self) -> int:\n        return 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with worker(redis_url):
        wait_registered(store, 1)
        started = invoke("start", "OnBilling", "--app", "billing_app")
        assert started.exit_code == 0, started.output
        assert "warning: no live worker on queue 'billing' runs workflow type 'OnBilling'" in started.stderr


def test_start_warns_when_no_live_worker_runs_the_type(redis_url: str, store: RedisStore) -> None:
    started = invoke("start", "Waiter", "0.01", "--app", "apps.basic")
    assert started.exit_code == 0
    assert "warning: no live worker on queue 'default' runs workflow type 'Waiter'" in started.stderr
    with worker(redis_url):
        wait_registered(store, 1)
        quiet = invoke("start", "Waiter", "0.01")
        assert quiet.exit_code == 0 and "warning" not in quiet.stderr


def test_a_build_taking_over_a_queue_it_declares_compatible_does_not_ask_for_a_worker_of_it(
    store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    """It warned that runs pinned to the old build wait for a worker of that build, and to start
    one: this worker decides them itself (--compatible-build-id)."""
    store.claim_current_build("takeover", "", "old")  # the old build, no live worker left
    rescue = Membership(
        store, name="rescue-1", build="rescue", compatible=("old",), queues=("takeover",),
        workflows=(), activities=(), promote=False,
    )  # fmt: skip
    with caplog.at_level("INFO", logger="durable.worker"):
        rescue.heartbeat()
    assert store.current_build(["takeover"]) == ["rescue"]
    assert "which also decides the runs pinned to old (--compatible-build-id)" in caplog.text
    assert "wait for a worker of that build" not in caplog.text
    rescue.leave()


@pytest.mark.fault
def test_a_redis_stall_does_not_move_new_runs_to_another_build(fresh_redis: EmbeddedRedis) -> None:
    """Every entry lapses on Redis's clock while it is stalled: v2's worker, back first, took
    v1's live worker for gone, logged "build v1 has no live worker left" and took the queue."""
    store = RedisStore(fresh_redis.url)
    v1 = spawn_worker(fresh_redis.url, extra=("--build-id", "v1", "--promote"))
    v2 = spawn_worker(fresh_redis.url, extra=("--build-id", "v2"))
    try:
        wait_registered(store, 2)
        wait_for(lambda: store.current_build(["default"]) == ["v1"], timeout=30)
        pid = fresh_redis.pid
        assert pid is not None
        # v1's worker is the slower to come back (a busy host): v2's renews first.
        os.kill(v1.pid, signal.SIGSTOP)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(REGISTRY_TTL_MS / 1000 + 2)
            os.kill(pid, signal.SIGCONT)
            time.sleep(HEARTBEAT_S + 1)
        finally:
            os.kill(pid, signal.SIGCONT)
            os.kill(v1.pid, signal.SIGCONT)
        wait_registered(store, 2)
        time.sleep(3 * HEARTBEAT_S)  # heartbeats of both, after the stall
        assert store.current_build(["default"]) == ["v1"]
    finally:
        stop(v2)
        stop(v1)
        store.close()
