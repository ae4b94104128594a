"""Workers with different ``--app`` modules on one queue (issue 13, item 3), real processes.

A worker that lacks a task's workflow or activity type leaves the task for a live worker that
has it; the task is parked (its run blocked, the reason naming type and queue) only once no
live worker of the queue has served the type for ``--unknown-type-grace``.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from procs import ROOT, TESTS, spawn_worker, stop
from waiting import wait_for

from durable import WorkflowBlocked, WorkflowStub
from durable.store.redis_store import RedisStore
from durable.store.tasks import ActivityTask

pytestmark = pytest.mark.slow

ALPHA = """
from durable import Workflow, activity


def alpha_step(x):
    return x + 1


class AlphaFlow(Workflow):
    def handle(self, n):
        # beta_step is defined only in the other app: its worker runs it.
        return [activity(alpha_step, n), activity("beta_step", n)]


class Orphaned(Workflow):
    def handle(self, n):
        return activity("nobody_step", n)
"""

BETA = """
from durable import Workflow, activity


def beta_step(x):
    return x * 10


class BetaFlow(Workflow):
    def handle(self, n):
        return [activity(beta_step, n), activity("alpha_step", n)]
"""


@contextmanager
def app_worker(redis_url: str, folder: Path, app: str, grace: float) -> Iterator[subprocess.Popen]:
    env = {"PYTHONPATH": os.pathsep.join([str(folder), str(TESTS), str(ROOT)])}
    proc = spawn_worker(redis_url, app=app, extra=("--unknown-type-grace", str(grace)), env=env)
    try:
        yield proc
    finally:
        stop(proc)


@pytest.fixture
def apps(tmp_path: Path) -> Path:
    (tmp_path / "alpha_app.py").write_text(textwrap.dedent(ALPHA))
    (tmp_path / "beta_app.py").write_text(textwrap.dedent(BETA))
    return tmp_path


def test_tasks_go_to_the_worker_that_has_their_type(redis_url: str, store: RedisStore, apps: Path) -> None:
    with app_worker(redis_url, apps, "alpha_app", grace=30):
        wait_for(lambda: len(store.live_workers()) == 1, timeout=30)
        alphas = [WorkflowStub.make("AlphaFlow", store=store).start(i) for i in range(4)]
        betas = [WorkflowStub.make("BetaFlow", store=store).start(i) for i in range(4)]
        # Nobody serves BetaFlow (nor beta_step) yet: the tasks wait, nothing is parked, and
        # the views say what is missing.
        time.sleep(3)
        assert store.dead_letters() == []
        for stub, missing in [(s, "workflow type 'BetaFlow'") for s in betas] + [
            (s, "activity 'beta_step' (id 2)") for s in alphas
        ]:
            reason = stub.blocked()
            assert reason is not None and reason.kind == "no_live_worker", reason
            assert f"no live worker of queue 'default' defines {missing}" in reason.message
        with app_worker(redis_url, apps, "beta_app", grace=30):
            assert [s.result(timeout=60) for s in alphas] == [[i + 1, i * 10] for i in range(4)]
            assert [s.result(timeout=60) for s in betas] == [[i * 10, i + 1] for i in range(4)]
            more = [WorkflowStub.make(t, store=store).start(7) for t in ("AlphaFlow", "BetaFlow") * 3]
            assert [s.result(timeout=60) for s in more] == [[8, 70], [70, 8]] * 3
    assert store.dead_letters() == []


def test_a_type_no_live_worker_serves_is_parked_after_the_grace(
    redis_url: str, store: RedisStore, apps: Path
) -> None:
    grace = 2.0
    with app_worker(redis_url, apps, "alpha_app", grace=grace):
        wait_for(lambda: len(store.live_workers()) == 1, timeout=30)
        started = time.monotonic()
        orphan = WorkflowStub.make("GammaFlow", store=store).start(1)
        step = WorkflowStub.make("Orphaned", store=store).start(1)
        for stub, what in ((orphan, "workflow type 'GammaFlow'"), (step, "activity type 'nobody_step'")):
            with pytest.raises(WorkflowBlocked) as info:
                stub.result(timeout=30)
            assert time.monotonic() - started >= grace
            assert info.value.kind == "unknown_type"
            assert info.value.reason.startswith(f"no live worker on queue 'default' serves {what} (for ")
        assert time.monotonic() - started < grace + 10
        letters = store.dead_letters()
        assert sorted(d["kind"] for d in letters) == ["activity", "workflow"]
        assert {d["run"] for d in letters} == {orphan.run_id, step.run_id}


def test_a_closed_runs_task_no_worker_serves_is_dropped_not_parked(
    redis_url: str, store: RedisStore, apps: Path
) -> None:
    """A task of a type no live worker serves, left in its queue for a run terminated meanwhile (a
    worker that exited handed its delivered tasks back), was parked at the grace's end: a dead
    letter telling the operator to `durable repair` a run that refuses it."""
    step = WorkflowStub.make("Orphaned", store=store).start(1)
    step.terminate("not needed")
    ref = store.ref(step.id)
    stream = store.keys.activity_tasks(ref.partition, "default")
    task = ActivityTask(
        run_id=ref.run_id, workflow_id=step.id, partition=ref.partition, activity_id="1",
        name="nobody_step", args=b"", attempt=1, stream=stream,
    )  # fmt: skip
    since = store.server_time_ms() - 60_000  # unserved for longer than the grace
    store.ensure_groups([stream])
    store.redis.xadd(stream, {"body": task.encode(), "unserved": str(since)})
    with app_worker(redis_url, apps, "alpha_app", grace=2.0):
        wait_for(lambda: store.redis.xlen(stream) == 0, timeout=30)  # read and dropped
    assert store.dead_letters() == []
    assert step.status() == "terminated"
