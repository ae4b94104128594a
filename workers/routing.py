"""Tasks of a type this worker lacks: left for a live worker that has it, parked only after a grace.

Workers of one queue may run different ``--app`` modules. A worker that reads a
workflow or activity task whose type its app does not define does not park it
(that would block a run another worker could run): it hands the task back to its
queue. The hand-back goes through the timers set (``T:timers``), so the task
reappears a moment later and this worker does not read it straight back in a loop.

Whether some live worker of the queue registered the type (the worker registry,
:mod:`durable.store.workers`) decides how long that moment is:

* one does: :data:`SERVED_DELAY_MS`, and the task is its to take;
* none does: :data:`UNSERVED_DELAY_MS`. The task carries since when it has been
  unserved (``unserved``, Redis time in ms), across hand-backs. Once no live worker
  has served the type for the grace (``--unknown-type-grace``, default
  :data:`UNKNOWN_TYPE_GRACE` s), the task is parked and its run blocked, with a
  reason naming the type and the queue. `durable repair ID` re-queues it once a
  worker with the type runs.

Only this path reads the registry (at most once per :data:`LIVE_CACHE_S` per worker):
a task whose type the worker has costs nothing here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from durable import events as ev
from durable.errors import HistoryTooNew, UnknownTypeError
from durable.release import release
from durable.replay import Driver
from durable.store.keys import handed_back_member, is_private
from durable.store.redis_store import CLOSED_STATUSES, RedisStore
from durable.store.tasks import ActivityTask
from durable.store.workers import WorkerInfo, takes_new_runs

__all__ = ["LIVE_CACHE_S", "SERVED_DELAY_MS", "UNKNOWN_TYPE_GRACE", "UNSERVED_DELAY_MS", "Lacked", "Routing"]

log = logging.getLogger("durable.worker")

UNKNOWN_TYPE_GRACE = 60.0
"""Seconds a task waits for a live worker of its queue that has its type before it is parked."""

SERVED_DELAY_MS = 100
"""A task another live worker can run reappears in its queue after this (so the worker that
lacks the type does not spin on it while the other one is busy)."""

UNSERVED_DELAY_MS = 1000
"""A task no live worker can run is looked at again this often until its grace ends."""

LIVE_CACHE_S = 1.0
"""How long one read of the worker registry answers "who serves this type" here."""


class TypeNotHere(UnknownTypeError):
    """The run's workflow type is not in this worker's ``--app`` (or its class lacks a patch the
    run recorded): another worker may run it (:class:`Routing` leaves the task for it)."""

    def __init__(self, name: str, *, patches: Sequence[str] = ()) -> None:
        what = f"workflow type {name!r}" + (f" with patches {list(patches)!r}" if patches else "")
        super().__init__(
            f"{what} is not defined in this worker's --app modules; start a worker "
            "with the module that defines it"
        )
        self.name = name
        self.patches = tuple(patches)


class Routing:
    """What a worker does with a task whose type it lacks: hand it back, or park it.

    Args:
        store: The store.
        grace: Seconds without a live worker that serves the type before a task is parked.
        on_timer: Told the due time of each hand-back (the worker's scheduler re-adds it).
    """

    def __init__(
        self,
        store: RedisStore,
        grace: float = UNKNOWN_TYPE_GRACE,
        on_timer: Callable[[int], None] = lambda _due: None,
    ) -> None:
        self.store = store
        self.grace_ms = int(grace * 1000)
        self.on_timer = on_timer
        self._lock = threading.Lock()  # activity threads and the main thread ask at once
        self._live: tuple[float, list[WorkerInfo], dict[str, str]] = (float("-inf"), [], {})
        self._unserved: set[tuple[str, str, str]] = set()  # (kind, queue, type) logged as unserved

    def workflow(
        self,
        p: int,
        stream: str,
        entry_id: str,
        fields: Mapping[bytes, bytes],
        record: Mapping[str, str],
        patches: Sequence[str] = (),
        needed: int = 1,
    ) -> str:
        """Route a workflow task whose type (with ``patches``, recorded by the run) this worker
        lacks; ``needed``: the history format its history needs (a worker that does not read it
        cannot take it either). Returns ``handed back``, ``parked`` or ``void``."""
        name, queue = record.get("type", ""), record.get("queue", "default")
        served = any(_declares(w, name, patches) and _reads(w, needed) for w in self._servers(record))
        return self._route_run(
            (p, stream, entry_id, fields),
            record,
            what=("workflow", queue, name),
            detail=f" declaring patches {list(patches)!r}" if patches else "",
            served=served,
        )

    def _route_run(
        self, task: tuple[int, str, str, Mapping[bytes, bytes]], record: Mapping[str, str], **how: Any
    ) -> str:
        """:meth:`_route` a workflow task ``(partition, stream, entry id, fields)`` of the run ``record``."""
        p, stream, entry_id, fields = task
        rid = fields.get(b"run", b"").decode()
        return self._route(
            p=p,
            stream=stream,
            entry_id=entry_id,
            fields=fields,
            first=_first_unserved(fields),
            run_id=rid,
            workflow_id=record.get("workflow_id", "ID"),
            member=lambda first: handed_back_member(rid, first),
            **how,
        )

    def newer_history(
        self,
        p: int,
        stream: str,
        entry_id: str,
        fields: Mapping[bytes, bytes],
        record: Mapping[str, str],
        exc: HistoryTooNew,
        started: ev.WorkflowStarted | None = None,
    ) -> str:
        """Route a workflow task whose run's history needs a history format past this release's
        (:mod:`durable.history_format`: a newer release wrote it): left to a live worker of a
        release that reads it and defines the run's type (``started``: its first event, when
        known) with the patches it recorded; returns ``handed back``, ``parked`` or ``void``."""
        queue = record.get("queue", "default")
        servers = [w for w in self._servers(record) if _reads(w, exc.needed)]
        if started is not None:  # one that reads it but lacks the type hands it back too
            servers = [w for w in servers if _declares(w, started.workflow_type, started.patches)]
        served = bool(servers)
        rid = fields.get(b"run", b"").decode()
        return self._route_run(
            (p, stream, entry_id, fields),
            record,
            what=("workflow", queue, f"history format {exc.needed}"),
            lacks=(
                f"reads history format {exc.needed} (a newer release of durable decided run {rid}; "
                f"this worker runs durable {release()}, which reads up to format {exc.reads})"
            ),
            fix="upgrade durable on this queue's workers",
            block_kind="needs_upgrade",
            served=served,
        )

    def lacking(
        self,
        p: int,
        stream: str,
        entry_id: str,
        fields: Mapping[bytes, bytes],
        record: Mapping[str, str],
        exc: TypeNotHere | HistoryTooNew,
        lacked: Lacked,
    ) -> str:
        """Route a workflow task this worker cannot decide: it lacks the run's type (or a patch
        it recorded), or its history's format (:meth:`workflow`, :meth:`newer_history`). Each
        side asks for a worker that has all the run needs: one lacking only what the other has
        made both hand the task back for ever, never parked (a patch, then a format)."""
        started = lacked.started()
        if isinstance(exc, HistoryTooNew):
            return self.newer_history(p, stream, entry_id, fields, record, exc, started)
        patches = exc.patches or (tuple(started.patches) if started is not None else ())
        routed = {**record, "type": exc.name}
        return self.workflow(p, stream, entry_id, fields, routed, patches, lacked.history_format())

    def leave_to_newer_code(self, record: Mapping[str, Any], driver: Any, *, fresh: bool = False) -> bool:
        """Whether to leave the run's task to a worker declaring every patch the run recorded,
        which this worker's class lacks (its code predates them and would take the old branch):
        a run never decided (a client deployed before its workers) always -- it waits, then is
        parked saying which patches (:meth:`workflow`) --, any other while a live worker of its
        queue (and build) declares them (this code may not even replay its history). Without
        one (a patch retired from the code, or only old workers left) this worker decides, and
        says so once. ``fresh``: read the registry now (a worker started a moment ago counts)."""
        if record.get("status") == "pending":
            return True
        name, recorded = driver.workflow_type, driver.recorded_patches
        if any(_declares(w, name, recorded) for w in self._servers(record, fresh=fresh)):
            return True
        what = ("patch", name, ",".join(driver.undeclared_patches))
        if what not in self._unserved:
            self._unserved.add(what)
            log.warning(
                "runs of %s recorded patches %s that this worker's class does not declare, and no live "
                "worker declares them: deciding them with this code (keep a patch id in "
                "Workflow.patches while runs that recorded it are open)",
                name,
                list(driver.undeclared_patches),
            )
        return False

    def _servers(self, record: Mapping[str, Any], *, fresh: bool = False) -> list[WorkerInfo]:
        """The live workers that read the run's workflow tasks."""
        queue, build = record.get("queue", "default"), record.get("build", "")
        live, current = self._registry(queue, fresh=fresh)
        if build:  # a pinned run's tasks are read by the workers of its build only
            return [w for w in live if queue in w.queues and build in w.builds]
        return takes_new_runs(queue, current, live)

    def activity(self, task: ActivityTask, stream: str, entry_id: str, fields: Mapping[bytes, bytes]) -> str:
        """Route an activity task whose type this worker lacks; returns ``handed back``, ``parked``
        or ``void``."""
        p = task.partition
        queue = stream[len(self.store.keys.activity_tasks(p, "")) :]
        private = is_private(queue)  # a worker session's queue: only its host reads it
        served = False
        if not private:
            live, _ = self._registry(queue)
            served = any(queue in w.queues and task.name in w.activities for w in live)
        return self._route(
            p=p,
            stream=stream,
            entry_id=entry_id,
            fields={"body": task.encode()},  # as `durable repair` reads parked activity tasks
            first=_first_unserved(fields),
            what=("activity", queue, task.name),
            served=served,
            grace_ms=0 if private else self.grace_ms,
            run_id=task.run_id,
            workflow_id=task.workflow_id,
            member=lambda first: handed_back_member(task.run_id, first, task.activity_id),
        )

    def _route(
        self,
        *,
        p: int,
        stream: str,
        entry_id: str,
        fields: Mapping[Any, Any],
        first: int,
        what: tuple[str, str, str],
        served: bool,
        run_id: str,
        workflow_id: str,
        member: Callable[[int], str],
        grace_ms: int | None = None,
        detail: str = "",
        lacks: str = "",
        fix: str = "start a worker whose --app defines it",
        block_kind: str = "unknown_type",
    ) -> str:
        """Hand the task back (``served``, or within the grace) or park it, or drop it when its
        run closed meanwhile (``void``); see the module docstring."""
        kind, queue, name = what
        lacks = lacks or f"serves {kind} type {name!r}{detail}"
        grace_ms = self.grace_ms if grace_ms is None else grace_ms
        run = (p, run_id, grace_ms) if kind == "workflow" and run_id else None  # the views say it
        now = self.store.server_time_ms()
        if served:
            if what in self._unserved:
                self._unserved.discard(what)
                log.info("queue %s: a live worker %s now", queue, lacks)
            due = now + SERVED_DELAY_MS
            self.store.hand_back(stream, entry_id, member(0), due, run)
            self.on_timer(due)
            return "handed back"
        first = first or now
        waited = now - first
        if waited >= grace_ms:
            if run_id and self.store.run_status(p, run_id) in CLOSED_STATUSES:
                # Terminated (or closed otherwise) meanwhile: the task is void, not a dead letter
                # whose fix (`durable repair`) a closed run refuses.
                self.store.ack_task(stream, entry_id)
                log.info("dropped %s task %s of run %s: the run is closed", kind, entry_id, run_id)
                return "void"
            reason = (
                f"no live worker on queue {queue!r} {lacks} (for {waited / 1000:.0f} s): "
                f"{fix}, then `durable repair {workflow_id}`"
            )
            self.store.park(
                p=p,
                stream=stream,
                entry_id=entry_id,
                kind=kind,
                reason=reason,
                fields=fields,
                run_id=run_id,
                block=True,
                block_kind=block_kind,
            )
            return "parked"
        if what not in self._unserved:
            self._unserved.add(what)
            log.warning(
                "queue %s: no live worker %s%s; its tasks wait up to %.0f s for one, then are parked",
                queue,
                lacks,
                " (not in this worker's --app)" if block_kind == "unknown_type" else "",
                grace_ms / 1000,
            )
        due = min(now + UNSERVED_DELAY_MS, first + grace_ms)
        self.store.hand_back(stream, entry_id, member(first), due, run)
        self.on_timer(due)
        return "handed back"

    def _registry(self, queue: str, *, fresh: bool = False) -> tuple[list[WorkerInfo], str]:
        """The live workers, and ``queue``'s current build (cached for :data:`LIVE_CACHE_S`
        unless ``fresh``)."""
        with self._lock:
            read_at, live, current = self._live
            now = time.monotonic()
            if fresh or now - read_at >= LIVE_CACHE_S:
                read_at, live, current = now, self.store.live_workers(), {}
            if queue not in current:
                current[queue] = self.store.current_build([queue])[0]
            self._live = (read_at, live, current)
            return live, current[queue]


@dataclass(frozen=True)
class Lacked:
    """What a worker that cannot decide a run knows of it: its driver as far as it got, and the
    history rows it loaded."""

    driver: Driver | None
    rows: Sequence[tuple[bytes, Mapping[bytes, bytes]]]

    def started(self) -> ev.WorkflowStarted | None:
        """The run's WorkflowStarted: replayed, or the first row loaded (``None``: not known)."""
        if self.driver is not None and self.driver.started is not None:
            return self.driver.started
        if not self.rows or not self.rows[0][0].endswith(b"-1"):
            return None
        try:
            event = ev.decode(self.rows[0][1][b"e"]).event
        except Exception:  # noqa: BLE001 - not known: routed by the type alone, as before
            return None
        return event if isinstance(event, ev.WorkflowStarted) else None

    def history_format(self) -> int:
        """The highest history format of the entries the driver applied (1: none known)."""
        return self.driver.history_format if self.driver is not None else 1


def _reads(worker: WorkerInfo, needed: int) -> bool:
    """Whether ``worker`` replays a history needing format ``needed`` (formats past 1 are said
    by releases from the marker on; an older worker's registry entry says 0)."""
    return needed <= 1 or worker.history_format >= needed


def _declares(worker: WorkerInfo, name: str, patches: Sequence[str]) -> bool:
    return name in worker.workflows and set(patches) <= set(worker.patches.get(name, ()))


def _first_unserved(fields: Mapping[bytes, bytes]) -> int:
    """Since when (Redis ms) the task has found no live worker for its type; 0: not known."""
    try:
        return int(fields.get(b"unserved") or 0)
    except ValueError:
        return 0
