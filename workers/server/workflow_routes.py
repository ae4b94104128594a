"""``/api/v1/workflows``: list, start, describe, history, and the actions on one run."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis

import durable
from durable import HistoryEvent, WorkflowStub, registry
from durable.batch import ACTIONS, for_open_runs
from durable.blocked import cancel_note, repair_note
from durable.client_updates import send_update
from durable.errors import ConfigurationError, DurableError
from durable.ids import check_build_id, new_run_id
from durable.search import parse_where
from durable.store.run_list import list_row
from durable.store.updates import update_result, wait_update
from durable.store.workers import FOUND_ON_READ, WorkerInfo
from durable.untrusted import decimal
from workers.cli.core import CliError
from workers.cli.fleet import blocked_page, check_startable, mark_unserved, marked
from workers.server.endpoint import STOPPING, Call, Endpoint, Param, json_response
from workers.server.errors import ApiError

__all__ = ["ENDPOINTS", "MAX_HISTORY_PAGE", "MAX_LIST_PAGE", "MAX_SEQ"]

T = TypeVar("T")

MAX_LIST_PAGE = 500
"""Most runs one page of the runs list holds."""
MAX_HISTORY_PAGE = 10_000
"""Most events one page of a history holds."""
MAX_SEQ = 2**53 - 1
"""Largest ``after`` a history page takes (a seq; JSON numbers are exact up to here)."""

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


_RUN_PARAM = Param(
    "run_id", "string", "an earlier run of the id (a continue-as-new chain); default: the current"
)


def list_workflows(call: Call) -> dict[str, Any]:
    """A page of the runs list, with ``problem``: why no run can move whatever its row says
    (:attr:`~durable.store.memory.MemoryState.reason`: Redis refuses writes at ``maxmemory``,
    as ``/api/v1/workers`` says it), else ``None``. One ``INFO memory`` (a read: it works under
    OOM; refused by an ACL, it says nothing)."""
    page = _workflows_page(call)
    page["problem"] = call.store.memory_state().reason
    return page


def _workflows_page(call: Call) -> dict[str, Any]:
    status = call.arg("status")
    if status is not None and status not in _STATUSES:
        raise ApiError("invalid_argument", f"unknown status {status!r}; one of {', '.join(_STATUSES)}")
    limit = call.arg("limit", int, 50)
    if not 1 <= limit <= MAX_LIST_PAGE:
        raise ApiError("invalid_argument", f"limit must be 1..{MAX_LIST_PAGE}")
    if call.arg("where") is not None:
        return _search_workflows(call, limit)
    filters: dict[str, Any] = {
        "workflow_type": call.arg("type"),
        "id_prefix": call.arg("id_prefix"),
        "since_ms": call.time_arg("since"),
        "until_ms": call.time_arg("until"),
    }
    try:
        if status == "blocked":
            return _blocked_page(call, limit, filters)
        page = call.store.list_runs_page(status=status, cursor=call.arg("before"), limit=limit, **filters)
    except ValueError:
        raise ApiError("invalid_argument", _BEFORE_HELP) from None
    live = call.store.live_workers()
    rows = [list_row(r) for r in marked(call.store, page.runs, live)]
    return {"workflows": rows, "next": page.next, "scanned": page.scanned}


_BEFORE_HELP = "'before' must be the 'next' cursor of a page ('<ms>:<run id>'), or UTC ms"


def _marked_rows(records: list[dict[str, Any]], live: list[WorkerInfo]) -> list[dict[str, Any]]:
    """Runs-list rows: the light fields only, a run no live worker can move shown as blocked
    (:func:`mark_unserved`: none serves its queue or build, or its activity's queue is starved)."""
    mark_unserved(records, live)
    return [list_row(record) for record in records]


def _blocked_page(call: Call, limit: int, filters: dict[str, Any]) -> dict[str, Any]:
    """``status=blocked``: :func:`~workers.cli.fleet.blocked_page`, as list rows."""
    page = blocked_page(call.store, limit=limit, cursor=call.arg("before"), **filters)
    return {"workflows": [list_row(r) for r in page.runs], "next": page.next, "scanned": page.scanned}


def _search_workflows(call: Call, limit: int) -> dict[str, Any]:
    """The runs list by a ``where`` expression (docs/search.md), ANDed with status, type and time."""
    if call.arg("id_prefix") or call.arg("status") == "blocked":
        raise ApiError("invalid_argument", "'where' cannot be combined with id_prefix or status=blocked")
    where = call.arg("where", str, "")
    clauses = [f"({where})"] if _checked_where(call, where) is not None else []
    for name in ("status", "type"):
        if call.arg(name):
            clauses.append(f"{name} = {_quoted(call.arg(name))}")
    for name, op in (("since", ">="), ("until", "<=")):
        if (ms := call.time_arg(name)) is not None:
            clauses.append(f"started {op} {ms}")
    before = call.arg("before")
    if before is not None and not _is_cursor(before):
        raise ApiError("invalid_argument", _BEFORE_HELP)
    rows = _searched(
        lambda: durable.list_runs(" and ".join(clauses), limit=limit, before=before, store=call.store)
    )
    live = call.store.live_workers()
    more = len(rows) == limit
    return {
        "workflows": _marked_rows(rows, live),
        # The last row's (ms, run id): a bare ms would skip the runs sharing its millisecond.
        "next": f"{rows[-1]['created']}:{rows[-1]['run_id']}" if more else None,
        "scanned": len(rows),
    }


def _is_cursor(value: str) -> bool:
    ms, _, _ = value.partition(":")
    return decimal(ms) is not None


def _quoted(value: str) -> str:
    """``value`` as a string literal of the ``where`` language (a quote doubled)."""
    return "'" + value.replace("'", "''") + "'"


def _checked_where(call: Call, where: str) -> Any:
    """The user's ``where`` parsed on its own (``None``: empty), so its errors point into what
    they typed, and it cannot close the parentheses the filters are combined with."""
    return _searched(lambda: parse_where(where, call.store.search_types()))


def _searched(read: Callable[[], T]) -> T:
    """``read()``; a bad expression (or one too costly) is a 422 worded for the API."""
    try:
        return read()
    except ConfigurationError as exc:
        raise ApiError("invalid_argument", str(exc).replace("--where", "where")) from None


def count_workflows(call: Call) -> dict[str, Any]:
    """Runs per status word (and in all) matching an optional ``where`` expression."""
    where = call.arg("where", str, "")
    base = f"({where}) and " if _checked_where(call, where) is not None else ""
    counts = _searched(
        lambda: {
            status: durable.count_runs(f"{base}status = '{status}'", store=call.store)
            for status in _STATUSES
            if status != "blocked"
        }
    )
    return {"counts": counts, "total": sum(counts.values())}


def start_workflow(call: Call) -> dict[str, Any]:
    workflow_type = call.field("type", str)
    if not workflow_type:
        raise ApiError("invalid_argument", "body field 'type' (the workflow type name) is required")
    stub = WorkflowStub.make(
        registry.workflows().get(workflow_type, workflow_type),  # the --app's class: args checked
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
    try:
        warning = check_startable(
            call.store, workflow_type, registry.start_queue(workflow_type, stub.queue), loaded_apps()
        )
    except CliError as exc:  # a type the server's --app does not define: as `durable start --app`
        raise ApiError("unknown_type", str(exc)) from None
    signal = call.field("signal", dict)
    if signal is None:
        stub.start(*args)
    else:  # signal-with-start: {"name": ..., "args": [...]}
        name, signal_args = signal.get("name"), signal.get("args", [])
        if not isinstance(name, str) or not isinstance(signal_args, list) or set(signal) - {"name", "args"}:
            raise ApiError("invalid_argument", 'body field \'signal\' must be {"name": str, "args": [...]}')
        stub.signal_with_start(name, *signal_args, start_args=args)
    # The CLI's line, without its "warning: " (the key says it).
    said = warning.removeprefix("warning: ") if warning else warning
    return {"workflow_id": stub.id, "run_id": stub.run_id, "warning": said}


def loaded_apps() -> list[str]:
    """The modules of the workflows this server process loaded (``durable server --app``,
    ``durable dev --app``); none: it knows no types, and any may be started by name."""
    return sorted({cls.__module__ for cls in registry.workflows().values()})


def describe_workflow(call: Call) -> dict[str, Any]:
    return _stub(call).describe(call.arg("run_id")).to_dict()


def workflow_history(call: Call) -> dict[str, Any]:
    after = call.arg("after", int, 0)
    limit = call.arg("limit", int, 1000)
    if not 0 <= after <= MAX_SEQ:
        # Checked here: past 2**64 Redis refuses the stream id (a 500), and no run gets near.
        raise ApiError("invalid_argument", f"query parameter 'after' must be 0..{MAX_SEQ} (an event seq)")
    if not 1 <= limit <= MAX_HISTORY_PAGE:
        raise ApiError("invalid_argument", f"query parameter 'limit' must be 1..{MAX_HISTORY_PAGE}")
    store = call.store
    ref = store.ref(call.path["id"], call.arg("run_id"))
    entries = store.history(ref, after, count=limit + 1)  # (a page, not the whole history each time)
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


UPDATE_WAIT_S = 10.0
"""How long the update route waits for the outcome unless the body says (``timeout``)."""
MAX_UPDATE_WAIT_S = 60.0
UPDATE_SLICE_S = 1.0
"""How often a waiting update call looks whether its client is still there."""
MAX_WAITING_UPDATES = 16
"""Update calls waiting at once: the server's threads are shared with every other route (40),
so waits on runs no worker moves must not take them all (healthz included)."""
_waiting = threading.BoundedSemaphore(MAX_WAITING_UPDATES)


def update_workflow(call: Call) -> Any:
    """Deliver an update and wait for its outcome, at most ``timeout`` seconds: past it, ``202``
    with the update's id (POST again with it to go on waiting: it runs once)."""
    stub = _stub(call)
    timeout = call.field("timeout", (int, float), UPDATE_WAIT_S)
    if isinstance(timeout, bool) or not 0 <= timeout <= MAX_UPDATE_WAIT_S:
        raise ApiError("invalid_argument", f"timeout must be 0..{MAX_UPDATE_WAIT_S:g} seconds")
    update_id = call.field("update_id", str, "") or f"u-{new_run_id().lower()}"  # as the client makes them
    if not _waiting.acquire(blocking=False):
        raise ApiError("busy", f"{MAX_WAITING_UPDATES} update calls are waiting already; try again shortly")
    try:
        result = _update_while_heard(call, stub, timeout, update_id)
    except TimeoutError as exc:
        said = str(exc).split("; call update() again", 1)[0]  # the Python client's words, not the API's
        if STOPPING.is_set():  # (a deploy): its caller keeps the id, or a retry would run it twice
            said = f"update {update_id} is delivered and the server is stopping before its outcome came"
        message = f"{said}; POST again with this update_id to go on waiting (it runs once)"
        why = call.store.why_blocked(call.store.run_record(call.store.ref(stub.id)))
        if why is not None:  # as `durable update` says it: nothing can run it now
            message += (
                f"; no live worker can run it now: {why.message} (it stays delivered and runs when one can)"
            )
        return json_response({"update_id": update_id, "pending": True, "message": message}, 202)
    except (DurableError, redis.RedisError, OSError):
        raise
    except Exception as exc:  # noqa: BLE001 - what the update's handler raised, as it raised it
        raise ApiError(
            "update_failed", f"update {call.path['name']!r} raised {type(exc).__name__}: {exc}"
        ) from None
    finally:
        _waiting.release()
    return {"result": result, "update_id": update_id}


def _update_while_heard(call: Call, stub: WorkflowStub, timeout: float, update_id: str) -> Any:
    """Deliver the update once and wait for its outcome, in slices of :data:`UPDATE_SLICE_S`:
    a call whose client hung up gives its thread and its slot back within a slice, not at its
    ``timeout`` (``TimeoutError`` then, answered to no one; the update stays delivered)."""
    store, name, args = call.store, call.path["name"], call.args()
    ref, uid, after = send_update(store, stub.workflow_type, stub.id, name, args, update_id)
    deadline = time.monotonic() + timeout
    while True:
        slice_end = min(deadline, time.monotonic() + UPDATE_SLICE_S)
        try:
            return update_result(wait_update(store, ref, uid, after, slice_end), stub.id, name)
        except TimeoutError:
            if slice_end >= deadline or call.gone.is_set() or STOPPING.is_set():
                raise


def cancel_workflow(call: Call) -> dict[str, Any]:
    stub = _stub(call)
    stub.cancel(call.field("reason", str, ""))
    note = cancel_note(call.path["id"], stub.blocked(), FOUND_ON_READ)
    return {"workflow_id": call.path["id"], "cancel_requested": True, "note": note}


def terminate_workflow(call: Call) -> dict[str, Any]:
    _stub(call).terminate(call.field("reason", str, ""))
    return {"workflow_id": call.path["id"], "terminated": True}


def repair_workflow(call: Call) -> dict[str, Any]:
    """Like ``durable repair``: re-queue a blocked run, optionally dropping its blocking input
    or moving it to another build (or, ``unversioned``, to unversioned workers) first."""
    workflow_id, store = call.path["id"], call.store
    drop = call.field("drop_input", bool, False)
    build = call.field("build_id", str, "")
    unversioned = call.field("unversioned", bool, False)
    if build and unversioned:
        raise ApiError("invalid_argument", "give build_id (a build) or unversioned (no build), not both")
    if build:
        try:
            check_build_id(build, "build_id")
        except ConfigurationError as exc:
            raise ApiError("invalid_argument", str(exc)) from None
    if not build and not unversioned:
        was = _stub(call).blocked()
        ref = store.repair(workflow_id, drop_input=drop)
        note = repair_note(was, FOUND_ON_READ)
        return {
            "workflow_id": workflow_id,
            "run_id": ref.run_id,
            "requeued": True,
            "dropped_input": drop,
            "note": note,
        }
    if drop:
        raise ApiError(
            "invalid_argument", "drop_input and build_id (or unversioned) go in two separate repairs"
        )
    ref, _ = store.repair_on(workflow_id, build)  # closed since: the new build's workers finished it
    # Moved where nothing runs it yet (no live worker of that build): said now, not only by describe.
    warning = store.unserved_reason(store.run_record(ref))
    return {
        "workflow_id": workflow_id,
        "run_id": ref.run_id,
        "requeued": True,
        "build_id": build or None,
        "warning": warning,
    }


MAX_BATCH = 1000
"""Runs one batch call goes to at most (``more``: call again for the rest)."""


def batch_workflows(call: Call) -> dict[str, Any]:
    """As ``durable cancel|terminate --where``: every open run ``where`` selects, at most
    ``limit`` of them (1..1000, default 1000) per call; ``more`` says some are left, and the
    next call passes ``next`` as its ``before`` (a cancelled run stays open until a worker
    applies the cancel: without it the same runs would be selected again)."""
    action = call.path["action"]
    if action not in ACTIONS:
        raise ApiError("not_found", f"no batch action {action!r}: cancel or terminate")
    where = call.field("where", str, "")
    if not where.strip():
        raise ApiError(
            "invalid_argument", "body field 'where' is required: the search expression selecting the runs"
        )
    most = call.field("limit", int, MAX_BATCH)
    if isinstance(most, bool) or not 1 <= most <= MAX_BATCH:
        raise ApiError("invalid_argument", f"body field 'limit' must be 1..{MAX_BATCH}")
    before = call.field("before", str)
    if before is not None and not _is_cursor(before):
        raise ApiError("invalid_argument", "body field 'before' must be the previous call's 'next'")
    reason = call.field("reason", str, "")
    report = _searched(
        lambda: for_open_runs(where, action, reason, store=call.store, most=most, before=before)
    )
    return {"action": action, "where": where, **report.to_dict()}


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
            Param("before", "string", "the previous page's 'next' cursor ('<ms>:<run id>'), or UTC ms"),
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
        fields=(
            "type",
            "id",
            "args",
            "queue",
            "id_reuse_policy",
            "id_conflict_policy",
            "execution_timeout",
            "run_timeout",
            "search_attributes",
            "memo",
            "signal",
        ),
    ),
    Endpoint("GET", _ID, describe_workflow, "read", "Describe the current run", params=(_RUN_PARAM,)),
    Endpoint(
        "GET",
        _ID + "/history",
        workflow_history,
        "read",
        "Read the current run's history (payloads decoded, hook tokens masked)",
        params=(
            Param(
                "after",
                "integer",
                f"only events after this seq, 0..{MAX_SEQ} (paging: the previous 'next_after')",
            ),
            Param("limit", "integer", f"events per page, 1..{MAX_HISTORY_PAGE} (default 1000)"),
            _RUN_PARAM,
        ),
    ),
    Endpoint(
        "POST",
        _ID + "/signal/{name}",
        signal_workflow,
        "operator",
        "Send a signal",
        body=_ARGS_BODY,
        fields=("args",),
    ),
    Endpoint(
        "POST",
        _ID + "/query/{name}",
        query_workflow,
        "read",
        "Call a query",
        body=_ARGS_BODY,
        fields=("args",),
    ),
    Endpoint(
        "POST",
        _ID + "/update/{name}",
        update_workflow,
        "operator",
        "Send an update",
        body='{"args": [...], "timeout": seconds to wait (default 10, at most 60), "update_id": "..."}: '
        "202 with the update_id when the outcome is not there in time (POST again with it)",
        fields=("args", "timeout", "update_id"),
        waits=True,
    ),
    Endpoint(
        "POST",
        _ID + "/cancel",
        cancel_workflow,
        "operator",
        "Request cancellation",
        body=_REASON_BODY,
        fields=("reason",),
    ),
    Endpoint(
        "POST",
        _ID + "/terminate",
        terminate_workflow,
        "operator",
        "Terminate the run",
        body=_REASON_BODY,
        fields=("reason",),
    ),
    Endpoint(
        "POST",
        "/api/v1/batch/{action}",
        batch_workflows,
        "operator",
        "Cancel or terminate every open run a search expression selects",
        body='{"where": "...", "reason": "...", "limit": 1000, "before": "<the last call\'s next>"} '
        "(all but where optional)",
        fields=("where", "reason", "limit", "before"),
    ),
    Endpoint(
        "POST",
        _ID + "/repair",
        repair_workflow,
        "operator",
        "Re-queue a blocked run",
        body='{"drop_input": false, "build_id": "...", "unversioned": false} (all optional)',
        fields=("drop_input", "build_id", "unversioned"),
    ),
]
"""The workflow routes, in the order the OpenAPI document lists them."""
