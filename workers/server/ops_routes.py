"""The routes around the runs: health, hooks resumed by webhook, workers, schedules, dead letters."""

from __future__ import annotations

import dataclasses
from typing import Any

from durable import Schedule, ScheduleHandle, WorkflowStub
from durable.schedules import skip_reason
from durable.store.workers import drain_targets
from durable.untrusted import json_loads
from workers.cli.core import CliError
from workers.cli.fleet import check_defined, fleet_report
from workers.server.endpoint import Call, Endpoint, Param
from workers.server.errors import ApiError
from workers.server.workflow_routes import loaded_apps

__all__ = ["ENDPOINTS", "hook_payload"]


def healthz(call: Call) -> dict[str, Any]:
    """``{"status": "ok", "warnings": [...]}``; 503 ``redis_unavailable`` when Redis is
    unreachable, 503 ``redis_out_of_memory`` or ``redis_cannot_persist`` (with the reason) when
    it refuses writes at ``maxmemory`` or because it cannot write to disk: it still answers
    reads then, but no run can make progress. ``warnings``: the settings of Redis that can lose
    durable's data and a Redis nearly full (:func:`~durable.store.memory.setup_hazards`), and a
    loss of data a worker found (:mod:`durable.store.origins`), a key of the namespace holding
    another kind of value (made by hand); healthy meanwhile."""
    memory = call.store.memory_state()  # unreachable: the API's 503 redis_unavailable
    if memory.reason:
        raise ApiError(memory.kind or "redis_out_of_memory", memory.reason)
    losses = [loss.message() for loss in call.store.recent_data_losses()]
    return {"status": "ok", "warnings": list(memory.hazards) + losses + call.store.wrong_kind_warnings()}


def hook_payload(raw: bytes, content_type: str) -> Any:
    """What a webhook body delivers: its JSON value when it is JSON (or untyped and parses),
    else its text (UTF-8), else its bytes; an empty body delivers ``None``."""
    if not raw.strip():
        return None
    media = content_type.split(";")[0].strip().lower()
    if not media or media == "application/json" or media.endswith("+json"):
        try:
            # Standard JSON, as every other route reads it (NaN, Infinity, 1e400: refused, the
            # hook's single-use token not spent on a value other clients cannot read back).
            return json_loads(raw, standard=True)
        except ValueError as exc:
            if media:
                raise ApiError(
                    "bad_request", f"the body is not valid JSON (or nested too deeply to read): {exc}"
                ) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def resume_hook(call: Call) -> dict[str, Any]:
    payload = hook_payload(call.raw, call.headers.get("content-type", ""))
    WorkflowStub.resume_hook(call.path["token"], payload, store=call.store)
    return {"resumed": True}


def list_workers(call: Call) -> dict[str, Any]:
    return fleet_report(call.store)


def drain_worker(call: Call) -> dict[str, Any]:
    """As ``durable drain NAME``: the worker reads the ask at its next heartbeat."""
    try:
        (worker,) = drain_targets(call.store.live_workers(), [call.path["name"]])
    except LookupError as exc:
        raise ApiError("not_found", str(exc.args[0])) from None
    call.store.ask_drain([worker.name])
    return {"name": worker.name, "build_id": worker.build or None, "drain_asked": True}


def list_schedules(call: Call) -> dict[str, Any]:
    return {"schedules": [d.to_dict() for d in ScheduleHandle.list(store=call.store)]}


_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(Schedule) if f.init)
"""A schedule's body fields on a create: :class:`~durable.Schedule`'s, as ``durable schedule create`` takes them."""


def create_schedule(call: Call) -> dict[str, Any]:
    """As ``durable schedule create``: the schedule is validated whole before anything is
    written (422 ``invalid_argument`` naming the field); its id in use: 409 ``schedule_exists``."""
    schedule_id = call.field("id", str)
    if not schedule_id:
        raise ApiError("invalid_argument", "body field 'id' (the schedule's id) is required")
    # Each field is checked by Schedule itself (its message names the field).
    spec = {name: call.body[name] for name in _SPEC_FIELDS if name in call.body}
    if "args" in spec:
        spec["args"] = call.args()
    workflow = spec.get("workflow")
    if not isinstance(workflow, str):
        raise ApiError(
            "invalid_argument", "body field 'workflow' (the workflow type's name) must be a string"
        )
    schedule = Schedule(**spec)
    try:  # a type the server's --app does not define: as `durable schedule create --app`
        check_defined(workflow, loaded_apps())
    except CliError as exc:
        raise ApiError("unknown_type", str(exc)) from None
    handle = ScheduleHandle.create(schedule_id, schedule, store=call.store)
    return handle.describe().to_dict()


def delete_schedule(call: Call) -> dict[str, Any]:
    """As ``durable schedule delete``: the runs it started go on."""
    _schedule(call).delete()
    return {"id": call.path["id"], "deleted": True}


def backfill_schedule(call: Call) -> dict[str, Any]:
    """As ``durable schedule backfill --json``: the times covered and what became of each."""
    start, end = call.field("start", (str, int, float)), call.field("end", (str, int, float))
    if start is None or end is None:
        raise ApiError(
            "invalid_argument", "body fields 'start' and 'end' (ISO times or epoch seconds) are required"
        )
    done = _schedule(call).backfill(start, end, overlap=call.field("overlap", str))
    return {"id": call.path["id"], **done.to_dict()}


def _schedule(call: Call) -> ScheduleHandle:
    return ScheduleHandle(call.path["id"], store=call.store)


def describe_schedule(call: Call) -> dict[str, Any]:
    return _schedule(call).describe().to_dict()


def pause_schedule(call: Call) -> dict[str, Any]:
    _schedule(call).pause(call.field("note", str, ""))
    return {"id": call.path["id"], "paused": True}


def unpause_schedule(call: Call) -> dict[str, Any]:
    _schedule(call).unpause(call.field("note", str, ""))
    return {"id": call.path["id"], "paused": False}


def trigger_schedule(call: Call) -> dict[str, Any]:
    """As ``durable schedule trigger --json``: the outcome, and why a skipped one started nothing."""
    handle, overlap = _schedule(call), call.field("overlap", str)
    policy = overlap or str(handle.spec.overlap)
    workflow_id = handle.trigger(overlap=overlap)
    if workflow_id is None:
        return {
            "id": call.path["id"],
            "outcome": "skipped",
            "workflow_id": None,
            "reason": skip_reason(policy),
        }
    started = call.store.instance_statuses([workflow_id])[0] is not None
    return {
        "id": call.path["id"],
        "outcome": "started" if started else "buffered",
        "workflow_id": workflow_id,
    }


def dead_letters(call: Call) -> dict[str, Any]:
    limit = call.arg("limit", int, 100)
    if not 1 <= limit <= 1000:
        raise ApiError("invalid_argument", "limit must be 1..1000")
    # ``total``: all parked, of which the newest ``limit`` are shown (the page alone hid the rest).
    return {"dead_letters": call.store.dead_letters(count=limit), "total": call.store.dead_letter_count()}


_SCHEDULE = "/api/v1/schedules/{id}"
_NOTE_BODY = '{"note": "..."} (optional): shown by describe'

ENDPOINTS = [
    Endpoint("GET", "/healthz", healthz, "public", "Check the server and its Redis"),
    Endpoint(
        "POST",
        "/api/v1/hooks/{token}",
        resume_hook,
        "hook",
        "Resume a hook with the body as its payload (signed with X-Durable-Signature when the "
        "server has a hook secret)",
        body="any: a JSON body is delivered as its value, another as text",
    ),
    Endpoint(
        "GET",
        "/api/v1/workers",
        list_workers,
        "read",
        "List live workers, builds and queues (with each queue's backlog and lag)",
    ),
    Endpoint(
        "POST",
        "/api/v1/workers/{name}/drain",
        drain_worker,
        "operator",
        "Ask a worker to drain: it starts no new run, finishes the runs pinned to its build, then "
        "stops (within its next heartbeat, 2 s)",
        fields=(),
    ),
    Endpoint("GET", "/api/v1/schedules", list_schedules, "read", "List schedules"),
    Endpoint(
        "POST",
        "/api/v1/schedules",
        create_schedule,
        "operator",
        "Create a schedule",
        status=201,
        body='{"id": "...", "workflow": "...", "args": [...], "cron": "*/5 * * * *" or "every": "30s", '
        '"overlap": "skip", ...} (the fields of durable.Schedule)',
        fields=("id", *_SPEC_FIELDS),
    ),
    Endpoint("GET", _SCHEDULE, describe_schedule, "read", "Describe a schedule"),
    Endpoint(
        "POST",
        _SCHEDULE + "/pause",
        pause_schedule,
        "operator",
        "Pause a schedule",
        body=_NOTE_BODY,
        fields=("note",),
    ),
    Endpoint(
        "POST",
        _SCHEDULE + "/unpause",
        unpause_schedule,
        "operator",
        "Unpause a schedule",
        body=_NOTE_BODY,
        fields=("note",),
    ),
    Endpoint(
        "POST",
        _SCHEDULE + "/trigger",
        trigger_schedule,
        "operator",
        "Start a run of a schedule now",
        body='{"overlap": "..."} (optional): the overlap policy for this run',
        fields=("overlap",),
    ),
    Endpoint(
        "POST",
        _SCHEDULE + "/backfill",
        backfill_schedule,
        "operator",
        "Start the runs of the scheduled times between start and end, as if the schedule had run then",
        body='{"start": "2026-01-01T00:00:00Z", "end": "...", "overlap": "..." (optional)}',
        fields=("start", "end", "overlap"),
    ),
    Endpoint(
        "POST",
        _SCHEDULE + "/delete",
        delete_schedule,
        "operator",
        "Delete a schedule (the runs it started go on)",
        fields=(),
    ),
    Endpoint(
        "GET",
        "/api/v1/dead-letters",
        dead_letters,
        "read",
        "List parked tasks and inputs",
        params=(Param("limit", "integer", "the newest of the namespace, 1..1000 (default 100)"),),
    ),
]
"""The routes besides the workflows', in the order the OpenAPI document lists them."""
