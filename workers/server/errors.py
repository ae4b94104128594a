"""The API's errors: one JSON shape, ``{"error": {"code", "message"}}``, with stable codes.

Every failure a route meets becomes an :class:`ApiError` (:func:`from_exception` maps
durable's and Redis's exceptions); anything else is logged here with its traceback
and answered ``500 internal`` without one: the API never serves a stack trace page.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from durable.errors import (
    ConfigurationError,
    DurableError,
    HookError,
    LimitExceeded,
    PayloadTooLarge,
    QueryBusy,
    RedisUnavailable,
    SerializationError,
    UnknownTypeError,
    WorkflowAlreadyStarted,
    WorkflowClosed,
    WorkflowNotFound,
)
from durable.schedules import ScheduleExists, ScheduleNotFound
from durable.store.connect import unavailable_kind
from durable.store.key_types import WrongKindOfKey
from durable.store.memory import REFUSALS, write_refusal
from workers.config import mask_secrets

__all__ = ["CODES", "ApiError", "from_exception"]

log = logging.getLogger("durable.server")

CODES: dict[str, tuple[int, str]] = {
    "bad_request": (400, "the request is malformed (e.g. its body is not JSON)"),
    "unauthorized": (401, "no bearer token, or one the server does not know"),
    "bad_signature": (401, "a hook body without the X-Durable-Signature the server's hook secret asks"),
    "forbidden": (403, "the token's role may not do this (read-only token on an action)"),
    "csrf": (403, "a state-changing request without a bearer token nor the X-Durable-Request header"),
    "not_found": (404, "no such workflow id, schedule or route"),
    "method_not_allowed": (405, "the route exists for another method"),
    "workflow_closed": (409, "the run is closed: it takes no more input"),
    "already_started": (409, "the workflow id has an open run"),
    "hook_token_unusable": (409, "the hook token is unknown, used or expired"),
    "schedule_exists": (409, "a schedule with that id exists"),
    "payload_too_large": (413, "the body exceeds the server's cap, or a payload the engine's limit"),
    "unsupported_media_type": (415, "the body is not application/json"),
    "invalid_argument": (422, "an argument has the wrong shape or type"),
    "limit_exceeded": (422, "a durable limit refused the request (see docs/errors.md)"),
    "unknown_type": (422, "the workflow type is not known to this server (start it with --app MODULE)"),
    "rejected": (422, "the engine refused the request; the message says why"),
    "update_failed": (422, "the update's handler raised: the message has its error type and text"),
    "busy": (
        429,
        "the server holds as many waiting calls (updates) as it allows, or every query thread is held by "
        "queries blocked in workflow code; try again shortly",
    ),
    "internal": (500, "an unexpected server error (logged by the server)"),
    "redis_unavailable": (503, "the server cannot reach Redis, or Redis refuses commands for now"),
    "redis_key_wrong_kind": (
        503,
        "a Redis key durable uses holds another kind of value (made by hand, or by another program "
        "sharing the database): the message names it and what to do",
    ),
    "redis_out_of_memory": (503, "Redis refuses writes: it reached maxmemory (the message says what to do)"),
    "redis_cannot_persist": (
        503,
        "Redis refuses writes: it cannot write to disk (the message says what to do)",
    ),
}
"""Every error code the API answers with: its HTTP status and what it means (also in the
OpenAPI document and docs/server.md)."""


class ApiError(Exception):
    """An error the API answers with :data:`CODES` ``[code]``'s status and ``message``."""

    def __init__(self, code: str, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = CODES[code][0]
        self.message = mask_secrets(message)
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}


_MAPPED: tuple[tuple[type[BaseException], str], ...] = (
    (WrongKindOfKey, "redis_key_wrong_kind"),
    (WorkflowNotFound, "not_found"),
    (ScheduleNotFound, "not_found"),
    (WorkflowClosed, "workflow_closed"),
    (WorkflowAlreadyStarted, "already_started"),
    (ScheduleExists, "schedule_exists"),
    (HookError, "hook_token_unusable"),
    (PayloadTooLarge, "payload_too_large"),
    (LimitExceeded, "limit_exceeded"),
    (QueryBusy, "busy"),
    (UnknownTypeError, "unknown_type"),
    (SerializationError, "invalid_argument"),
    (ConfigurationError, "invalid_argument"),
)


def from_exception(exc: BaseException) -> ApiError:
    """The :class:`ApiError` answering ``exc`` (unexpected ones are logged, traceback included)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RedisUnavailable) and exc.__cause__ is not None:
        exc = exc.__cause__  # what Redis said (unreachable, OOM, MISCONF) picks the answer below
    if isinstance(exc, UnknownTypeError) and "(worker: --app module)" in str(exc):
        # This process is the server: its own --app (a query replays the run here).
        told = _first_line(exc).replace("(worker: --app module)", "(start the server with --app MODULE)")
        return ApiError("unknown_type", told)
    for kind, code in _MAPPED:
        if isinstance(exc, kind):
            return ApiError(code, _first_line(exc))
    if isinstance(exc, DurableError):
        return ApiError("rejected", _first_line(exc))
    refusal = write_refusal(exc)
    if refusal is not None:
        log.warning("redis refuses writes: %s", _first_line(exc))
        said = REFUSALS[refusal]
        return ApiError(said.kind, f"{said.headline}: writes are refused; {said.remedy}")
    if isinstance(exc, redis.exceptions.AuthenticationError):
        log.warning("redis refuses the server's credentials: %s", mask_secrets(_first_line(exc)))
        return ApiError(
            "redis_unavailable",
            "Redis refuses the server's credentials: check the password (or ACL user) of its Redis URL",
        )
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        log.warning("redis unavailable: %s", mask_secrets(_first_line(exc)))
        return ApiError("redis_unavailable", "the server cannot reach Redis; try again")
    refused = unavailable_kind(exc)
    if refused is not None:  # BUSY, LOADING, a cluster down or failing over: not now, not a bug
        log.warning("redis unavailable (%s): %s", refused, mask_secrets(_first_line(exc)))
        return ApiError("redis_unavailable", f"Redis refuses commands for now ({refused}); try again")
    log.error("unexpected error: %s", mask_secrets(f"{type(exc).__name__}: {exc}"), exc_info=exc)
    return ApiError("internal", f"unexpected {type(exc).__name__}; see the server's log")


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
