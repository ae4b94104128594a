"""Commands that drive one run: start, signal, update, query, cancel, terminate, status, result
(``repair`` is in :mod:`workers.cli.repair`)."""

from __future__ import annotations

import shlex
import time
from typing import Any

import click
import redis

from durable import WorkflowStub, codec, registry
from durable.blocked import cancel_note
from durable.client_updates import Delivery, reused_differently, send_update
from durable.errors import (
    DurableError,
    RedisUnavailable,
    SerializationError,
    WorkflowBlocked,
)
from durable.ids import new_run_id
from durable.runinfo import blocked_text
from durable.start_policy import ID_CONFLICT_POLICIES, ID_REUSE_POLICIES
from durable.store.redis_store import CLOSED_STATUSES, RedisStore, RunRef
from durable.store.updates import Outcome, update_result, wait_update
from durable.store.waits import OUTAGE_RIDE_S
from durable.store.workers import FOUND_ON_READ
from durable.waiting import MOST_NAMED, in_words, not_closed
from workers.cli.batch import WHERE, YES, one_or_where, run_batch
from workers.cli.core import CliError, CliState, Seconds, load_apps, one_line, parse_args, pass_state
from workers.cli.fleet import check_startable
from workers.cli.named import named_values, search_types_of
from workers.cli.render import to_json

from .render import echo

__all__ = ["COMMANDS"]


def _stub(state: CliState, workflow_id: str) -> WorkflowStub:
    return WorkflowStub.load(workflow_id, store=state.existing_store)


@click.command()
@click.argument("workflow_type", metavar="TYPE")
@click.argument("args", nargs=-1, metavar="[ARGS_JSON]...")
@click.option("--id", "workflow_id", default=None, help="Workflow id (default: generated).")
@click.option("--app", "apps", multiple=True, metavar="MODULE", help="Import the type's module first.")
@click.option("--queue", default=None, help="Task queue (default: the class's, else 'default').")
@click.option("--wait/--no-wait", default=False, show_default=True, help="Wait and print the result.")
@click.option("--timeout", type=Seconds(), default=None, help="Seconds to wait with --wait.")
@click.option(
    "--signal",
    "signal_name",
    default=None,
    metavar="NAME",
    help="Signal-with-start: send signal NAME, starting the run first if the id has none open "
    "(atomically; the open run gets it otherwise).",
)
@click.option(
    "--signal-arg", "signal_args", multiple=True, metavar="JSON", help="An argument of --signal (repeatable)."
)
@click.option(
    "--id-reuse-policy",
    type=click.Choice(ID_REUSE_POLICIES),
    default="allow_duplicate",
    show_default=True,
    help="When the id's last run is closed: start, start unless it completed, or refuse.",
)
@click.option(
    "--id-conflict-policy",
    type=click.Choice(ID_CONFLICT_POLICIES),
    default=None,
    help="When the id has an open run: fail (default; with --signal: use_existing), use it, "
    "or terminate it and start.",
)
@click.option(
    "--execution-timeout",
    default=None,
    metavar="DURATION",
    help="The id's runs together (across continue-as-new) must close within it (e.g. 1h); "
    "else the run fails with WorkflowTimeout.",
)
@click.option(
    "--run-timeout", default=None, metavar="DURATION", help="Each run must close within it (e.g. 10m)."
)
@click.option(
    "--search-attribute",
    "search",
    multiple=True,
    metavar="NAME=VALUE",
    help="An initial search attribute (declared, of its type; VALUE is JSON or a string; repeatable).",
)
@click.option("--memo", "memo", multiple=True, metavar="NAME=VALUE", help="A memo entry (repeatable).")
@pass_state
def start(
    state: CliState,
    workflow_type: str,
    args: tuple[str, ...],
    workflow_id: str | None,
    apps: tuple[str, ...],
    queue: str | None,
    wait: bool,
    timeout: float | None,
    signal_name: str | None,
    signal_args: tuple[str, ...],
    id_reuse_policy: str,
    id_conflict_policy: str | None,
    execution_timeout: str | None,
    run_timeout: str | None,
    search: tuple[str, ...],
    memo: tuple[str, ...],
) -> None:
    """Start a run of workflow TYPE with ARGS (JSON values).

    Prints `workflow_id: ...` and `run_id: ...`; with --wait, then the result as
    one JSON line (a failed run exits 1 with an error line). An unregistered TYPE
    is started by name: a worker whose --app defines it will run it (with --app, TYPE
    must be defined there). Warns when no live worker of the queue runs TYPE.
    With --signal, also `signal: NAME -> started run` or `-> existing run`.
    """
    if apps:
        load_apps(apps)
    if signal_args and not signal_name:
        raise click.UsageError("--signal-arg needs --signal NAME")
    # Arguments are checked before the store is touched: a typo starts no embedded Redis.
    values, signal_values = parse_args(args), parse_args(signal_args)
    stub = WorkflowStub.make(
        registry.workflows().get(workflow_type, workflow_type) if apps else workflow_type,  # args checked
        id=workflow_id,
        queue=queue,
        store=state.store,
        id_reuse_policy=id_reuse_policy,
        id_conflict_policy=id_conflict_policy,
        execution_timeout=execution_timeout,
        run_timeout=run_timeout,
        search_attributes=named_values(
            search, "--search-attribute", search_types_of(state.store) if search else {}
        )
        or None,
        memo=named_values(memo, "--memo") or None,
    )
    warning = check_startable(
        stub.store, workflow_type, registry.start_queue(workflow_type, stub.queue), apps
    )
    if signal_name:
        before = stub.run_id
        stub.signal_with_start(signal_name, *signal_values, start_args=values)
        started = "existing" if stub.run_id == before else "started"
    else:
        stub.start(*values)
    if warning:
        echo(warning, err=True)
    echo(f"workflow_id: {stub.id}")
    echo(f"run_id: {stub.run_id}")
    if signal_name:
        echo(f"signal: {signal_name} -> {started} run")
    if wait:
        echo(to_json(_result(stub, timeout)))


@click.command()
@click.argument("workflow_id", metavar="ID")
@click.argument("name")
@click.argument("args", nargs=-1, metavar="[ARGS_JSON]...")
@click.option(
    "--app",
    "apps",
    multiple=True,
    metavar="MODULE",
    help="Check ARGS against the workflow's @signal handler.",
)
@pass_state
def signal(
    state: CliState, workflow_id: str, name: str, args: tuple[str, ...], apps: tuple[str, ...]
) -> None:
    """Send signal NAME with ARGS (JSON values) to workflow ID's current run (with --app, ARGS
    its @signal handler refuses are refused here, nothing sent: else the run drops them)."""
    if apps:
        load_apps(apps)
    values = parse_args(args)
    _stub(state, workflow_id).signal(name, *values)
    echo(f"signal {name!r} sent to {workflow_id}")


#: How long `durable update` waits quietly for the outcome before it prints the update's id (and
#: why no live worker can run it, if none can), and `durable result` before it says what the run
#: waits on: a prompt outcome prints only itself, so scripts get one line, and workers still
#: starting up (a second or so) cause no false alarm.
QUIET_WAIT_S = 2.0


def _result(stub: WorkflowStub, timeout: float | None) -> Any:
    """:func:`_wait_result`; a completed run's result holding a class this process does not
    load (the CLI imports no application code) as the views decode it (``codec.view``)."""
    try:
        return _wait_result(stub, timeout)
    except SerializationError as exc:
        outcome = stub.snapshot().get("outcome") if exc.type_name else None
        if not outcome or outcome["status"] != "completed":
            raise
        return outcome["result"]


def _wait_result(stub: WorkflowStub, timeout: float | None) -> Any:
    """``stub.result(timeout)``; a wait not over within :data:`QUIET_WAIT_S` says once (stderr)
    what the run waits on or what blocks it, and goes on waiting."""
    if timeout is not None and timeout <= QUIET_WAIT_S:
        return stub.result(timeout=timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        return stub.result(timeout=QUIET_WAIT_S)
    except TimeoutError as exc:
        echo(f"note: still waiting: {exc}", err=True)
    try:
        return stub.result(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
    except TimeoutError:  # said again as of now, and of the whole --timeout
        raise TimeoutError(not_closed(stub.store, stub.store.ref(stub.id), timeout)) from None


def _again(workflow_id: str, name: str, args: tuple[str, ...], update_id: str) -> str:
    """The command that waits again for an update's outcome (the id makes it run once)."""
    return shlex.join(["durable", "update", workflow_id, name, *args, "--update-id", update_id])


def _unserved(store: RedisStore, ref: RunRef) -> str | None:
    """Why no live worker can move the run now (its queue, type or build has none), or None."""
    try:
        reason = store.why_blocked(store.run_record(ref))
    except DurableError:  # the run is gone: the wait says so
        return None
    return reason.message if reason else None


def _wait_outcome(
    store: RedisStore, delivery: Delivery, name: str, deadline: float | None, again: str
) -> Outcome:
    """Wait for a delivered update's outcome; once the wait is not prompt, say (stderr) the
    update's id and, if no live worker can run it, why."""
    ref, uid = delivery.ref, delivery.update_id
    quiet: float | None = time.monotonic() + QUIET_WAIT_S
    while True:
        until = deadline if quiet is None else quiet if deadline is None else min(quiet, deadline)
        try:
            return wait_update(store, ref, uid, delivery.after, until)
        except TimeoutError:
            unserved = _unserved(store, ref)
            if deadline is not None and time.monotonic() >= deadline:
                live = (
                    f"no live worker can run it now: {unserved}"
                    if unserved
                    else f"live workers serve the run (`durable describe {ref.workflow_id}` shows what it waits on)"
                )
                raise CliError(
                    f"update {name!r} ({uid}) of {ref.workflow_id} had no outcome within the timeout; "
                    f"it stays delivered: `{again}` keeps waiting; {live}"
                ) from None
            quiet = None
            echo(f"update id: {uid}  (wait again with --update-id {uid})", err=True)
            if unserved:
                echo(
                    f"warning: no live worker can run update {name!r} now: {unserved}; "
                    "it stays delivered and runs when one can",
                    err=True,
                )
        except WorkflowBlocked as exc:  # blocked while we waited: the update runs after the repair
            raise CliError(
                f"{blocked_text(ref.workflow_id, exc.run_id or ref.run_id, exc.kind, exc.reason)}; "
                f"update {name!r} ({uid}) stays delivered and runs once the run is repaired: "
                f"`{again}` waits for it"
            ) from None


@click.command()
@click.argument("workflow_id", metavar="ID")
@click.argument("name")
@click.argument("args", nargs=-1, metavar="[ARGS_JSON]...")
@click.option(
    "--update-id",
    default=None,
    help="The update's id; calling again with the same id runs nothing and prints the first outcome, "
    "whatever the arguments (default: generated; printed to stderr if the outcome takes over 2 s).",
)
@click.option(
    "--timeout", type=Seconds(), default=None, help="Seconds to wait for the outcome (default: forever)."
)
@click.option(
    "--app", "apps", multiple=True, metavar="MODULE", help="Check NAME and ARGS against the workflow's class."
)
@click.option("--json", "as_json", is_flag=True, help="Print only the handler's result, as one JSON value.")
@pass_state
def update(
    state: CliState,
    workflow_id: str,
    name: str,
    args: tuple[str, ...],
    update_id: str | None,
    timeout: float | None,
    apps: tuple[str, ...],
    as_json: bool,
) -> None:
    """Run the @update handler NAME with ARGS (JSON values) in workflow ID's run; print its result.

    A rejected update (its validator raised, ARGS do not fit the handler, or no such @update)
    and a handler that raised exit 1 with an error line; an update to a blocked run is refused.
    Warns at once when no live worker can run it. The update stays delivered when the wait
    ends early (--timeout, Ctrl-C): the messages say how to wait again with --update-id,
    which gets the same outcome and runs it once.
    """
    if apps:
        load_apps(apps)
    values = parse_args(args)
    stub = _stub(state, workflow_id)
    uid = update_id or f"cli-{new_run_id().lower()}"
    again = _again(workflow_id, name, args, uid)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        delivery = send_update(stub.store, stub.workflow_type, workflow_id, name, values, uid)
    except KeyboardInterrupt:
        echo(
            f"update id: {uid}; it may have been delivered: `{again}` sends it again (it runs once)", err=True
        )
        raise
    try:
        if delivery.after == "0-0" and (first := reused_differently(stub.store, delivery, name, values)):
            echo(
                f"warning: update id {uid!r} was first sent as {first}: this call sent nothing, "
                "and the outcome printed is that update's",
                err=True,
            )
        outcome = _wait_outcome(stub.store, delivery, name, deadline, again)
    except KeyboardInterrupt:
        echo(f"update id: {uid} stays delivered: `{again}` waits for its outcome", err=True)
        raise
    try:
        value = update_result(outcome, workflow_id, name)
    except SerializationError as exc:
        # A class this process does not load (the CLI imports no app code): the update ran, and
        # its result is shown as `durable result` shows such values, not as a failure.
        completed = getattr(outcome, "result", None) if getattr(outcome, "error", None) is None else None
        if not exc.type_name or completed is None:
            raise
        value = codec.view(completed)
    except DurableError:
        raise
    except Exception as exc:  # noqa: BLE001 - the handler's own error, reported as one line
        raise CliError(
            f"update {name!r} ({uid}) of {workflow_id} failed: {type(exc).__name__}: {exc}"
        ) from None
    if as_json:
        echo(to_json(value))
    else:
        echo(f"update {name!r} ({uid}) of {workflow_id}: {to_json(value)}")


@click.command()
@click.argument("workflow_id", metavar="ID")
@click.argument("name")
@click.argument("args", nargs=-1, metavar="[ARGS_JSON]...")
@click.option(
    "--app", "apps", multiple=True, metavar="MODULE", help="Module defining the workflow (required)."
)
@pass_state
def query(state: CliState, workflow_id: str, name: str, args: tuple[str, ...], apps: tuple[str, ...]) -> None:
    """Call the @query method NAME on workflow ID's state (replayed here from its history).

    Needs --app: the run's state is rebuilt here, from its history and the workflow's code.
    """
    if not apps:
        # Checked here, not by click (exit 2 and a usage block): one error line, exit 1.
        raise CliError("query needs --app MODULE: the run's state is replayed here with the workflow's code")
    load_apps(apps)
    values = parse_args(args)
    echo(to_json(_stub(state, workflow_id).query(name, *values)))


@click.command()
@click.argument("workflow_id", metavar="[ID]", required=False)
@click.option("--reason", default="", help="Why (recorded).")
@WHERE
@YES
@pass_state
def cancel(state: CliState, workflow_id: str | None, reason: str, where: str | None, yes: bool) -> None:
    """Request cancellation: the workflow gets CancelledError where it waits and may clean up.

    `--where EXPR`: of every open run EXPR selects (counted and confirmed first; `--yes`
    skips the question); each one's workflow id is printed as it is sent.
    """
    batch = one_or_where("cancel", workflow_id, where)
    if batch is not None:
        run_batch(state.existing_store, batch, "cancel", reason, yes=yes)
        return
    assert workflow_id is not None
    stub = _stub(state, workflow_id)
    stub.cancel(reason)
    echo(f"cancellation requested for {workflow_id}")
    # Cancelling runs workflow code (its cleanup): a blocked run runs none until it moves.
    note = cancel_note(workflow_id, stub.blocked(), FOUND_ON_READ)
    if note:
        echo(f"note: {note}", err=True)


@click.command()
@click.argument("workflow_id", metavar="[ID]", required=False)
@click.option("--reason", default="", help="Why (recorded).")
@WHERE
@YES
@pass_state
def terminate(state: CliState, workflow_id: str | None, reason: str, where: str | None, yes: bool) -> None:
    """Close workflow ID's run now; no workflow code runs.

    `--where EXPR`: every open run EXPR selects (counted and confirmed first; `--yes` skips
    the question); each one's workflow id is printed as it is closed.
    """
    batch = one_or_where("terminate", workflow_id, where)
    if batch is not None:
        run_batch(state.existing_store, batch, "terminate", reason, yes=yes)
        return
    assert workflow_id is not None
    _stub(state, workflow_id).terminate(reason)
    echo(f"terminated {workflow_id}")


@click.command()
@click.argument("workflow_id", metavar="ID")
@pass_state
def status(state: CliState, workflow_id: str) -> None:
    """Print the status word of workflow ID's current run, and why: what an open run waits on
    or what blocks it; how a closed one ended (its failure, the cancel or terminate reason)."""
    stub = _stub(state, workflow_id)
    word = stub.status()
    if word in CLOSED_STATUSES:
        outcome = stub.describe().outcome
        ended = outcome.reason() if outcome is not None else ""
        echo(f"{word} ({ended})" if ended else word)
        return
    info = stub.describe()  # the blocked reason and the retrying activities, in one read
    if info.blocked:
        echo(f"{info.status} (blocked: {info.blocked.message})")
    else:
        # Redis's clock: the retry's due time was set on it, this host's may be off.
        now_ms = stub.store.server_time_ms()
        why = info.retrying(now_ms) + info.queued() + info.running()
        why += [info.workflow_task] if info.workflow_task else []
        if len(why) > MOST_NAMED:  # a wide fan-out: describe lists every step
            why[MOST_NAMED:] = [f"{len(why) - MOST_NAMED} more activities (`durable describe {workflow_id}`)"]
        task_pending = bool(info.workflow_task)
        waits = in_words(info.pending, now_ms, info.extra.get("signals_buffered"), task_pending=task_pending)
        why += [waits] if waits else []
        echo(f"{info.status} ({'; '.join(why)})" if why else info.status)


@click.command()
@click.argument("workflow_id", metavar="ID")
@click.option("--timeout", type=Seconds(), default=None, help="Seconds to wait (default: forever).")
@pass_state
def result(state: CliState, workflow_id: str, timeout: float | None) -> None:
    """Wait for workflow ID to close; print its result as JSON (a failed run exits 1).

    A dataclass, pydantic model or enum in the result whose class this process does not load
    (the CLI imports no application code) prints as ``{"__type__": "app.Receipt", <fields>}``.
    Redis not answering (a restart, a stall) is waited out, for up to 60 s at a time."""
    deadline = None if timeout is None else time.monotonic() + timeout
    unanswered_since: float | None = None
    while True:
        try:
            stub = _stub(state, workflow_id)
            left = timeout  # as given (its messages say it), unless an outage took some of it
            if unanswered_since is not None and deadline is not None:
                left = max(0.0, deadline - time.monotonic())
            value = _result(stub, left)
            break
        except (redis.ConnectionError, redis.TimeoutError, RedisUnavailable) as exc:
            now = time.monotonic()
            if unanswered_since is None:
                unanswered_since = now
                echo(f"note: Redis does not answer ({one_line(exc)}); waiting for it", err=True)
            if now - unanswered_since > OUTAGE_RIDE_S or (deadline is not None and now + 1.0 >= deadline):
                raise
            time.sleep(1.0)
    echo(to_json(value))


COMMANDS = [start, signal, update, query, cancel, terminate, status, result]
