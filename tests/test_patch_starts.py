"""What a run records for ``patched()`` when the process starting it lacks the class.

A tester found new runs silently taking the old branch: a start by name (the CLI or the HTTP
API without ``--app``, a client that does not import the class) and a child started by a
parent on the new code recorded no patches, and a continue-as-new loop started before a
patch kept none for ever, so the old branch could never be retired. Now such a start records
the patches the live workers of the queue declare (a child's, those of the class in the
worker that starts it), and a continue-as-new those of the code that decides it.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from procs import ROOT, TESTS, spawn_worker, stop
from waiting import wait_for

from durable import WorkflowStub
from durable.store.redis_store import RedisStore

pytestmark = pytest.mark.slow

APP = """
from durable import Workflow, activity, child, continue_as_new, patched


def ps_step(x: str) -> str:
    return x


class PsKid(Workflow):
    patches = ("new-path",)

    def handle(self) -> str:
        return activity(ps_step, "NEW" if patched("new-path") else "OLD")


class PsParent(Workflow):
    def handle(self) -> str:
        return child(PsKid)


class PsLoop(Workflow):
    patches = ("new-path",)

    def handle(self, n: int) -> str:
        if n == 0:
            continue_as_new(1)
        return "NEW" if patched("new-path") else "OLD"
"""


def test_runs_started_without_the_class_take_the_patched_branch(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    (tmp_path / "ps_app.py").write_text(textwrap.dedent(APP))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(TESTS), str(ROOT)])}
    # Started before any worker runs its code (as by a release before the patch): it records none.
    loop = WorkflowStub.make("PsLoop", "ps-loop", store=store).start(0)
    worker = spawn_worker(redis_url, app="ps_app", env=env)
    try:
        wait_for(store.live_workers, timeout=30)
        by_name = WorkflowStub.make("PsKid", "ps-kid", store=store).start()  # this process lacks PsKid
        assert by_name.result(timeout=30) == "NEW"
        parent = WorkflowStub.make("PsParent", "ps-parent", store=store).start()
        assert parent.result(timeout=30) == "NEW"  # its child, started by the worker's outbox
        # The loop's first run took the old branch's path; the run it continued as is a new one.
        assert loop.result(timeout=30) == "NEW"
    finally:
        stop(worker)
