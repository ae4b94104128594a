"""Why no live worker can move a run, from run records and registry entries (no Redis)."""

from __future__ import annotations

import os
from pathlib import Path

from procs import ROOT, TESTS, spawn_logged_worker, stop
from waiting import wait_for

from durable.store.workers import WorkerInfo, no_worker_reason

_ORDERS = WorkerInfo(
    "w1", queues=("default",), workflows=("Order",), activities=("charge", "ship"), complete=True
)


def _record(**fields: object) -> dict[str, object]:
    return {"workflow_id": "o-1", "type": "Order", "status": "suspended", "queue": "default", **fields}


def test_a_run_its_queues_workers_can_decide_is_not_reported() -> None:
    assert no_worker_reason(_record(), [_ORDERS]) is None


def test_a_type_no_worker_of_the_queue_defines_is_named_with_what_they_define() -> None:
    other_queue = WorkerInfo("w2", queues=("billing",), workflows=("Invoice",), complete=True)
    reason = no_worker_reason(_record(type="Ordr"), [_ORDERS, other_queue])
    assert reason == (
        "no live worker of queue 'default' defines workflow type 'Ordr', did you mean 'Order'? (they define 'Order'): "
        "start a worker whose --app defines it (a class renamed since the run started keeps its old "
        "name with `name = 'Ordr'` on it)"
    )
    # A worker of another queue defining it does not help; one of this queue does.
    assert no_worker_reason(_record(type="Invoice"), [_ORDERS, other_queue]) is not None
    invoices = WorkerInfo("w3", queues=("default",), workflows=("Invoice",), complete=True)
    assert no_worker_reason(_record(type="Invoice"), [_ORDERS, invoices]) is None


def test_a_worker_whose_lists_may_be_partial_never_makes_a_run_look_blocked() -> None:
    """Started in-process (its plain-function activities register when first used), or an
    older release: its lists are not taken as all it can run."""
    partial = WorkerInfo("in-process", queues=("default",), workflows=("Order",), activities=("charge",))
    assert no_worker_reason(_record(type="Anything"), [partial]) is None
    assert no_worker_reason(_record(type="Anything"), [_ORDERS, partial]) is None
    pending = [{"kind": "activity", "id": "2", "name": "lazy_fn", "queue": "default"}]
    assert no_worker_reason(_record(snapshot={"pending": pending}), [partial]) is None


def test_a_pending_activity_no_worker_of_its_queue_defines_is_named() -> None:
    typo = [{"kind": "activity", "id": "2", "name": "shipp", "queue": "default"}]
    reason = no_worker_reason(_record(snapshot={"pending": typo}), [_ORDERS])
    assert (
        reason is not None and "defines activity 'shipp' (id 2), did you mean 'ship'? (they define" in reason
    )
    pending = [{"kind": "activity", "id": "2", "name": "refund", "queue": "default"}]
    reason = no_worker_reason(_record(snapshot={"pending": pending}), [_ORDERS])
    assert reason is not None and reason.startswith(
        "no live worker of queue 'default' defines activity 'refund' (id 2) (they define 'charge', 'ship')"
    )
    assert (
        "a function keeps its old name with `@register_activity(name='refund')`, an Activity class with `name = 'refund'` in its body)"
        in reason
    ), reason
    defined = [{"kind": "activity", "id": "2", "name": "ship", "queue": "default"}]
    assert no_worker_reason(_record(snapshot={"pending": defined}), [_ORDERS]) is None


def test_a_pinned_run_counts_only_the_workers_of_its_build() -> None:
    v2 = WorkerInfo("w-v2", build="v2", queues=("default",), workflows=("Other",), complete=True)
    v1 = WorkerInfo("w-v1", build="v1", queues=("default",), workflows=("Order",), complete=True)
    assert no_worker_reason(_record(build="v1"), [v1, v2]) is None
    reason = no_worker_reason(_record(build="v2"), [v1, v2])
    assert reason is not None and "defines workflow type 'Order' (they define 'Other')" in reason


def test_closed_or_already_blocked_runs_are_not_reported() -> None:
    assert no_worker_reason(_record(type="Ordr", status="completed"), [_ORDERS]) is None
    assert no_worker_reason(_record(type="Ordr", blocked="NondeterminismError: ..."), [_ORDERS]) is None


def test_an_app_that_only_imports_its_workflow_classes_is_warned_of(redis_url: str, tmp_path: Path) -> None:
    """A worker runs the types its --app modules define: one whose app module imported them from
    elsewhere ran none of them, silently (its runs read "(they define )")."""
    (tmp_path / "importsonly.py").write_text("from apps.basic import Waiter  # noqa: F401\n")
    log = tmp_path / "worker.log"
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(TESTS), str(ROOT)])}
    proc = spawn_logged_worker(redis_url, log, app="importsonly", env=env)
    try:
        wait_for(lambda: "serving queues" in log.read_text(), timeout=30)
    finally:
        stop(proc)
    said = log.read_text()
    assert "the --app modules import Waiter (apps.basic) from other modules" in said, said
    assert "(--app apps.basic)" in said
