"""A run that recorded a patch is not decided by a worker whose code predates it, while a
worker that declares the patch is live (found by a tester: during an unversioned overlap an
old worker took such a run down the old branch, silently)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from procs import ROOT, TESTS, spawn_worker, stop
from waiting import wait_for

from durable import WorkflowStub
from durable.store.redis_store import RedisStore
from durable.store.workers import WorkerInfo

V1 = """
from durable import Workflow, activity, await_signal


def pr_step(x: int) -> int:
    return x


class PrOrder(Workflow):
    def handle(self, n: int) -> list:
        first = activity(pr_step, n)
        await_signal("go")
        return [first, activity(pr_step, n + 10)]
"""

PATCHED_HEAD = """
from durable import Workflow, activity, await_signal, patched


def pr_step(x: int) -> int:
    return x


class PrOrder(Workflow):
    patches = ("pr-more",)

    def handle(self, n: int) -> list:
        first = activity(pr_step, n)
"""

V2 = (
    PATCHED_HEAD
    + """        await_signal("go")
        return [first, activity(pr_step, n + 100 if patched("pr-more") else n + 10)]
"""
)


def _app(folder: Path, source: str) -> dict[str, str]:
    folder.mkdir()
    (folder / "pr_app.py").write_text(textwrap.dedent(source))
    return {"PYTHONPATH": os.pathsep.join([str(folder), str(TESTS), str(ROOT)])}


def _start_v2(redis_url: str, env: dict[str, str], n: int) -> WorkflowStub:
    """A run started by v2 code (its patches recorded), as `durable start --app` does."""
    wid = f"pr-{n}-{time.monotonic_ns()}"
    subprocess.run(
        [sys.executable, "-m", "workers.cli", "start", "PrOrder", str(n), "--id", wid, "--app", "pr_app"],
        cwd=ROOT,
        env=dict(os.environ, DURABLE_REDIS_URL=redis_url, **env),
        check=True,
        capture_output=True,
        timeout=60,
    )
    return WorkflowStub.load(wid)


def test_an_old_worker_leaves_a_patched_run_to_a_worker_that_declares_the_patch(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    old_env, new_env = _app(tmp_path / "v1", V1), _app(tmp_path / "v2", V2)
    old = spawn_worker(redis_url, app="pr_app", env=old_env)
    newer = None
    # A live worker that declares the patch (it reads nothing: the old worker must wait for it).
    fake = WorkerInfo(
        "pr-fake", queues=("default",), workflows=("PrOrder",), patches={"PrOrder": ("pr-more",)}
    )
    try:
        wait_for(lambda: len(store.live_workers()) == 1, timeout=30)
        store.register_worker(fake, ttl_ms=120_000)
        stub = _start_v2(redis_url, new_env, 1)
        time.sleep(3)
        # Handed back again and again, not decided: no activity scheduled by the old code.
        assert [e.type for e in stub.history()] == ["WorkflowStarted"], stub.history()
        newer = spawn_worker(redis_url, app="pr_app", env=new_env)
        wait_for(lambda: stub.status() == "suspended", timeout=30)
        stub.signal("go")
        assert stub.result(timeout=30) == [1, 101]  # the patched branch, whoever decided
    finally:
        store.unregister_worker(fake.name)
        for proc in (old, newer):
            if proc is not None:
                stop(proc)


def test_without_a_worker_declaring_it_the_old_worker_decides_and_says_so(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    """A run new code decided, its workers gone (a patch retired from the code, or a rollback):
    the old code decides as before, and logs it once."""
    old_env, new_env = _app(tmp_path / "v1", V1), _app(tmp_path / "v2", V2)
    new = spawn_worker(redis_url, app="pr_app", env=new_env)
    old = None
    try:
        stub = _start_v2(redis_url, new_env, 2)
        wait_for(lambda: stub.status() == "suspended", timeout=30)  # decided by the new code
        stop(new)
        old = spawn_worker(redis_url, app="pr_app", env=old_env)
        wait_for(lambda: len(store.live_workers()) == 1, timeout=30)
        stub.signal("go")
        assert stub.result(timeout=30) == [2, 12]
    finally:
        stop(new)
        err = ""
        if old is not None:
            old.send_signal(signal.SIGTERM)
            try:
                err = old.communicate(timeout=30)[1].decode()
            except subprocess.TimeoutExpired:
                old.kill()
                err = old.communicate()[1].decode()
    assert "recorded patches ['pr-more'] that this worker's class does not declare" in err, err


def test_a_run_new_code_started_waits_for_new_workers_then_says_which_patch(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    """A client deployed before its workers: the old workers decided the runs it started down
    the old branch, and once the new workers came every one of them was blocked for good as
    nondeterministic ("code changed before this point?"), nothing naming the patch."""
    old_env, new_env = _app(tmp_path / "v1", V1), _app(tmp_path / "v2", V2)
    old = spawn_worker(redis_url, app="pr_app", env=old_env, extra=("--unknown-type-grace", "2"))
    new = None
    try:
        wait_for(lambda: len(store.live_workers()) == 1, timeout=30)
        stub = _start_v2(redis_url, new_env, 3)
        blocked = wait_for(stub.blocked, timeout=30)
        assert [e.type for e in stub.history()] == ["WorkflowStarted"]  # the old code decided nothing
        assert blocked.kind == "unknown_type"
        assert (
            "no live worker on queue 'default' serves workflow type 'PrOrder' declaring patches ['pr-more']"
            in blocked.message
        ), blocked.message
        new = spawn_worker(redis_url, app="pr_app", env=new_env)
        wait_for(lambda: len(store.live_workers()) == 2, timeout=30)
        # Old and new code are told apart by the patches each worker's classes declare.
        listed = json.loads(_cli(redis_url, "workers", "--json"))["workers"]
        assert sorted(str(w["patches"]) for w in listed) == ["{'PrOrder': ['pr-more']}", "{}"]
        assert "PrOrder (pr-more)" in _cli(redis_url, "workers")
        _cli(redis_url, "repair", stub.id)
        wait_for(lambda: stub.status() == "suspended", timeout=30)
        stub.signal("go")
        assert stub.result(timeout=30) == [3, 103]  # the patched branch
    finally:
        for proc in (old, new):
            if proc is not None:
                stop(proc)


def test_a_run_new_code_started_is_parked_though_another_apps_worker_shares_its_queue(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    """A worker of another app on the queue lacks the type itself: it found the type "served"
    by an old worker (which lacks the patch) and handed the task back with the grace clock
    reset, so the run waited for ever, never parked (the old worker here is a registry entry:
    the other app's worker alone reads the task)."""
    new_env = _app(tmp_path / "v2", V2)
    old = WorkerInfo("pr-old", queues=("default",), workflows=("PrOrder",))
    other = spawn_worker(redis_url, app="apps.basic", extra=("--unknown-type-grace", "6"))
    try:
        wait_for(lambda: len(store.live_workers()) == 1, timeout=30)
        store.register_worker(old, ttl_ms=120_000)
        stub = _start_v2(redis_url, new_env, 4)
        # Meanwhile the views say what it waits for (they said "deleted or trimmed by hand?").
        expected = "no live worker of queue 'default' declares the patches ['pr-more'] the run recorded"
        wait_for(lambda: expected in (stub.describe()["workflow_task"] or ""), timeout=5)
        assert "by hand" not in _cli(redis_url, "status", stub.id)
        blocked = wait_for(stub.blocked, timeout=30)
        assert blocked.kind == "unknown_type"
        assert "serves workflow type 'PrOrder' declaring patches ['pr-more']" in blocked.message, (
            blocked.message
        )
    finally:
        store.unregister_worker(old.name)
        stop(other)


V3 = (
    PATCHED_HEAD
    + """        if patched("pr-more"):
            first += activity(pr_step, 1000)
        await_signal("go")
        return [first, activity(pr_step, n + 10)]
"""
)


def _cli(redis_url: str, *args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        cwd=ROOT,
        env=dict(os.environ, DURABLE_REDIS_URL=redis_url),
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout


def test_an_old_worker_that_cannot_replay_a_patched_history_leaves_it_to_newer_code(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    """A run whose history took the patched branch fails to replay on the old code: the old
    worker blocked it as nondeterministic (a rolling restart of the new workers, or a repair)
    while a worker declaring the patch was live, and its reason did not name the patch."""
    old_env, new_env = _app(tmp_path / "v1", V1), _app(tmp_path / "v3", V3)
    new = spawn_worker(redis_url, app="pr_app", env=new_env)
    old = newer = None
    fake = WorkerInfo(
        "pr-fake", queues=("default",), workflows=("PrOrder",), patches={"PrOrder": ("pr-more",)}
    )
    try:
        stub = _start_v2(redis_url, new_env, 1)
        wait_for(lambda: stub.status() == "suspended", timeout=30)  # past the patched activity
        stop(new)
        store.register_worker(fake, ttl_ms=120_000)  # newer code live (it reads nothing)
        old = spawn_worker(redis_url, app="pr_app", env=old_env)
        wait_for(lambda: len(store.live_workers()) == 2, timeout=30)
        stub.signal("go")
        time.sleep(3)
        assert stub.blocked() is None and stub.status() == "suspended"  # left for newer code
        store.unregister_worker(fake.name)  # no newer code left: blocked, saying why
        blocked = wait_for(stub.blocked, timeout=30)
        assert "the run recorded patches ['pr-more'] that this worker's PrOrder does not declare" in (
            blocked.message
        ), blocked.message
        newer = spawn_worker(redis_url, app="pr_app", env=new_env)
        wait_for(lambda: len(store.live_workers()) == 2, timeout=30)
        _cli(redis_url, "repair", stub.id)
        assert stub.result(timeout=30) == [1001, 11]  # decided by the code that declares it
    finally:
        store.unregister_worker(fake.name)
        for proc in (new, old, newer):
            if proc is not None:
                stop(proc)


BOX_V1 = """
from durable import Workflow, await_signal, signal


class PrBox(Workflow):
    def __init__(self) -> None:
        self.notes: list = []

    @signal
    def note(self, text: str) -> None:
        self.notes.append(text)

    def handle(self) -> list:
        await_signal("go")
        return self.notes
"""

BOX_V2 = BOX_V1.replace("def note(self, text: str)", "def note(self, text: str, prio: int)").replace(
    "self.notes.append(text)", "self.notes.append(f'{text}/{prio}')"
)


def test_a_handler_that_now_raises_on_a_recorded_input_blocks_the_run_for_a_fix(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    """A @signal handler gained a parameter: replaying a signal the old code applied, it raised,
    and the run was FAILED for good (`repair` refuses a closed run) -- because no recorded command
    followed that signal in the history. It is blocked as nondeterminism, repairable."""
    old_env, new_env = _app(tmp_path / "v1", BOX_V1), _app(tmp_path / "v2", BOX_V2)
    old = spawn_worker(redis_url, app="pr_app", env=old_env)
    new = fixed = None
    try:
        _cli(redis_url, "start", "PrBox", "--id", "box-1")
        stub = WorkflowStub.load("box-1")
        wait_for(lambda: stub.status() == "suspended", timeout=30)
        stub.signal("note", "before")
        wait_for(lambda: [e.type for e in stub.history()][-1:] == ["SignalReceived"], timeout=30)
        stop(old)
        new = spawn_worker(redis_url, app="pr_app", env=new_env)
        wait_for(lambda: len(store.live_workers()) == 1, timeout=30)
        stub.signal("go")
        blocked = wait_for(lambda: (b := stub.blocked()) and b.kind == "nondeterminism" and b, timeout=30)
        assert (
            "the code raised TypeError" in blocked.message
            and "missing 1 required positional" in blocked.message
        )
        assert stub.status() != "failed"
        # Which worker found it (a stale one in a fleet is to be found), and its build.
        (live,) = store.live_workers()
        assert f"[found by worker {live.name}, build unversioned]" in blocked.message
        stop(new)
        fixed_env = _app(tmp_path / "v3", BOX_V2.replace("prio: int)", "prio: int = 0)"))
        fixed = spawn_worker(redis_url, app="pr_app", env=fixed_env)
        wait_for(lambda: len(store.live_workers()) == 1, timeout=30)
        _cli(redis_url, "repair", "box-1")
        assert stub.result(timeout=30) == ["before/0"]
    finally:
        for proc in (old, new, fixed):
            if proc is not None:
                stop(proc)
