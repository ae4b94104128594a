"""The exception hierarchy of durable.

Every error durable raises on purpose derives from :class:`DurableError`, so
``except durable.DurableError`` catches them all. The one exception is
:class:`CancelledError`, which derives from :class:`BaseException` (as
``asyncio.CancelledError`` does) so that a generic ``except Exception`` in
workflow code does not swallow a cancellation.
"""

from __future__ import annotations

import traceback
from typing import Any


class DurableError(Exception):
    """Root of every error durable raises on purpose."""


class ConfigurationError(DurableError):
    """A definition or setting is invalid (bad RetryPolicy, duplicate names, bad URL)."""


class SerializationError(DurableError):
    """A value cannot be encoded or decoded by the payload codec.

    Attributes:
        path: Where the value sits, e.g. ``args[1]['when']``.
        type_name: The qualified name of the offending type.
    """

    def __init__(self, message: str, *, path: str = "", type_name: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.type_name = type_name


class LimitExceeded(DurableError):
    """A configured limit was exceeded (payload size, history size, pending work, name length).

    The message names the limit, its value and the environment variable that raises it
    (see :mod:`durable.limits` and ``docs/operations.md``, "Limits").

    Attributes:
        limit: The :class:`~durable.limits.Limits` field, e.g. ``max_payload_bytes``.
        value: The limit's value in this process.
        actual: The size or count that broke it, when known.
    """

    def __init__(self, message: str, *, limit: str = "", value: int = 0, actual: int | None = None) -> None:
        super().__init__(message)
        self.limit = limit
        self.value = value
        self.actual = actual


class PayloadTooLarge(LimitExceeded, SerializationError):
    """An encoded payload is larger than ``max_payload_bytes`` (nothing was written).

    Also a :class:`SerializationError`, so code that handles encoding errors handles it too.
    """

    def __init__(self, message: str, *, limit: str = "", value: int = 0, actual: int | None = None) -> None:
        LimitExceeded.__init__(self, message, limit=limit, value=value, actual=actual)
        self.path = ""
        self.type_name = ""


class NondeterminismError(DurableError):
    """Workflow code issued a different command than its history recorded.

    The run is *blocked*, not failed: deploy code that decides as before, then
    ``durable repair ID`` re-queues it.

    Attributes:
        run_id: The run.
        command_id: The id of the command that differs.
        recorded: What history has there (its compared fields), or ``None``.
        issued: What the code issued, or ``None``.
        where: ``file:line in function`` of the workflow code that issued it (``""``: the code
            did not issue a command history has).
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str = "",
        command_id: str = "",
        recorded: Any = None,
        issued: Any = None,
        where: str = "",
    ) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.command_id = command_id
        self.recorded = recorded
        self.issued = issued
        self.where = where


class WorkflowTaskFailed(DurableError):
    """Workflow code raised an error its class lists in ``Workflow.block_on_errors``.

    Raised inside the worker, never to workflow code: the run is *blocked*, not failed (as a
    Temporal workflow task failure), so a bug of a bad deploy (a ``NameError``, an
    ``AttributeError``) costs no run. Deploy the fix, then ``durable repair ID`` (or
    ``durable repair --blocked``) replays the run with the fixed code.

    Attributes:
        run_id: The blocked run.
        error_type: The type name of the error the code raised.
        where: ``file:line in function`` of the innermost frame that raised it (``""`` when unknown).
    """

    def __init__(self, message: str, *, run_id: str = "", error_type: str = "", where: str = "") -> None:
        super().__init__(message)
        self.run_id = run_id
        self.error_type = error_type
        self.where = where


class HistoryCorrupt(DurableError):
    """A history or inbox entry is malformed, foreign or of an unknown type."""

    def __init__(self, message: str, *, run_id: str = "", seq: int | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.seq = seq


class HistoryTooNew(DurableError):
    """A history entry was written by a newer release of durable than this process runs.

    Its event uses a history format (:mod:`durable.history_format`) this release does not read:
    replaying it here would take another path than the code took when it was recorded. A worker
    leaves the run to a worker of a newer release (and parks it, ``needs_upgrade``, when none
    runs); a query or ``durable replay`` raises this: upgrade durable in this process.

    Attributes:
        run_id: The run whose history it is (``""`` when not known).
        seq: The entry's position in the history (0 for an inbox entry).
        needed: The history format the entry needs.
        reads: The newest history format this process reads.
    """

    def __init__(
        self, message: str, *, run_id: str = "", seq: int = 0, needed: int = 0, reads: int = 0
    ) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.seq = seq
        self.needed = needed
        self.reads = reads


class EventConflict(DurableError):
    """A decision was committed against a stale history (another decider won the race)."""


class WorkflowNotFound(DurableError):
    """No workflow (or run) with the given id exists."""


class WorkflowAlreadyStarted(DurableError):
    """A workflow with this id already has a run that is not closed."""


class WorkflowClosed(DurableError):
    """The operation needs an open run, but the workflow's current run is closed."""


class UnknownTypeError(DurableError):
    """A workflow or activity type is not registered in this process."""


class SignalTimeout(DurableError):
    """``await_signal(name, timeout=...)`` reached its deadline without a signal."""


class SessionLost(DurableError):
    """The worker hosting a worker session stopped: the session's activities cannot run there."""


class ActivityWorkerLost(DurableError):
    """The worker process running an activity attempt died each time it ran it (``os._exit``,
    a segfault, the OOM killer): the attempt began 3 times (from its queue, or first under the
    lease of an ``--eager`` worker or of a local activity) without its outcome recorded.

    The attempt is failed with this error instead of being run again blindly (each run would
    kill one more worker). The activity's ``RetryPolicy`` applies as to any failure: a further
    attempt runs as a new task, and once the policy gives up the workflow sees
    :class:`ActivityFailed` with this as its ``cause``. List ``"ActivityWorkerLost"`` in
    ``non_retryable_errors`` to stop at the first such attempt.

    Attributes:
        deliveries: How many times the attempt was handed to a worker (its task delivered, or
            leased), the last of which failed it.
        worker: The worker that began the attempt last (``""`` when unknown).
    """

    def __init__(self, message: str, *, deliveries: int = 0, worker: str = "") -> None:
        super().__init__(message)
        self.deliveries = deliveries
        self.worker = worker


class HookError(DurableError):
    """A hook token is unknown, already used, or the hook's run is closed."""


class NonRetryableError(DurableError):
    """Raised by an activity to stop retries: the attempt fails for good."""


class ActivityTimeout(DurableError):
    """An activity attempt exceeded a timeout.

    Attributes:
        kind: ``start_to_close``, ``schedule_to_close`` or ``heartbeat``.
    """

    def __init__(self, message: str, *, kind: str = "start_to_close") -> None:
        super().__init__(message)
        self.kind = kind


class ActivityFailed(DurableError):
    """An activity failed for good (retries exhausted, non-retryable, timed out).

    Attributes:
        activity_id: The command id of the activity in its workflow.
        activity_name: The activity's durable name.
        attempts: How many attempts were made.
        cause: The last attempt's exception (original type, message, traceback).
    """

    def __init__(
        self,
        message: str,
        *,
        activity_id: str = "",
        activity_name: str = "",
        attempts: int = 0,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.activity_id = activity_id
        self.activity_name = activity_name
        self.attempts = attempts
        self.cause = cause
        self.__cause__ = cause


class ChildWorkflowFailed(DurableError):
    """A child workflow did not complete.

    Attributes:
        workflow_id: The child's workflow id.
        status: ``failed``, ``cancelled`` or ``terminated``.
        cause: The child's error, when it failed.
    """

    def __init__(
        self,
        message: str,
        *,
        workflow_id: str = "",
        status: str = "failed",
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.workflow_id = workflow_id
        self.status = status
        self.cause = cause
        self.__cause__ = cause


class WorkflowFailed(DurableError):
    """``result()`` was asked of a run that did not complete.

    Attributes:
        status: ``failed``, ``cancelled`` or ``terminated``.
        cause: The workflow's exception when it failed, else ``None``.
    """

    def __init__(self, message: str, *, status: str = "failed", cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.cause = cause
        self.__cause__ = cause


class WorkflowTimeout(DurableError):
    """A run's workflow timeout passed: the run closed as ``failed`` with this as its cause
    (``WorkflowFailed.cause``, ``ChildWorkflowFailed.cause`` in a parent).

    Attributes:
        timeout: ``execution`` (the workflow id's runs together, across continue-as-new) or
            ``run`` (this run alone).
    """

    def __init__(self, message: str, *, timeout: str = "run") -> None:
        super().__init__(message)
        self.timeout = timeout


class WorkflowBlocked(DurableError):
    """``result()`` was asked of a run that is blocked: it cannot make progress until an
    operator acts (deploy a fix, then ``durable repair ID``; or start a worker for its build).

    Attributes:
        workflow_id: The workflow id.
        run_id: The blocked run.
        kind: What blocks it: ``nondeterminism``, ``unknown_type``, ``needs_upgrade`` (a newer
            release of durable decided the run; no live worker reads its history), ``no_live_worker``,
            ``runaway_decision``, ``parked_input``, ``history_corrupt``, ``workflow_error``
            (code raised one of its ``block_on_errors``) or ``other``.
        reason: The reason recorded with the block, in words.
    """

    def __init__(
        self, message: str, *, workflow_id: str = "", run_id: str = "", kind: str = "", reason: str = ""
    ) -> None:
        super().__init__(message)
        self.workflow_id = workflow_id
        self.run_id = run_id
        self.kind = kind
        self.reason = reason


class RedisUnavailable(DurableError):
    """A client call (``start``, ``signal``, ``query``, ``status``, ``result`` ...) could not
    reach Redis, or Redis refused it for now (a restart loading its data, ``maxmemory``, a
    failover), for longer than the client rides such outages out.

    The client retries a call through a short outage (10 s by default; ``result()`` and
    ``update()`` waits already under way, 60 s), and a retried ``start`` or ``signal`` whose
    first send did land is not done twice. After that this error says which Redis, for how
    long and why; nothing the call was to write is half-written.

    Attributes:
        url: The Redis the client talks to (password masked).
        kind: What the last failure was: ``"connection lost"``, ``"timeout"``, ``"maxclients"``,
            ``"LOADING"``, ``"OOM"``, ``"READONLY"`` ... (see ``durable.store.connect.unavailable_kind``).
        seconds: How long the call kept trying.
    """

    def __init__(self, message: str, *, url: str = "", kind: str = "", seconds: float = 0.0) -> None:
        super().__init__(message)
        self.url = url
        self.kind = kind
        self.seconds = seconds


class UpdateRejected(DurableError):
    """``WorkflowStub.update`` was refused before its handler ran: its validator raised,
    the workflow has no ``@update`` of that name, or its arguments could not be decoded.
    Nothing the workflow sees was written.

    Attributes:
        update_id: The update's id.
        name: The update's name.
        cause: The validator's error (or the error naming what was wrong).
    """

    def __init__(
        self, message: str, *, update_id: str = "", name: str = "", cause: BaseException | None = None
    ) -> None:
        super().__init__(message)
        self.update_id = update_id
        self.name = name
        self.cause = cause
        self.__cause__ = cause


class QueryFailed(DurableError):
    """A ``@query`` handler raised, or returned a value that cannot be encoded (a payload's
    rules apply to a query's result too). The run is unaffected: a query commits nothing.

    Attributes:
        name: The query's name.
        cause: What the handler raised (or the :class:`SerializationError` of its result).
    """

    def __init__(self, message: str, *, name: str = "", cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.name = name
        self.cause = cause
        self.__cause__ = cause


class QueryBusy(QueryFailed):
    """A query that did not start: every query thread of this process is held by earlier queries
    whose workflow code is blocked in a call (the message names those runs and where). Try again
    once they return; the HTTP API answers it 429 ``busy``."""


class Overrun(BaseException):
    """Raised by :mod:`durable.time_limit` in a thread whose workflow code ran too long without
    yielding (a query's replay); it turns it into the caller's error. Not a user's to catch: a
    ``BaseException``, so workflow code's ``except Exception`` does not swallow it, and the
    replay ends on it instead of routing it as the workflow's failure."""


class ApplicationError(DurableError):
    """An exception from remote code whose class is not importable here.

    The codec rebuilds exceptions by type name; when the type is not loaded in
    this process it produces an ``ApplicationError`` that keeps the original
    type name, message and traceback text.
    """

    def __init__(self, message: str, *, type_name: str = "", traceback: str = "") -> None:
        super().__init__(message)
        self.type_name = type_name
        self.remote_traceback = traceback


class CancelledError(BaseException):
    """Thrown into workflow code at its suspension point when the run (or branch) is cancelled."""


def message_of(exc: BaseException) -> str:
    """``str(exc)``; when the exception's own ``__str__`` raises, its ``repr``, else a stand-in.

    A user's exception whose ``__str__`` is broken must still be recorded: the failure being
    recorded must not itself fail the recording (the attempt would be retried forever).
    """
    for render in (str, repr):
        try:
            return render(exc)
        except Exception:  # noqa: BLE001, S112 - any error of user code: try the next rendering
            continue
    return f"<{type(exc).__name__}: its str() and repr() raised>"


def error_text(exc: BaseException) -> str:
    """``"<type name>: <message>"`` of ``exc``, safe for any exception (see :func:`message_of`).

    An :class:`ApplicationError` standing in for an error not rebuilt here (``SystemExit``, a
    class of a module not loaded) is named by the original type it keeps.
    """
    name = type(exc).__name__
    if isinstance(exc, ApplicationError) and exc.type_name:
        name = exc.type_name.removeprefix("builtins.")
    return f"{name}: {message_of(exc)}"


def frame_text(frame: traceback.FrameSummary) -> str:
    """``file:line in function`` of one frame: how error lines and logs say where code was."""
    return f"{frame.filename}:{frame.lineno} in {frame.name}"
