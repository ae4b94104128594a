"""``durable repair``: re-queue a blocked run, or every blocked run, once its cause is mended (a
deploy that decides as its history says, an input set aside, a run moved to other workers, the
entries a half-written commit left)."""

from __future__ import annotations

import click

from durable.blocked import repair_note
from durable.errors import ConfigurationError, WorkflowClosed, WorkflowNotFound
from durable.ids import check_build_id
from durable.runinfo import BLOCKED_KINDS, NO_LIVE_WORKER
from durable.store.redis_store import RedisStore
from durable.store.workers import FOUND_ON_READ

from .core import CliState, pass_state
from .render import echo
from .runs import _stub


@click.command()
@click.argument("workflow_id", metavar="[ID]", required=False)
@click.option(
    "--build-id",
    default=None,
    help="Also move the run to this build's workers (check first with `durable replay` that the "
    "new code replays its history).",
)
@click.option(
    "--unversioned",
    is_flag=True,
    help="Move a run pinned to a build back to unversioned workers (those without --build-id).",
)
@click.option(
    "--drop-input",
    is_flag=True,
    help="First move the inbox item that blocks the run (e.g. a result this worker cannot decode) "
    "to the dead letters (`durable list --dead` shows it).",
)
@click.option(
    "--drop-uncommitted",
    is_flag=True,
    help="First move the history entries a commit that failed half-way wrote past the run record "
    "(history_corrupt: 'holds N events but the run record counts M') beside it, its inputs back to the inbox.",
)
@click.option("--blocked", "every_blocked", is_flag=True, help="Re-queue every blocked run (instead of ID).")
@click.option(
    "--type", "workflow_type", default=None, help="With --blocked: only runs of this workflow type."
)
@click.option(
    "--kind",
    type=click.Choice([k for k in BLOCKED_KINDS if k != NO_LIVE_WORKER]),
    default=None,
    help="With --blocked: only runs blocked for this reason (as `durable describe` names it).",
)
@pass_state
def repair(
    state: CliState,
    workflow_id: str | None,
    build_id: str | None,
    unversioned: bool,
    drop_input: bool,
    drop_uncommitted: bool,
    every_blocked: bool,
    workflow_type: str | None,
    kind: str | None,
) -> None:
    """Re-queue a blocked run (after deploying code that decides as its history says).

    `durable repair --blocked [--type T] [--kind K]` re-queues every blocked run (of a type,
    blocked for a reason), e.g. all the runs a bad deploy blocked, once the fix is deployed.
    """
    if build_id == "" or (build_id and unversioned):
        raise click.UsageError("give --build-id BUILD (a build id) or --unversioned (no build), not both")
    if build_id:
        try:
            check_build_id(build_id)
        except ConfigurationError as exc:
            raise click.UsageError(str(exc)) from None
    if unversioned:
        build_id = ""  # moved to the unpinned streams, which unversioned workers read
    if every_blocked:
        if workflow_id or build_id is not None or drop_input:
            raise click.UsageError(
                "--blocked repairs every blocked run: give no ID, --build-id, --unversioned or --drop-input"
            )
        _repair_blocked(state.existing_store, workflow_type, kind)
        return
    if workflow_id is None:
        raise click.UsageError("give the ID of the run to repair, or --blocked for every blocked run")
    if workflow_type or kind:
        raise click.UsageError("--type and --kind go with --blocked")
    store = state.existing_store
    if drop_uncommitted:
        ref, moved = store.drop_uncommitted(workflow_id)
        echo(
            f"re-queued {workflow_id} (run {ref.run_id}); {moved} uncommitted history entries moved to its log"
        )
        return
    if build_id is None:
        was = _stub(state, workflow_id).blocked()
        ref = store.repair(workflow_id, drop_input=drop_input)
        dropped = "; its blocking input (if any) is now a dead letter" if drop_input else ""
        echo(f"re-queued {workflow_id} (run {ref.run_id}){dropped}")
        note = repair_note(was, FOUND_ON_READ)  # nothing recorded to clear: said
        if note:
            echo(f"note: {note}", err=True)
        return
    if drop_input:
        raise click.UsageError("--drop-input and --build-id (or --unversioned) go in two separate repairs")
    where = f"build {build_id}" if build_id else "unversioned workers"
    ref, closed = store.repair_on(workflow_id, build_id)
    if closed:
        status = _stub(state, workflow_id).status()
        echo(f"moved {workflow_id} (run {ref.run_id}) to {where}; it has since {status}")
        return
    echo(f"re-queued {workflow_id} (run {ref.run_id}) on {where}")
    unserved = store.unserved_reason(store.run_record(ref))
    if unserved:  # moved where nothing runs it yet: say so now, not only in describe
        echo(f"warning: {unserved}", err=True)


def _repair_blocked(store: RedisStore, workflow_type: str | None, kind: str | None) -> None:
    repaired = 0
    for run in list(store.blocked_runs(workflow_type=workflow_type, kind=kind)):
        try:
            store.repair(run["workflow_id"])
        except (WorkflowClosed, WorkflowNotFound):  # closed or purged since it was listed
            continue
        repaired += 1
        echo(f"re-queued {run['workflow_id']} (run {run['run_id']})")
    which = [f"of type {workflow_type!r}"] if workflow_type else []
    if kind:
        which.append(f"of kind {kind}")
    echo(f"re-queued {repaired} blocked run(s) {' and '.join(which)}".rstrip())


COMMANDS = [repair]
