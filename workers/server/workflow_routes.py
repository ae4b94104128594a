"""``/api/v1/workflows``: list, start, describe, history, and the actions on one run."""

from __future__ import annotations

import json
from typing import Any

import durable
from durable import HistoryEvent, WorkflowStub
from durable.errors import WorkflowClosed
from durable.runinfo import NO_LIVE_WORKER
from durable.store.redis_store import CLOSED_STATUSES
from durable.store.run_list import LIST_FIELDS
from durable.store.workers import WorkerInfo, no_worker_reason
from workers.cli.fleet import check_startable
from workers.server.endpoint import Call, Endpoint, Param
from workers.server.errors import ApiError

__all__ = ["ENDPOINTS", "MAX_HISTORY_PAGE", "MAX_LIST_PAGE"]

MAX_LIST_PAGE = 500
"""Most runs one page of the runs list holds."""
MAX_HISTORY_PAGE = 10_000
"""Most events one page of a history holds."""

_STATUSES = (
    "pending",
    "running",
    "suspended",
    "cancelling",
    "completed",
    "failed",
    "cancelled",
    "terminated",
    "continued",
    "blocked",
)


def _stub(call: Call) -> WorkflowStub:
    return WorkflowStub.load(call.path["id"], store=call.store)


def list_workflows(call: Call) -> dict[str, Any]:
    if call.arg("where") is not None:
        return _search_workflows(call)
    status = call.arg("status")
    if status is not None and status not in _STATUSES:
        raise ApiError("invalid_argument", f"unknown status {status!r}; one of {', '.join(_STATUSES)}")
    limit = call.arg("limit", int, 50)
    if not 1 <= limit <= MAX_LIST_PAGE:
        raise ApiError("invalid_argument", f"limit must be 1..{MAX_LIST_PAGE}")
    try:
        page = call.store.list_runs_page(
            status=status,
            workflow_type=call.arg("type"),
            id_prefix=call.arg("id_prefix"),
            since_ms=call.time_arg("since"),
            until_ms=call.time_arg("until"),
            cursor=call.arg("before"),
            limit=limit,
        )
    except ValueError:
        raise ApiError("invalid_argument", "'before' must be a 'next' cursor of a page, or UTC ms") from None
    live = call.store.live_workers()
    rows = [_list_row(record, live) for record in page.runs]
    return {"workflows": rows, "next": page.next, "scanned": page.scanned}


_ROW_FIELDS = (*LIST_FIELDS, "run_id", "partition", "created", "search_attributes")


def _list_row(record: dict[str, Any], live: list[WorkerInfo]) -> dict[str, Any]:
    """A runs-list row: the light fields only, a run no live worker serves shown as blocked."""
    row = {k: record[k] for k in _ROW_FIELDS if k in record}
    reason = no_worker_reason(record, live)
    if reason and not row.get("blocked"):
        row.update(blocked=reason, blocked_kind=NO_LIVE_WORKER)
    row["build_id"] = row.pop("build", None) or None
    return row


def _search_workflows(call: Call) -> dict[str, Any]:
    """The runs list by a ``where`` expression (docs/search.md), ANDed with status, type and time."""
    if call.arg("id_prefix") or call.arg("status") == "blocked":
        raise ApiError("invalid_argument", "'where' cannot be combined with id_prefix or status=blocked")
    limit = call.arg("limit", int, 50)
    if not 1 <= limit <= MAX_LIST_PAGE:
        raise ApiError("invalid_argument", f"limit must be 1..{MAX_LIST_PAGE}")
    clauses = [f"({call.arg('where')})"] if call.arg("where", str, "").strip() else []
    for name, field in (("status", "status"), ("type", "type")):
        if call.arg(name):
            clauses.append(f"{field} = {json.dumps(call.arg(name))}")
    for name, op in (("since", ">="), ("until", "<=")):
        if (ms := call.time_arg(name)) is not None:
            clauses.append(f"started {op} {ms}")
    before = call.arg("before")
    if before is not None and not str(before).isdigit():
        raise ApiError("invalid_argument", "with 'where', 'before' is the 'next' of the previous page (ms)")
    rows = durable.list_runs(
        " and ".join(clauses), limit=limit, before=int(before) if before else None, store=call.store
    )
    live = call.store.live_workers()
    more = len(rows) == limit
    return {
        "workflows": [_list_row(record, live) for record in rows],
        "next": str(rows[-1]["created"]) if more else None,
        "scanned": len(rows),
    }


def count_workflows(call: Call) -> dict[str, Any]:
    """Runs per status word (and in all) matching an optional ``where`` expression."""
    where = call.arg("where", str, "").strip()
    base = f"({where}) and " if where else ""
    counts = {
        status: durable.count_runs(f"{base}status = '{status}'", store=call.store)
        for status in _STATUSES
        if status != "blocked"
    }
    return {"counts": counts, "total": sum(counts.values())}


def start_workflow(call: Call) -> dict[str, Any]:
    workflow_type = call.field("type", str)
    if not workflow_type:
        raise ApiError("invalid_argument", "body field 'type' (the workflow type name) is required")
    stub = WorkflowStub.make(
        workflow_type,
        id=call.field("id", str),
        queue=call.field("queue", str),
        store=call.store,
        id_reuse_policy=call.field("id_reuse_policy", str, "allow_duplicate"),
        id_conflict_policy=call.field("id_conflict_policy", str),
        execution_timeout=call.field("execution_timeout", (str, int, float)),
        run_timeout=call.field("run_timeout", (str, int, float)),
        search_attributes=call.field("search_attributes", dict),
        memo=call.field("memo", dict),
    )
    args = call.args()
    warning = check_startable(call.store, workflow_type, stub.queue or "default", ())
    signal = call.field("signal", dict)
    if signal is None:
        stub.start(*args)
    else:  # signal-with-start: {"name": ..., "args": [...]}
        name, signal_args = signal.get("name"), signal.get("args", [])
        if not isinstance(name, str) or not isinstance(signal_args, list):
            raise ApiError("invalid_argument", 'body field \'signal\' must be {"name": str, "args": [...]}')
        stub.signal_with_start(name, *signal_args, start_args=args)
    return {"workflow_id": stub.id, "run_id": stub.run_id, "warning": warning}


def describe_workflow(call: Call) -> dict[str, Any]:
    return _stub(call).describe().to_dict()


def workflow_history(call: Call) -> dict[str, Any]:
    after = call.arg("after", int, 0)
    limit = call.arg("limit", int, 1000)
    if not 1 <= limit <= MAX_HISTORY_PAGE or after < 0:
        raise ApiError("invalid_argument", f"limit must be 1..{MAX_HISTORY_PAGE} and after >= 0")
    store = call.store
    ref = store.ref(call.path["id"])
    entries = store.history(ref, after)
    events = [HistoryEvent.from_entry(e).to_dict() for e in entries[:limit]]
    more = len(entries) > limit
    return {
        "workflow_id": ref.workflow_id,
        "run_id": ref.run_id,
        "events": events,
        "next_after": events[-1]["seq"] if more and events else None,
    }


def signal_workflow(call: Call) -> dict[str, Any]:
    name = call.path["name"]
    _stub(call).signal(name, *call.args())
    return {"workflow_id": call.path["id"], "signal": name, "delivered": True}


def query_workflow(call: Call) -> dict[str, Any]:
    return {"result": _stub(call).query(call.path["name"], *call.args())}


def update_workflow(call: Call) -> dict[str, Any]:
    stub = _stub(call)
    update = getattr(stub, "update", None)
    if update is None:
        raise ApiError("not_implemented", "updates are not available in this version of durable")
    return {"result": update(call.path["name"], *call.args())}


def cancel_workflow(call: Call) -> dict[str, Any]:
    _stub(call).cancel(call.field("reason", str, ""))
    return {"workflow_id": call.path["id"], "cancel_requested": True}


def terminate_workflow(call: Call) -> dict[str, Any]:
    _stub(call).terminate(call.field("reason", str, ""))
    return {"workflow_id": call.path["id"], "terminated": True}


def repair_workflow(call: Call) -> dict[str, Any]:
    """Like ``durable repair``: re-queue a blocked run, optionally dropping its blocking input
    or moving it to another build first."""
    workflow_id, store = call.path["id"], call.store
    drop = call.field("drop_input", bool, False)
    build = call.field("build_id", str, "")
    if not build:
        ref = store.repair(workflow_id, drop_input=drop)
        return {"workflow_id": workflow_id, "run_id": ref.run_id, "requeued": True, "dropped_input": drop}
    if drop:
        raise ApiError("invalid_argument", "drop_input and build_id go in two separate repairs")
    stub = WorkflowStub.load(workflow_id, store=store)
    if stub.status() in CLOSED_STATUSES:
        store.repair(workflow_id)  # raises "is <status>; nothing to repair"
    ref = store.repin(workflow_id, build)
    try:
        store.repair(workflow_id)
    except WorkflowClosed:
        pass  # the move itself queued a task and the new build's workers closed the run already
    return {"workflow_id": workflow_id, "run_id": ref.run_id, "requeued": True, "build_id": build}


_ID = "/api/v1/workflows/{id}"
_ARGS_BODY = '{"args": [...]}: the positional arguments as JSON values'
_REASON_BODY = '{"reason": "..."} (optional): recorded with the run'

ENDPOINTS = [
    Endpoint(
        "GET",
        "/api/v1/workflows",
        list_workflows,
        "read",
        "List runs, newest first",
        params=(
            Param("status", "string", "a status word, or 'blocked'"),
            Param("type", "string", "workflow type name"),
            Param("id_prefix", "string", "the start of the workflow id"),
            Param("since", "string", "created at or after (UTC ms or ISO 8601)"),
            Param("until", "string", "created at or before (UTC ms or ISO 8601)"),
            Param("before", "string", "the previous page's 'next' cursor"),
            Param("limit", "integer", f"runs per page, 1..{MAX_LIST_PAGE} (default 50)"),
            Param("where", "string", "a search expression (docs/search.md); not with id_prefix"),
        ),
    ),
    Endpoint(
        "GET",
        "/api/v1/workflow-counts",
        count_workflows,
        "read",
        "Count runs per status",
        params=(Param("where", "string", "only runs matching this search expression"),),
    ),
    Endpoint(
        "POST",
        "/api/v1/workflows",
        start_workflow,
        "operator",
        "Start a run",
        status=201,
        body='{"type": "...", "id": "..." (optional), "args": [...], "queue": "..." (optional)}',
    ),
    Endpoint("GET", _ID, describe_workflow, "read", "Describe the current run"),
    Endpoint(
        "GET",
        _ID + "/history",
        workflow_history,
        "read",
        "Read the current run's history (payloads decoded, hook tokens masked)",
        params=(
            Param("after", "integer", "only events after this seq (paging: the previous 'next_after')"),
            Param("limit", "integer", f"events per page, 1..{MAX_HISTORY_PAGE} (default 1000)"),
        ),
    ),
    Endpoint("POST", _ID + "/signal/{name}", signal_workflow, "operator", "Send a signal", body=_ARGS_BODY),
    Endpoint("POST", _ID + "/query/{name}", query_workflow, "read", "Call a query", body=_ARGS_BODY),
    Endpoint("POST", _ID + "/update/{name}", update_workflow, "operator", "Send an update", body=_ARGS_BODY),
    Endpoint("POST", _ID + "/cancel", cancel_workflow, "operator", "Request cancellation", body=_REASON_BODY),
    Endpoint(
        "POST", _ID + "/terminate", terminate_workflow, "operator", "Terminate the run", body=_REASON_BODY
    ),
    Endpoint(
        "POST",
        _ID + "/repair",
        repair_workflow,
        "operator",
        "Re-queue a blocked run",
        body='{"drop_input": false, "build_id": "..."} (both optional)',
    ),
]
"""The workflow routes, in the order the OpenAPI document lists them."""
