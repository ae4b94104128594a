"""Batch operations: ``durable cancel --where`` and ``durable terminate --where`` (the open runs
an expression selects, counted, confirmed with ``--yes``, then each sent the call its id would
get), and ``POST /api/v1/batch/{action}`` (the UI's buttons: ``tests/test_ui.py``).

Real ``durable`` processes, a real worker and a real server on the shared test Redis; each is
stopped by pid in a ``finally``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from apps.basic import Sequence, Waiter
from procs import durable_cli, spawn_worker, stop
from server_procs import ServerProc
from waiting import wait_for

from durable import WorkflowStub
from durable.batch import PAGE
from durable.listing import count_runs
from durable.store.redis_store import RedisStore


@pytest.fixture
def store(redis_url: str):
    s = RedisStore(redis_url)
    try:
        yield s
    finally:
        s.close()


def test_terminate_where_closes_the_open_runs_it_selects_and_no_other(
    redis_url: str, store: RedisStore
) -> None:
    waiting = [WorkflowStub.make(Waiter, id=f"bulk-{i}", store=store).start(3600).id for i in range(7)]
    other = WorkflowStub.make(Sequence, id="bulk-other", store=store).start(2).id  # no worker: stays open
    done = WorkflowStub.make(Waiter, id="bulk-closed", store=store).start(3600)
    done.terminate("earlier")

    refused = durable_cli(redis_url, "terminate", "--where", "type = 'Waiter'")  # no terminal, no --yes
    assert refused.returncode == 1, refused
    assert refused.stderr.startswith("error: 7 open runs match \"type = 'Waiter'\": pass --yes"), (
        refused.stderr
    )
    assert {WorkflowStub.load(w, store=store).status() for w in waiting} == {"pending"}

    both = durable_cli(redis_url, "terminate", "bulk-1", "--where", "type = 'Waiter'", "--yes")
    assert both.returncode == 1 and "a workflow ID or --where EXPR" in both.stderr, both.stderr

    ran = durable_cli(redis_url, "terminate", "--where", "type = 'Waiter'", "--reason", "bad deploy", "--yes")
    assert ran.returncode == 0, ran.stderr
    assert sorted(ran.stdout.split()) == sorted(waiting)
    assert ran.stderr.strip() == "terminate: 7 of 7 runs"
    for workflow_id in waiting:
        stub = WorkflowStub.load(workflow_id, store=store)
        assert stub.status() == "terminated"
        assert "bad deploy" in durable_cli(redis_url, "status", workflow_id).stdout
    assert WorkflowStub.load(other, store=store).status() == "pending"
    assert "earlier" in durable_cli(redis_url, "status", "bulk-closed").stdout  # a closed run untouched

    again = durable_cli(redis_url, "terminate", "--where", "type = 'Waiter'", "--yes")
    assert again.returncode == 0 and again.stdout.strip() == "no open run matches \"type = 'Waiter'\"", again
    bad = durable_cli(redis_url, "terminate", "--where", "type = ", "--yes")
    assert bad.returncode == 1 and bad.stderr.startswith("error: "), bad.stderr


def test_cancel_where_lets_each_selected_run_clean_up(redis_url: str, store: RedisStore) -> None:
    waiting = [WorkflowStub.make(Waiter, id=f"bulk-c{i}", store=store).start(3600).id for i in range(4)]
    kept = WorkflowStub.make(Waiter, id="bulk-kept", queue="elsewhere", store=store).start(3600).id
    worker = spawn_worker(redis_url)
    try:
        wait_for(lambda: {WorkflowStub.load(w, store=store).status() for w in waiting} == {"suspended"})
        ran = durable_cli(redis_url, "cancel", "--where", "type = 'Waiter' and queue = 'default'", "--yes")
        assert ran.returncode == 0, ran.stderr
        assert sorted(ran.stdout.split()) == sorted(waiting)
        assert ran.stderr.strip() == "cancel: 4 of 4 runs"
        wait_for(lambda: {WorkflowStub.load(w, store=store).status() for w in waiting} == {"cancelled"})
        assert WorkflowStub.load(kept, store=store).status() == "pending"
        # A blocked run is cancelled once it moves again: said, as a single `durable cancel` says it.
        WorkflowStub.make(Waiter, id="bulk-stuck", queue="nowhere", store=store).start(3600)
        stuck = durable_cli(redis_url, "cancel", "--where", "queue = 'nowhere'", "--yes")
        assert stuck.stdout.split() == ["bulk-stuck"], stuck
        assert "1 of them are blocked, so their cancel takes effect only once they move again" in stuck.stderr
        # Not selected: once a worker of its queue decides it, it waits (a cancel would end it).
        elsewhere = spawn_worker(redis_url, extra=("--queue", "elsewhere"))
        try:
            wait_for(lambda: WorkflowStub.load(kept, store=store).status() == "suspended")
        finally:
            stop(elsewhere)
    finally:
        stop(worker)


def test_the_api_batch_goes_to_at_most_limit_runs_and_says_what_is_left(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    waiting = [WorkflowStub.make(Waiter, id=f"api-bulk-{i}", store=store).start(3600).id for i in range(5)]
    other = WorkflowStub.make(Sequence, id="api-bulk-other", store=store).start(2).id
    server = ServerProc(redis_url, tmp_path / "server.log")
    try:
        with server.client(**{"X-Durable-Request": "1"}) as http:
            body = {"where": "type = 'Waiter'", "reason": "api batch", "limit": 3}
            first = http.post("/api/v1/batch/terminate", json=body)
            assert first.status_code == 200, first.text
            assert len(first.json()["done"]) == 3 and first.json()["more"] is True
            assert first.json()["closed"] == [] and first.json()["refused"] == {}
            rest = http.post("/api/v1/batch/terminate", json=body).json()
            assert len(rest["done"]) == 2 and rest["more"] is False
            assert sorted(first.json()["done"] + rest["done"]) == sorted(waiting)
            assert http.post("/api/v1/batch/terminate", json=body).json()["done"] == []

            no_where = http.post("/api/v1/batch/cancel", json={"reason": "x"})
            assert no_where.status_code == 422 and "'where' is required" in no_where.text, no_where.text
            unknown = http.post("/api/v1/batch/pause", json={"where": "type = 'Waiter'"})
            assert unknown.status_code == 404, unknown.text
            for limit in (0, 1001, True, "3"):
                bad = http.post("/api/v1/batch/cancel", json={"where": "type = 'Waiter'", "limit": limit})
                assert bad.status_code == 422, (limit, bad.text)
            syntax = http.post("/api/v1/batch/cancel", json={"where": "type = "})
            assert syntax.status_code == 422, syntax.text
            assert "position 8" in syntax.text, syntax.text  # of its own text, not of a wrapped one
            # A ')' of its own closed the wrapping parenthesis and undid "open runs only".
            escape = http.post("/api/v1/batch/cancel", json={"where": "type = 'Waiter') or (type = 'Nope'"})
            assert escape.status_code == 422, escape.text
        for workflow_id in waiting:
            assert WorkflowStub.load(workflow_id, store=store).status() == "terminated"
        assert WorkflowStub.load(other, store=store).status() == "pending"
    finally:
        server.stop()


def test_api_cancel_batches_go_on_from_next_instead_of_the_same_runs(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    """A cancelled run stays open until a worker applies the cancel: every call selected the same
    newest runs again, and the UI's loop ("call again while more") never ended."""
    waiting = [WorkflowStub.make(Waiter, id=f"api-next-{i}", store=store).start(3600).id for i in range(5)]
    server = ServerProc(redis_url, tmp_path / "server.log")
    try:
        with server.client(**{"X-Durable-Request": "1"}) as http:
            body: dict = {"where": "type = 'Waiter'", "limit": 2}
            sent: list[str] = []
            for _ in range(5):
                out = http.post("/api/v1/batch/cancel", json=body).json()
                sent += out["done"]
                if not out["more"]:
                    assert out["next"] is None
                    break
                body["before"] = out["next"]
            assert sorted(sent) == sorted(waiting)  # each once, all of them
            bad = http.post("/api/v1/batch/cancel", json={"where": "type = 'Waiter'", "before": "x"})
            assert bad.status_code == 422, bad.text
        assert all(WorkflowStub.load(w, store=store).describe().extra["cancel_requested"] for w in waiting)
    finally:
        server.stop()


def test_a_batch_past_one_page_reaches_every_selected_run_once(redis_url: str, store: RedisStore) -> None:
    """More runs than a page (PAGE = 500): the pages follow one another, none skipped or
    taken twice, while the runs already done leave the open set the query reads."""
    total = PAGE * 2 + 37
    ids = [WorkflowStub.make(Waiter, id=f"page-{i:04d}", store=store).start(3600).id for i in range(total)]
    ran = durable_cli(redis_url, "terminate", "--where", "type = 'Waiter'", "--yes")
    assert ran.returncode == 0, ran.stderr
    said = ran.stdout.split()
    assert len(said) == total and sorted(said) == sorted(ids)
    assert ran.stderr.strip() == f"terminate: {total} of {total} runs"
    assert count_runs("status = 'terminated'", store=store) == total
