"""An earlier run of a workflow id (a continue-as-new chain, a reused id) can be read: its
history and description, from the stub, the CLI (``--run``) and the API (``?run_id=``)."""

from __future__ import annotations

import json

from apps.basic import Looper
from click.testing import CliRunner

from durable import WorkflowNotFound, WorkflowStub
from durable.store.redis_store import RedisStore
from workers.cli import cli


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def _runs_oldest_first(workflow_id: str) -> list[str]:
    code, out = _cli("list", "--json")
    assert code == 0, out
    rows = [r for r in json.loads(out) if r["workflow_id"] == workflow_id]
    return [r["run_id"] for r in sorted(rows, key=lambda r: (r["created"], r["run_id"]))]


def test_each_run_of_a_continue_as_new_chain_can_be_read(worker) -> None:
    stub = WorkflowStub.make(Looper).start(2, 0)
    assert stub.result(timeout=30) == 3
    first, middle, last = _runs_oldest_first(stub.id)
    assert stub.run_id == last

    assert [e.type for e in stub.history(first)][-1] == "WorkflowContinuedAsNew"
    assert [e.type for e in stub.history()][-1] == "WorkflowCompleted"
    assert stub.history(first)[0].data["args"] == (2, 0)
    assert stub.history(middle)[0].data["args"] == (1, 2)
    info = stub.describe(first)
    assert info.run_id == first and info.outcome is not None and info.outcome.status == "continued"
    assert info.outcome.continued_as == middle
    assert stub.describe().run_id == last and stub.run_id == last  # the stub stays on the current run

    code, out = _cli("history", stub.id, "--run", first)
    assert code == 0 and f"(run {first})" in out and "WorkflowContinuedAsNew" in out, out
    code, out = _cli("describe", stub.id, "--run", middle, "--json")
    assert code == 0 and json.loads(out)["run_id"] == middle, out
    code, out = _cli("history", stub.id, "--run", first, "--json")
    assert code == 0 and json.loads(out)[-1]["type"] == "WorkflowContinuedAsNew", out


def test_a_run_that_is_not_the_ids_is_not_found(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(Looper, id="er-mine").start(0, 0)
    # Another id's run in the same partition (the run keys sit side by side there).
    same = next(
        f"er-other-{i}"
        for i in range(1000)
        if store.keys.partition(f"er-other-{i}") == store.keys.partition(stub.id)
    )
    other = WorkflowStub.make(Looper, id=same).start(0, 0)
    stub.result(timeout=30)
    for run_id in (other.run_id, "nope", "x" * 10_000):
        try:
            stub.history(run_id)
        except WorkflowNotFound as exc:
            assert f"workflow {stub.id!r} has no run" in str(exc) and len(str(exc)) < 300
        else:
            raise AssertionError(f"history({run_id[:20]!r}) of another id's run")
    code, out = _cli("describe", stub.id, "--run", "nope")
    assert code == 1 and f"error: workflow {stub.id!r} has no run 'nope'" in out, out
