"""An activity failing on every attempt (a module missing on the worker, a changed signature)
retries forever by default: `durable status` and the worker's log say so (a tester found it only
in `durable describe`)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from waiting import wait_for

from durable import Activity, RetryPolicy, Workflow, WorkflowStub, activity
from durable.store.redis_store import RedisStore
from durable.testing import TestEnvironment
from workers.cli import cli


class RvLazyImport(Activity):
    retry = RetryPolicy(initial_interval=0.05, max_interval=0.05)

    def handle(self, x: int) -> int:
        import rv_not_installed  # type: ignore[import-not-found]  # noqa: F401, PLC0415 - the bug

        return x


class RvUsesLazy(Workflow):
    def handle(self) -> int:
        return activity(RvLazyImport, 1)


def test_status_and_the_log_say_an_activity_keeps_failing(
    redis_url: str, store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="durable.worker")
    with TestEnvironment(store=store, eager=False):
        stub = WorkflowStub.make(RvUsesLazy).start()
        wait_for(lambda: len(stub.describe().retrying()) == 1, timeout=30)
        out = CliRunner().invoke(cli, ["status", stub.id]).output.strip()
        assert out.startswith("running (activity RvLazyImport (1) retrying: attempt "), out
        assert out.endswith("last error ModuleNotFoundError: No module named 'rv_not_installed')"), out
        stub.terminate("test over")
    lines = [r.getMessage() for r in caplog.records if "RvLazyImport" in r.getMessage()]
    assert lines and lines[0] == (
        f"activity RvLazyImport (1) of run {stub.run_id} failed, attempt 1: "
        "ModuleNotFoundError: No module named 'rv_not_installed'; retrying in 0.05 s"
    ), lines[:2]
