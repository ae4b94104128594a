"""Activity attempts: run one attempt of an activity task and record what happened.

An attempt's result is recorded through the run's inbox (the completion
script), or handed to the caller to commit with the run's next decision (eager
mode). A failure schedules the next attempt after the retry policy's backoff,
or fails the activity for good.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

import redis

from durable import codec, interceptors
from durable import events as ev
from durable.activity import (
    ActivityCancelledError,
    ActivityContext,
    RetryPolicy,
    running_activity,
    worker_identity,
)
from durable.codec.sealed import log_text
from durable.errors import (
    ActivityTimeout,
    NonRetryableError,
    SerializationError,
    UnknownTypeError,
    error_text,
    message_of,
)
from durable.frames import app_frame, code_position
from durable.quiet import Quiet
from durable.registry import ActivityDefinition, get_activity
from durable.store.activities import Begun
from durable.store.key_types import is_wrong_type
from durable.store.loads import Loaded, RunToLoad
from durable.store.outage import Incident, retry_transient
from durable.store.redis_store import ClaimedTask, RedisStore
from durable.store.tasks import ActivityTask, AttemptOutcome, AttemptResult

from . import faults, metrics
from .async_activities import awaiting, recorded_elsewhere, timed_out_here
from .logging import bind_run, unbind_run
from .timeouts import attempt_deadline, attempt_heartbeat

log = logging.getLogger("durable.worker")

OnResult = Callable[[AttemptResult], None]
"""Takes an attempt's result to commit it later (eager mode, or the worker's main thread)."""

Unserved = Callable[[ActivityTask, str, str, dict[bytes, bytes]], str]
"""Routes a task whose type this worker lacks (``workers.routing.Routing.activity``)."""

#: Recording an attempt's outcome after the activity ran: retried for as long as Redis is
#: unavailable (the effect happened; running it again is what waiting avoids). One incident
#: log for every activity thread of the process.
_recording = Incident(log, "activity threads (recording attempt outcomes)")


def _never(_due: int) -> None:
    pass


def attempt_began(started_ms: int | None, now_ms: int) -> float:
    """When an attempt that ends now without its own report (expired by the scheduler, its
    worker dead) began, as a ``time.time()`` value, so its record's duration is the time it ran:
    ``now_ms - started_ms``, both on the scripts' clock (``started_ms`` unknown: now)."""
    if not started_ms:
        return time.time()
    return time.time() - max(0, now_ms - started_ms) / 1000


def _unmeasured(_name: str, _seconds: float) -> None:
    pass


def _all(_name: str) -> bool:
    return True


def run_activity(
    store: RedisStore,
    stream: str,
    entry_id: str,
    fields: dict[bytes, bytes],
    *,
    allowed: Callable[[str], bool] = _all,
    redelivered: bool = False,
    on_timer: Callable[[int], None] = _never,
    on_result: OnResult | None = None,
    unserved: Unserved | None = None,
    begun: Begun | None = None,
    on_ran: Callable[[str, float], None] = _unmeasured,
    task: ActivityTask | None = None,
) -> str:
    """Run one activity attempt from a task stream and record its outcome (see
    :func:`execute_attempt`). Returns the outcome word. A task whose type this worker
    lacks goes to ``unserved`` (back to its queue for a worker that has it) if given,
    else it is parked. ``task``: the body of ``fields`` decoded already (the task this worker's
    decision built and its commit claimed), so it is not decoded again."""
    try:
        task = task or ActivityTask.decode(fields[b"body"])
    except Exception as exc:  # noqa: BLE001
        store.park(
            p=store.keys.partition_of_key(stream),
            stream=stream,
            entry_id=entry_id,
            kind="activity",
            reason=f"undecodable activity task: {message_of(exc)}",
            fields=fields,
        )
        return "parked"
    if unserved is not None and not allowed(task.name):
        return unserved(task, stream, entry_id, fields)
    # A redelivered attempt that is no longer current is refused by execute_attempt's
    # begin check, like any other void task (``redelivered`` is kept for callers).
    return execute_attempt(
        store,
        task,
        stream=stream,
        entry_id=entry_id,
        allowed=allowed,
        on_timer=on_timer,
        on_result=on_result,
        begun=begun,
        on_ran=on_ran,
    )


def execute_attempt(
    store: RedisStore,
    task: ActivityTask,
    *,
    stream: str,
    entry_id: str = "",
    allowed: Callable[[str], bool] = _all,
    on_timer: Callable[[int], None] = _never,
    on_result: OnResult | None = None,
    begun: Begun | None = None,
    on_ran: Callable[[str, float], None] = _unmeasured,
) -> str:
    """Run one attempt of ``task`` and record what happened.

    ``begun``: the attempt was begun already (by the commit that scheduled and claimed it for
    this worker), so :meth:`~durable.store.redis_store.RedisStore.begin_attempt` is skipped.
    ``on_ran``: told the activity's type and how many seconds its own code took (not the round
    trips around it, nor the waits for the GIL before and after), when it ran.

    A failure is recorded at once (retry timer or ActivityFailed). A result is
    recorded with the completion script, or handed to ``on_result`` when the
    caller commits it itself together with the run's next decision (eager mode).
    Returns the outcome word (completed, retry, failed, void, parked).
    """
    token = bind_run(task_ids(task))  # every log line of the attempt carries its ids
    began = time.perf_counter()
    try:
        outcome, timeout = _attempt(
            store, task, stream, entry_id, allowed, on_timer, on_result, begun, on_ran
        )
    finally:
        unbind_run(token)
    if outcome != "completed":  # a result is counted once the store took it (counted()): a late one is not
        metrics.attempt(task.name, task.stream, outcome, time.perf_counter() - began, timeout)
    return outcome


def _raised_at(exc: BaseException) -> str:
    """`` at path:line in function``: where in the activity's code ``exc`` rose, for its failure
    line (the run's failure line names the workflow's line only); ``""``: not in the app's code."""
    try:
        frame = app_frame(traceback.extract_tb(exc.__traceback__))
    except Exception:  # noqa: BLE001 - an error whose own attributes raise: said without it
        return ""
    return f" at {code_position([frame])}" if frame is not None else ""


def task_ids(task: ActivityTask) -> dict[str, Any]:
    """The ids a log line about an activity attempt carries (``extra=``, or bound)."""
    return {
        "workflow_id": task.workflow_id,
        "run_id": task.run_id,
        "activity_id": task.activity_id,
        "activity_type": task.name,
        "attempt": task.attempt,
    }


def _attempt(
    store: RedisStore,
    task: ActivityTask,
    stream: str,
    entry_id: str,
    allowed: Callable[[str], bool],
    on_timer: Callable[[int], None],
    on_result: OnResult | None,
    begun: Begun | None = None,
    on_ran: Callable[[str, float], None] = _unmeasured,
) -> tuple[str, str]:
    """(outcome word, the kind of deadline the worker's own timer ended the attempt at, or "")."""
    resolved = _resolve(store, task, stream, entry_id, allowed)
    if resolved is None:
        return "parked", ""
    definition, args = resolved
    started = time.time()
    deadline = attempt_deadline(task, started)
    due_ms = int(deadline * 1000) if deadline is not None else 0
    # One round trip, before any user code: the run must be open and the attempt current
    # (a terminated or cancelled run's queued tasks stop here), and the last heartbeat
    # details come back whichever path re-delivered the activity. A task its worker's own
    # commit claimed was begun by that commit (where all of this holds by construction).
    if begun is None:
        begun = store.begin_attempt(task, stream, entry_id, due_ms, int(started * 1000), worker_identity()[0])
    if not begun.ok:
        log.info(
            "activity %s (run %s, attempt %d) not started: %s; its task is dropped", *_ids(task), begun.reason
        )
        return "void", ""
    if task.attempt == 1:
        metrics.started(task.name, task.stream, begun.now_ms - task.scheduled)
    if due_ms:
        on_timer(due_ms)
    details = begun.details
    heartbeat = attempt_heartbeat(store, task, started)
    context = ActivityContext(
        workflow_id=task.workflow_id,
        run_id=task.run_id,
        activity_id=task.activity_id,
        name=task.name,
        attempt=task.attempt,
        heartbeat_details=codec.loads(details) if details else None,
        heartbeat_fn=heartbeat,
    )
    ran = time.perf_counter()
    try:
        with running_activity(context):
            # An async def activity runs to its end inside the interceptors' chain (in the context
            # they set: a tenant, the attempt's span), on the worker's event loop.
            fn = awaiting(definition.fn, store, task, context, started)
            value = interceptors.execute(task, fn, definition.typed_args(args))
            payload = codec.dumps(value, path="result")
            faults.point("activity.after_effect")
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # sys.exit() too: unrecorded, it re-ran forever
        on_ran(task.name, time.perf_counter() - ran)
        heartbeat.close(flush=True)  # the retry resumes from the latest details
        failed = fail_attempt(
            store,
            task,
            exc,
            stream=stream,
            entry_id=entry_id,
            started=started,
            on_timer=on_timer,
            started_ms=begun.now_ms,
        )
        return failed, timed_out_here(exc)  # counted as a timeout, as the scheduler's expiries are
    on_ran(task.name, time.perf_counter() - ran)
    heartbeat.close(flush=False)
    # started_ms (the scripts' clock) lets a check prove no attempt began after its run closed.
    record = {"duration_ms": int((time.time() - started) * 1000), "started_ms": begun.now_ms}
    result = AttemptResult(task, payload, record, stream, entry_id)
    if on_result is not None:
        on_result(result)
    else:
        outcome = completion(result)
        if retry_transient(lambda: complete_batch(store, [outcome]), _recording):
            return "discarded", ""  # a deadline passed first: counted as timed out, once
    return "completed", ""


def _resolve(
    store: RedisStore, task: ActivityTask, stream: str, entry_id: str, allowed: Callable[[str], bool]
) -> tuple[ActivityDefinition, Any] | None:
    """The activity's definition and decoded arguments; ``None`` when the task was parked."""
    try:
        if not allowed(task.name):
            raise UnknownTypeError(f"activity {task.name!r} is not defined in this worker's --app modules")
        return get_activity(task.name), codec.loads(task.args)
    except (UnknownTypeError, SerializationError) as exc:
        store.park(
            p=task.partition,
            stream=stream,
            entry_id=entry_id,
            kind="activity",
            reason=error_text(exc),
            fields={"body": task.encode()},
            run_id=task.run_id,
            # The run cannot go on without this activity: block it, visibly, until a
            # worker that has the activity is deployed and `durable repair` re-queues it.
            block=True,
        )
        return None


def completion(result: AttemptResult) -> AttemptOutcome:
    """The outcome recording an attempt's result through the run's inbox (acking its entry)."""
    task = result.task
    event = ev.ActivityCompleted(id=task.activity_id, result=result.payload, attempt=task.attempt)
    return AttemptOutcome(task, "completed", result.record, result.stream, result.entry_id, event)


def attempt_failed(
    task: ActivityTask, error: BaseException, record: dict[str, Any], *, stream: str, entry_id: str = ""
) -> AttemptOutcome:
    """The outcome failing an activity for good with ``error``."""
    event = ev.ActivityFailedEvent(
        id=task.activity_id, error=codec.dumps(error, path="error"), attempts=task.attempt
    )
    return AttemptOutcome(task, "failed", record, stream, entry_id, event)


def complete_batch(store: RedisStore, outcomes: list[AttemptOutcome]) -> int:
    """Record several attempts' results in one round trip; late results are logged as discarded
    (how many were is returned)."""
    return _settled(outcomes, store.complete_many(outcomes))


def complete_and_preload(
    store: RedisStore,
    outcomes: list[AttemptOutcome],
    seq_of: Callable[[str], int],
    *,
    taker: str = "",
    sticky: str = "",
) -> tuple[dict[str, tuple[int, Loaded]], list[ClaimedTask]]:
    """:func:`complete_batch`, and in the same round trip the decision load of each run whose
    driver is cached here (``seq_of`` > 0) and whose workflow task a completion enqueued: run
    id -> (seq loaded after, load). That task is then decided without a load round trip of its
    own; with no other task pending when it was enqueued, nobody else decides the run meanwhile
    (an eager commit changes its seq: the commit conflicts and the run is loaded afresh).
    With ``taker`` (this worker's consumer name) and ``sticky`` (its private queue), the woken
    tasks that went to its private streams come back read for it, second."""
    runs: dict[str, RunToLoad] = {}
    for outcome in outcomes:
        rid = outcome.task.run_id
        after = seq_of(rid)
        if after and rid not in runs:
            runs[rid] = (outcome.task.partition, rid, after)
    replies, loaded, handed = store.complete_then_load(
        outcomes, list(runs.values()), taker=taker, sticky=sticky
    )
    _settled(outcomes, replies)
    if loaded is None:
        return {}, handed
    woken = {o.task.run_id for o, (word, n) in zip(outcomes, replies, strict=True) if word == "OK" and n}
    loads = {rid: (run[2], got) for (rid, run), got in zip(runs.items(), loaded, strict=True) if rid in woken}
    return loads, handed


def counted(task: ActivityTask, record: dict[str, Any]) -> None:
    """Count a completed attempt whose result the store has recorded (``record``: its log
    record, with how long it ran)."""
    ran_ms = record.get("duration_ms")
    metrics.attempt(task.name, task.stream, "completed", ran_ms / 1000 if isinstance(ran_ms, int) else None)


def _settled(outcomes: list[AttemptOutcome], replies: list[tuple[str, int]]) -> int:
    """Count the recorded completions; log the late ones the store discarded (how many)."""
    stale = 0
    for outcome, (reply, _) in zip(outcomes, replies, strict=True):
        if reply != "STALE":
            if outcome.outcome == "completed":
                counted(outcome.task, outcome.record)
        else:
            stale += 1
            task = outcome.task
            log.info(
                "late result of activity %s (run %s, attempt %d) discarded", *_ids(task), extra=task_ids(task)
            )
    return stale


def _type_names(exc: BaseException) -> set[str]:
    names = set()
    for klass in type(exc).__mro__:
        names.add(klass.__name__)
        names.add(f"{klass.__module__}.{klass.__qualname__}")
    type_name = getattr(exc, "type_name", "")
    if type_name:
        names.add(type_name)
        names.add(type_name.rsplit(".", 1)[-1])
    return names


def _final_reason(task: ActivityTask, exc: BaseException, policy: RetryPolicy, delay: float) -> str:
    """Why the attempt that raised ``exc`` is the activity's last (``""``: retry it)."""
    schedule_to_close = task.timeout("schedule_to_close")
    if isinstance(exc, NonRetryableError | SerializationError):
        return "non-retryable error"
    if isinstance(exc, ActivityTimeout) and exc.kind == "schedule_to_close":
        return "schedule_to_close_timeout passed"
    if _type_names(exc) & set(policy.non_retryable_errors):
        return "error type listed in non_retryable_errors"
    if policy.max_attempts and task.attempt >= policy.max_attempts:
        return f"max_attempts={policy.max_attempts} reached"
    if schedule_to_close and time.time() + delay > task.scheduled / 1000 + schedule_to_close:
        return "schedule_to_close_timeout would pass before the next attempt"
    return ""


def _traceback_text(exc: BaseException) -> str:
    """The last 4000 characters of ``exc``'s traceback; an error whose own attributes raise
    (``__traceback__``, its cause) must fail its attempt, not the thread recording it."""
    try:
        return "".join(traceback.format_exception(exc))[-4000:]
    except Exception as err:  # noqa: BLE001 - any: what the user's error class does is unknown
        return f"(the traceback of this {type(exc).__name__} could not be read: {type(err).__name__}: {err})"


def fail_attempt(
    store: RedisStore,
    task: ActivityTask,
    exc: BaseException,
    *,
    stream: str,
    entry_id: str,
    started: float,
    on_timer: Callable[[int], None] = _never,
    started_ms: int = 0,
) -> str:
    """Record a failed attempt: schedule the retry, or fail the activity for good
    (``started_ms``: when it began, on the scripts' clock; 0 when not known). Returns ``retry``
    or ``failed``; ``discarded`` when the attempt was no longer current (its end was recorded
    already, by the scheduler's expiry or by the worker's own timeout): nothing to count."""
    if recorded_elsewhere(exc):
        # An async attempt the scheduler expired: its record stands, a second one would only be
        # logged as discarded.
        log.info("activity %s (run %s, attempt %d) ended after it expired", *_ids(task))
        return "discarded"
    policy = RetryPolicy.from_dict(task.retry)
    delay = policy.delay(task.attempt)
    final_reason = _final_reason(task, exc, policy, delay)
    # A cooperative stop (its heartbeat saw the cancel): not a failure to retry, nor to warn of.
    cancelled = isinstance(exc, ActivityCancelledError)
    final_reason = "its workflow cancelled it" if cancelled else final_reason
    record: dict[str, Any] = {
        # error_type stays readable for operators; error and traceback may quote user data and
        # are sealed (encrypted) by the store when a payload hook is installed.
        "error_type": type(exc).__name__,
        "error": error_text(exc),
        "traceback": _traceback_text(exc),
        "duration_ms": int((time.time() - started) * 1000),
    }
    if started_ms:
        record["started_ms"] = started_ms
    # Said in the worker's log, one line each: an activity failing on every attempt (a missing
    # module, a changed signature) is otherwise seen only by `durable describe`.
    (log.info if cancelled else log.warning)(
        "activity %s (%s) of run %s failed, attempt %d%s: %s; %s",
        task.name,
        task.activity_id,
        task.run_id,
        task.attempt,
        _raised_at(exc),
        log_text(record["error"], type(exc).__name__),
        f"no retry ({final_reason})" if final_reason else f"retrying in {delay:g} s",
    )
    if final_reason:
        record["final"] = final_reason
        error = exc
        if final_reason.startswith("schedule_to_close"):
            error = ActivityTimeout(
                f"activity {task.name} ({task.activity_id}) exceeded schedule_to_close_timeout; last error: {message_of(exc)}",
                kind="schedule_to_close",
            )
        failed = attempt_failed(task, error, record, stream=stream, entry_id=entry_id)
        reply, _ = retry_transient(lambda: store.complete_activity(failed), _recording)
        return _accepted(task, reply, "failed")
    record["retry_in_s"] = delay
    retry = AttemptOutcome(
        task, "retry", record, stream, entry_id, None, int(delay * 1000), task.next_attempt()
    )
    outcome, due = retry_transient(lambda: store.complete_activity(retry), _recording)
    if outcome == "RETRY":
        on_timer(due)
    return _accepted(task, outcome, "retry")


def _accepted(task: ActivityTask, reply: str, outcome: str) -> str:
    """``outcome``, or ``discarded`` when the completion script's ``reply`` says another record
    of the attempt came first (the worker's and the scheduler's timeouts of an async attempt
    race at the same deadline): only the record that stands is counted."""
    if reply != "STALE":
        return outcome
    log.info("late failure of activity %s (run %s, attempt %d) discarded", *_ids(task))
    return "discarded"


def _ids(task: ActivityTask) -> tuple[str, str, int]:
    return task.activity_id, task.run_id, task.attempt


def record_in_hand(
    store: RedisStore,
    completed: deque[AttemptOutcome],
    eager: deque[AttemptResult],
    apply_eager: Callable[[list[AttemptResult]], None],
    complete: Callable[[list[AttemptOutcome]], None] | None = None,
) -> None:
    """Record the results other threads handed to the worker's main thread: queued tasks'
    outcomes through their runs' inboxes, eager results with their runs' next decisions
    (``apply_eager``); ``complete`` records the former (default :func:`complete_batch`). When Redis refuses (it is unavailable for now), nothing is dropped:
    the outcomes stay in ``completed`` for the next call, and so do the eager results, as
    inbox outcomes (some may be committed already: the inbox discards those as stale)."""
    if completed:
        batch = _drain(completed)
        record = complete if complete is not None else lambda outcomes: complete_batch(store, outcomes)
        try:
            record(batch)
        except redis.ResponseError as exc:
            # A key of one run of the wrong kind failed the batch (a bare WRONGTYPE, which stopped
            # the worker): the others are recorded one by one, that one kept for the next pass.
            stuck = _one_by_one(store, batch, record) if is_wrong_type(exc) else batch
            completed.extendleft(reversed(stuck))
            if stuck is batch:
                raise
        except BaseException:
            completed.extendleft(reversed(batch))
            raise
    if eager:
        results = _drain(eager)
        try:
            apply_eager(results)
        except BaseException:
            completed.extend(completion(r) for r in results)
            raise


def _one_by_one(
    store: RedisStore, batch: list[AttemptOutcome], record: Callable[[list[AttemptOutcome]], Any]
) -> list[AttemptOutcome]:
    """Record each outcome of ``batch`` alone; those a key of the wrong kind refuses, kept (each
    said at most once a minute, the keys named)."""
    stuck = []
    for outcome in batch:
        try:
            record([outcome])
        except redis.ResponseError as exc:
            if not is_wrong_type(exc):
                raise
            stuck.append(outcome if outcome.kept else dataclasses.replace(outcome, kept=True))
            t = outcome.task
            if _stuck.due(t.run_id):
                wrong = store.run_wrong_types(t.partition, t.run_id) or [str(exc)]
                log.error(
                    "the result of activity %s (%s) of run %s cannot be recorded: %s (made by hand, or by "
                    "another program sharing the database); kept and tried again: put the key back as it "
                    "was (a deleted activities hash loses the run's pending activities: terminate the run then)",
                    t.name,
                    t.activity_id,
                    t.run_id,
                    "; ".join(wrong),
                )
    return stuck


_stuck = Quiet()  # runs whose unrecordable result was said


def _drain(items: deque[Any]) -> list[Any]:
    """Everything in ``items`` (other threads append; only this one pops)."""
    out = []
    while items:
        out.append(items.popleft())
    return out
