"""The worker registry in Redis: which workers live, what they serve, which build takes new runs.

Every worker writes an entry (``prefix:worker:<name>``, JSON) from its scheduler thread every
few seconds, with a time to live of several heartbeats, and names itself in ``prefix:workers``.
An entry whose key expired is a worker that died (a graceful stop deletes it at once); readers
drop such names from the index.

The registry answers the operator's questions (``durable workers``), tells a versioned worker
whether the queue's current build still has a live worker (if not, it takes over, see
:meth:`WorkerRegistry.claim_current_build`), and tells clients that a run pinned to a build is
stranded because no live worker serves that build (:func:`no_live_worker_reason`), and
operators that a run waits because no live worker serves its queue (:func:`no_worker_on_queue_reason`).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..blocked import HISTORY_FULL
from ..history_budget import history_full_reason
from ..runinfo import DATA_LOST, NO_LIVE_WORKER, BlockedReason, blocked_reason
from .backlog import Backlogs
from .child_blocks import blocked_children
from .connect import CommandRefused
from .held import STARVED_QUEUE, starved_queues, starved_reason
from .key_types import is_wrong_type
from .keys import is_private, private_queue
from .memory import REDIS_CANNOT_PERSIST, REDIS_OOM, MemoryStore
from .records import HEARTBEAT_S, OPEN_STATUSES, REGISTRY_TTL_MS, text
from .start_failures import StartFailures

__all__ = [
    "FOUND_ON_READ",
    "HEARTBEAT_S",
    "REGISTRY_TTL_MS",
    "WorkerInfo",
    "WorkerRegistry",
    "drain_targets",
    "no_live_worker_reason",
    "no_worker_on_queue_reason",
    "no_worker_reason",
    "SLOW_DECISION_S",
    "served_queues",
    "stalled_decision",
    "takes_new_runs",
]

FOUND_ON_READ = (NO_LIVE_WORKER, STARVED_QUEUE, REDIS_OOM, REDIS_CANNOT_PERSIST, DATA_LOST, HISTORY_FULL)
"""The blocked kinds :meth:`WorkerRegistry.why_blocked` finds on read, not recorded: nothing for
``durable repair`` to clear; the run moves on once their cause is gone (the UI's copy:
``FOUND_ON_READ`` in ``workers/server/static/ui.js``, kept equal by a test)."""


@dataclass(frozen=True)
class WorkerInfo:
    """One worker's registry entry.

    Attributes:
        name: The worker's consumer name (unique per process).
        host: The machine's host name.
        pid: The worker's process id.
        build: Its build id (``""``: unversioned, it pins nothing).
        compatible: Other builds whose pinned runs it also decides.
        queues: The task queues it serves (its private queue left out).
        workflows: The workflow type names it can run.
        activities: The activity type names it can run.
        started: When it started (Redis time, ms).
        seen: Its last heartbeat (Redis time, ms).
        complete: Whether ``workflows`` and ``activities`` name everything it can run: its
            ``--app`` modules were loaded and scanned before it registered (``durable
            worker``). A worker started in-process registers plain-function activities (and
            classes defined later) only when first used, so its lists may be partial.
        patches: Per workflow type that declares some, its ``Workflow.patches``: a run that
            recorded a patch this worker's class lacks is left to a worker that declares it.
        threads: Its activity threads (0: not said, an older release or an in-process worker).
        held: How many of them are held by abandoned attempts: past their start-to-close or
            schedule-to-close timeout, or of a closed run (Python cannot stop a thread).
        stuck: The first of those attempts, each in a few words starting with its activity's name.
        busy: How many of its activity threads run an attempt (abandoned ones too).
        running: The first few attempts running that are not abandoned, in a few words each.
        claim_idle_ms: Its ``--claim-idle``: how long a task stays delivered to a worker that
            went away before this one takes it over (0: not said, an older release).
        sticky_timeout_ms: Its ``--sticky-timeout``: how long a workflow task waits on a gone
            worker's private queue before this one moves it to the run's queue (0: not said,
            or only once that worker's lease lapses).
        stopping: When its stop began (Redis time, ms; 0: it is not stopping). A stopping worker
            takes no new task; it finishes its running activities (up to its ``--grace``), then
            leaves the registry.
        draining: When its drain began (Redis time, ms; 0: it is not draining; ``kill -USR1``, or
            a reload that deployed a new build). A draining worker starts no new run: it decides
            the runs pinned to its builds, and stops once none of them is open.
        pinned_left: While draining: the open runs pinned to its builds on its queues, as
            counted at its last heartbeat.
        deciding_run: The run whose decision has run workflow code without yielding for longer
            than :data:`SLOW_DECISION_S` at its last heartbeat (``""``: none). Decisions run on
            the worker's main thread: it decides nothing else until that one returns.
        deciding: That decision in words: ``45 s at app.py:12 in handle (--decision-timeout
            off)``.
        async_stall: How long the event loop of its ``async def`` activities has not run, and
            where it is stuck (``"20 s (stuck at app.py:153 in spin)"``; ``""``: it runs). Every
            async activity of the worker waits meanwhile.
        release: The release of durable it runs (:func:`durable.release.release`; ``""``: an
            older release, which did not say).
        history_format: The newest history format it reads (:mod:`durable.history_format`;
            0: an older release, which did not say).
    """

    name: str
    host: str = ""
    pid: int = 0
    build: str = ""
    compatible: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    workflows: tuple[str, ...] = ()
    activities: tuple[str, ...] = ()
    started: int = 0
    seen: int = 0
    complete: bool = False
    patches: dict[str, tuple[str, ...]] = field(default_factory=dict)
    threads: int = 0
    held: int = 0
    stuck: tuple[str, ...] = ()
    busy: int = 0
    running: tuple[str, ...] = ()
    claim_idle_ms: int = 0
    sticky_timeout_ms: int = 0
    stopping: int = 0
    draining: int = 0
    pinned_left: int = 0
    deciding_run: str = ""
    deciding: str = ""
    async_stall: str = ""
    release: str = ""
    history_format: int = 0

    @property
    def state(self) -> str:
        """``"stopping"``, ``"draining"`` or ``"serving"`` (takes new work): a stop overrides a
        drain (a drained worker stops)."""
        return "stopping" if self.stopping else "draining" if self.draining else "serving"

    @property
    def builds(self) -> set[str]:
        """The builds whose pinned runs this worker decides (``{""}`` when unversioned)."""
        return {self.build, *self.compatible} if self.build else {""}

    def to_json(self) -> str:
        """The entry as stored."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> WorkerInfo | None:
        """An entry read back (``None`` when it is not one: written by something else)."""
        try:
            # Fields a newer worker added are left out rather than making the entry unreadable.
            known = {f.name for f in fields(cls)}
            data = {k: v for k, v in json.loads(raw).items() if k in known}
            for name in ("compatible", "queues", "workflows", "activities", "stuck", "running"):
                items = data.get(name) or ()
                if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
                    return None  # a string would become its letters
                data[name] = tuple(items)
            data["patches"] = {str(k): tuple(v) for k, v in (data.get("patches") or {}).items()}
            info = cls(**data)
        except (ValueError, TypeError, AttributeError):
            return None
        plain = [
            info.name,
            info.host,
            info.build,
            info.deciding_run,
            info.deciding,
            info.async_stall,
            info.release,
        ]
        if not all(isinstance(v, str) for v in plain) or not all(
            isinstance(getattr(info, f), int) for f in _COUNTS
        ):
            return None  # wrongly typed fields: not an entry a worker wrote
        return info


SLOW_DECISION_S = 5.0
"""Seconds a decision may run workflow code without yielding before its worker's entry names it
(:attr:`WorkerInfo.deciding_run`): with ``--decision-timeout`` off or longer, the worker's main
thread waits for it, and the views say so rather than "not decided yet"."""


def stalled_decision(worker: WorkerInfo) -> str:
    """``worker``'s stalled decision in words (``""``: none): ``worker W has been deciding run R
    for 45 s at app.py:12 in handle (--decision-timeout off) without yielding; it decides nothing
    else until that returns``."""
    if not worker.deciding_run:
        return ""
    return (
        f"worker {worker.name} has been deciding run {worker.deciding_run} for {worker.deciding} without "
        "yielding; it decides nothing else until that returns"
    )


_COUNTS = tuple(f.name for f in fields(WorkerInfo) if f.type == "int")
"""A :class:`WorkerInfo`'s int fields (an entry whose JSON has other types there is not one)."""


def no_live_worker_reason(record: Mapping[str, Any], live: Iterable[WorkerInfo]) -> str | None:
    """Why an open run pinned to a build cannot move: no live worker serves that build on its queue.

    Args:
        record: The run record (``build``, ``queue``, ``status``, ``blocked``, ``workflow_id``).
        live: The live workers (:meth:`WorkerRegistry.live_workers`).

    Returns:
        The reason (it starts with ``"no live worker"``), or ``None``: the run is not
        pinned, is closed, is already blocked for another reason, or a live worker
        of its queue decides its build.
    """
    build = str(record.get("build") or "")
    if not build or record.get("blocked") or record.get("status", "pending") not in OPEN_STATUSES:
        return None
    queue = str(record.get("queue") or "default")
    if any(queue in w.queues and build in w.builds for w in live):
        return None
    wid = record.get("workflow_id") or "ID"
    return (
        f"no live worker serves build {build!r} on queue {queue!r}, and the run is pinned to it: start "
        f"`durable worker --build-id {build}` on that build's code (or `durable worker --build-id NEW --compatible-build-id "
        f"{build}`), or move the run with `durable repair {wid} --build-id NEW` (or `--unversioned`)"
    )


def no_worker_on_queue_reason(
    record: Mapping[str, Any], live: Iterable[WorkerInfo], running: Iterable[WorkerInfo] | None = None
) -> str | None:
    """Why an open run does not move: no live worker serves its queue at all (none was started,
    or they all stopped or died; for a run pinned to a build see :func:`no_live_worker_reason`),
    or the queue of an activity it waits on. Starting a worker on that queue moves it on.

    ``running``: the workers that run its activities (default ``live``: a draining worker
    starts no new run, but runs activities).

    Returns:
        The reason (it starts with ``"no live worker"``), or ``None``: the run is closed,
        blocked for another reason, or live workers serve the queues it waits on.
    """
    if record.get("blocked") or record.get("status", "pending") not in OPEN_STATUSES:
        return None
    live = list(live)
    served = {q for w in live for q in w.queues}
    queue = str(record.get("queue") or "default")
    if not record.get("build") and queue not in served:
        return f"no live worker serves queue {queue!r}: start one (`durable worker --app YOUR_APP --queue {queue}`)"
    build = str(record.get("build") or "")
    deciders = [w for w in live if queue in w.queues and (not build or build in w.builds)]
    workflow_type = str(record.get("type") or "")
    if workflow_type and _none_defines(deciders, "workflows", workflow_type):
        return (
            f"no live worker of queue {queue!r} defines workflow type {workflow_type!r}"
            f"{_near(deciders, 'workflows', workflow_type)} (they define "
            f"{_listed(deciders, 'workflows')}): start a worker whose --app defines it (a class renamed "
            f"since the run started keeps its old name with `name = {workflow_type!r}` on it)"
        )
    # Activities run on any live worker of their queue, whatever the run's build; a worker
    # session's, on the worker hosting it (its private queue).
    live = live if running is None else list(running)
    served = {q for w in live for q in (*w.queues, private_queue(w.name))}
    for step in (record.get("snapshot") or {}).get("pending") or ():
        if step.get("kind") != "activity" or not step.get("queue"):
            continue
        name, where = str(step.get("name") or ""), f"activity {step.get('name', '')!r} (id {step.get('id')})"
        if is_private(step["queue"]) and step["queue"] not in served:
            return (
                f"{where} runs in a worker session whose worker ({step['queue'][1:]}) is gone: the "
                "session is lost, and its activities fail with SessionLost (no worker can take them over)"
            )
        if step["queue"] not in served:
            return (
                f"no live worker serves queue {step['queue']!r}, where {where} waits: "
                f"start one (`durable worker --app YOUR_APP --queue {step['queue']}`)"
            )
        runners = [w for w in live if step["queue"] in w.queues]
        if name and _none_defines(runners, "activities", name):
            return (
                f"no live worker of queue {step['queue']!r} defines {where}{_near(runners, 'activities', name)} "
                f"(they define {_listed(runners, 'activities')}): start a worker whose --app defines it (renamed since, "
                f"a function keeps its old name with `@register_activity(name={name!r})`, an Activity "
                f"class with `name = {name!r}` in its body)"
            )
    return None


def _none_defines(workers: list[WorkerInfo], kind: str, name: str) -> bool:
    """Whether ``workers`` lack ``name`` among their ``kind`` (workflows or activities).

    Only workers whose lists are :attr:`~WorkerInfo.complete` count: one whose lists may be
    partial (started in-process, or an older release) is taken to define everything, so it
    never makes a run look blocked.
    """
    return (
        bool(workers)
        and all(w.complete for w in workers)
        and not any(name in getattr(w, kind) for w in workers)
    )


def _near(workers: list[WorkerInfo], kind: str, name: str) -> str:
    """``", did you mean 'send_email'?"`` when ``workers`` define a name close to ``name`` (a typo
    in the code that asked for it), else ``""``."""
    near = difflib.get_close_matches(
        name, sorted({n for w in workers for n in getattr(w, kind)}), n=1, cutoff=0.8
    )
    return f", did you mean {near[0]!r}?" if near else ""


def _listed(workers: list[WorkerInfo], kind: str) -> str:
    names = sorted({n for w in workers for n in getattr(w, kind)})
    if not names:  # an --app that imports its classes from other modules: it defines none
        return "none: their --app modules define no such class, check that --app names the modules that do"
    shown = ", ".join(repr(n) for n in names[:8])
    return shown + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def no_worker_reason(record: Mapping[str, Any], live: Iterable[WorkerInfo]) -> str | None:
    """Why no live worker can move an open run: :func:`no_live_worker_reason` for a run pinned
    to a build, :func:`no_worker_on_queue_reason` for the others (``None``: one can). Stopping
    workers take no new task: they do not count, and the reason names those of the run's queues;
    draining workers start no new run: they count only for runs pinned to their builds."""
    live = list(live)
    taking = [w for w in live if w.state == "serving" or (w.state == "draining" and record.get("build"))]
    running = [w for w in live if w.state != "stopping"]
    reason = no_live_worker_reason(record, taking) or no_worker_on_queue_reason(
        _without_finishing(record, live), taking, running
    )
    if reason is None:
        return None
    queues = run_queues(record)
    stopping = [w.name for w in live if w.stopping and queues & set(w.queues)]
    if stopping:
        reason += f" ({_who(stopping)} stopping: finishing running activities, taking no new task)"
    draining = [w for w in live if w.state == "draining" and queues & set(w.queues)]
    if draining and not record.get("build"):
        builds = ", ".join(sorted({w.build for w in draining}))
        reason += f" ({_who([w.name for w in draining])} draining: finishing the runs pinned to {builds}, starting no new run)"
    return reason


def run_queues(record: Mapping[str, Any]) -> set[str]:
    """The queues an open run waits on: its own, and those of its pending steps."""
    pending = (record.get("snapshot") or {}).get("pending") or ()
    return {str(s["queue"]) for s in pending if s.get("queue")} | {str(record.get("queue") or "default")}


def running_entry(activity: str, workflow_id: str, seconds: float, *, timeout: bool) -> str:
    """A running attempt as a worker's entry lists it (:attr:`WorkerInfo.running`): ``fetch of
    workflow o-1 for 25 s (no timeout)``, as a stopping worker's views read it back."""
    return f"{_running_head(activity, workflow_id)}{seconds:.0f} s{'' if timeout else ' (no timeout)'}"


def _running_head(activity: object, workflow_id: object) -> str:
    return f"{activity} of workflow {workflow_id} for "


def _without_finishing(record: Mapping[str, Any], live: Iterable[WorkerInfo]) -> Mapping[str, Any]:
    """``record`` without the pending activities a stopping worker is running (its entry's
    ``running`` names them): it finishes them first, and their results go to the run's own
    queue; they wait on no worker of theirs."""
    workflow_id = record.get("workflow_id") or record.get("id")
    running = {r for w in live if w.stopping for r in w.running}
    snapshot = record.get("snapshot") or {}
    pending = snapshot.get("pending") or ()
    if not running or not workflow_id or not pending:
        return record
    kept = [
        step
        for step in pending
        if not (
            step.get("kind") == "activity"
            and any(r.startswith(_running_head(step.get("name"), workflow_id)) for r in running)
        )
    ]
    return record if len(kept) == len(pending) else {**record, "snapshot": {**snapshot, "pending": kept}}


def _who(names: list[str]) -> str:
    return f"worker {names[0]} is" if len(names) == 1 else f"workers {', '.join(names)} are"


def drain_targets(
    live: Sequence[WorkerInfo], names: Iterable[str] = (), builds: Iterable[str] = ()
) -> list[WorkerInfo]:
    """The live workers ``durable drain`` asks: those named, and every one of ``builds``.

    Raises:
        LookupError: a name or build no live worker has (the message says which are live).
    """
    names, builds = list(dict.fromkeys(names)), list(dict.fromkeys(builds))
    by_name = {w.name: w for w in live}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise LookupError(
            f"no live worker named {', '.join(map(repr, unknown))} (live: {', '.join(by_name) or 'none'}; "
            "`durable workers` lists them)"
        )
    chosen = [by_name[n] for n in names]
    for build in builds:
        of_build = [w for w in live if w.build == build]
        if not of_build:
            known = sorted({w.build for w in live if w.build})
            raise LookupError(
                f"no live worker of build {build!r} (live builds: {', '.join(known) or 'none'})"
            )
        chosen += [w for w in of_build if w not in chosen]
    return chosen


def served_queues(live: Iterable[WorkerInfo]) -> list[str]:
    """The shared queues ``live`` workers serve, sorted (private queues left out)."""
    return sorted({q for w in live for q in w.queues if not is_private(q)})


def takes_new_runs(queue: str, current: str, live: Iterable[WorkerInfo]) -> list[WorkerInfo]:
    """The live workers that start ``queue``'s new runs: unversioned ones, and those of the
    queue's ``current`` build (versioned workers of other builds only decide their pinned runs);
    neither those stopping nor those draining."""
    return [
        w for w in live if queue in w.queues and (not w.build or w.build == current) and w.state == "serving"
    ]


DRAIN_ASK_TTL_MS = 6 * REGISTRY_TTL_MS
"""How long an operator's ask to drain waits for its worker's next heartbeat (a worker stalled
longer than its registry entry lives is gone by then)."""


class WorkerRegistry(MemoryStore, StartFailures, Backlogs):
    """Workers' registry entries, and the compare-and-set of a queue's current build."""

    def register_worker(self, info: WorkerInfo, ttl_ms: int = REGISTRY_TTL_MS) -> bool:
        """Write (or renew) ``info``; it lapses after ``ttl_ms`` unless written again. Returns
        whether an operator asked this worker to drain (:meth:`ask_drain`), read in the same
        round trip."""
        return self.renew_registration(info, ttl_ms)[0]

    def renew_registration(self, info: WorkerInfo, ttl_ms: int = REGISTRY_TTL_MS) -> tuple[bool, bool]:
        """:meth:`register_worker`, also saying whether there was no entry to renew (the first
        registration, or one that lapsed: the worker was taken for gone meanwhile)."""
        entry = self.keys.worker(info.name)
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(entry, info.to_json(), px=ttl_ms, get=True)
            pipe.sadd(self.keys.worker_index(), info.name)
            if info.build:  # on every renewal: a sweep that just dropped it gets it back
                pipe.sadd(self.keys.served_builds(), *(json.dumps([q, info.build]) for q in info.queues))
            pipe.exists(self.keys.worker_drain(info.name))
            replies = pipe.execute(raise_on_error=False)
        if is_wrong_type(replies[0]):
            # Its own entry, made another kind by hand: SET ... GET refuses it, and the live worker
            # stayed invisible to every view ("no live worker serves queue ..."). It is replaced.
            self.redis.delete(entry)
            self.redis.set(entry, info.to_json(), px=ttl_ms)
            replies[0] = None
        errors = [reply for reply in replies if isinstance(reply, Exception)]
        if errors:
            raise errors[0]
        return bool(replies[-1]), replies[0] is None

    def ask_drain(self, names: Iterable[str]) -> None:
        """Ask the workers ``names`` to drain (``durable drain``): each reads it at its next
        heartbeat (within :data:`HEARTBEAT_S`). The ask lapses with the registry's time to live
        times a few: a worker that is gone does not leave it behind."""
        with self.redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.set(self.keys.worker_drain(name), "1", px=DRAIN_ASK_TTL_MS)
            pipe.execute()

    def unregister_worker(self, name: str) -> None:
        """Remove a stopping worker's entry at once (others stop counting on it)."""
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.delete(self.keys.worker(name))
            pipe.srem(self.keys.worker_index(), name)
            pipe.execute()

    def declared_patches(self, workflow_type: str, queue: str) -> list[str]:
        """The patches the live workers serving ``queue`` declare for ``workflow_type`` (their
        union, sorted: a run that records one is decided only by workers declaring it)."""
        return sorted(
            {p for w in self.live_workers() if queue in w.queues for p in w.patches.get(workflow_type, ())}
        )

    def live_workers(self) -> list[WorkerInfo]:
        """Every worker whose entry has not lapsed, by name; lapsed names leave the index."""
        index = self.keys.worker_index()
        names = sorted(text(n) for n in self.redis.smembers(index))
        if not names:
            return []
        keys = [self.keys.worker(n) for n in names]
        # The entries are plain keys in different slots on a cluster.
        raw = self.redis.mget_nonatomic(keys) if self.cluster else self.redis.mget(keys)
        live, gone = [], []
        for name, value in zip(names, raw, strict=True):
            info = WorkerInfo.from_json(value) if value is not None else None
            if info is None:
                gone.append(name)
            else:
                live.append(info)
        if gone:
            try:
                self.redis.srem(index, *gone)
            except CommandRefused:
                pass  # Redis refuses writes for now (MISCONF, a replica): the next read tidies up
        return live

    def live_builds(self, queue: str) -> set[str]:
        """The builds live workers of ``queue`` decide (``""`` for unversioned workers)."""
        out: set[str] = set()
        for w in self.live_workers():
            if queue in w.queues:
                out |= w.builds
        return out

    def unserved_reason(self, record: Mapping[str, Any]) -> str | None:
        """:func:`no_live_worker_reason` of a run record, against the live workers now (a pinned
        run only: ``result()`` gives up on it; a run whose queue has no worker yet waits for one)."""
        if not record.get("build") or record.get("status", "pending") not in OPEN_STATUSES:
            return None  # no registry read for the common case
        return no_live_worker_reason(record, self.live_workers())

    def why_blocked(
        self, record: Mapping[str, Any], live: Sequence[WorkerInfo] | None = None
    ) -> BlockedReason | None:
        """Why an open run cannot move: the reason its record holds (nondeterminism, unknown
        type, ...), else that Redis refuses writes at ``maxmemory`` or because it cannot persist
        (kinds :data:`~durable.store.memory.REDIS_OOM`,
        :data:`~durable.store.memory.REDIS_CANNOT_PERSIST`: no run moves then, and the workers
        look gone),
        else that no live worker serves its pinned build or, unpinned, its queue, else that an
        activity it waits on is queued where every live worker's threads are held by hung
        activities (:data:`~durable.store.held.STARVED_QUEUE`); ``None``: it can move.
        ``live``: the live workers, if the caller has read them already."""
        reason = blocked_reason(record)
        if reason is not None or record.get("status", "pending") not in OPEN_STATUSES:
            return reason  # no registry read for a closed run
        live = self.live_workers() if live is None else live
        unserved = no_worker_reason(record, live)
        # At maxmemory, or unable to persist, Redis refuses writes: nothing moves, and the workers'
        # heartbeats are refused too: they look gone, but Redis is why. Reads work meanwhile.
        memory = self.memory_state()
        if memory.reason:
            also = f" (workers' heartbeats cannot be written either, so the registry says: {unserved})"
            return BlockedReason(
                kind=memory.kind or REDIS_OOM, message=memory.reason + (also if unserved else "")
            )
        full = history_full_reason(record)
        if full:
            return BlockedReason(kind=HISTORY_FULL, message=full)
        if unserved:
            # Registry entries live REGISTRY_TTL_MS: a Redis restarted after a longer outage lost
            # them, and live workers write them again at their next pass, seconds after it is up.
            started = self.server_started()
            if (
                started is not None
                and started[1] * 1000 < 2 * REGISTRY_TTL_MS
                and int(record.get("created") or 0) < started[0] - 1000  # older than the start, surely
            ):
                unserved += (
                    f" (Redis restarted {started[1]} s ago: a live worker writes its registry entry "
                    "again within seconds of it; if this persists, no worker is running)"
                )
            queues = run_queues(record)
            failing = [f.words() for f in self.start_failures() if queues & set(f.queues)]
            if failing:  # started, and failing at start: "start one" would fail the same way
                unserved += "; " + "; ".join(failing)
            return BlockedReason(kind=NO_LIVE_WORKER, message=unserved)
        starved = starved_reason(record, starved_queues(live))
        if starved:
            return BlockedReason(kind=STARVED_QUEUE, message=starved)
        return self._child_blocked(record, live)

    def _child_blocked(self, record: Mapping[str, Any], live: Sequence[WorkerInfo]) -> BlockedReason | None:
        """A child this run waits on that is blocked itself -- for a recorded reason or because no
        live worker can move it, as its own ``why_blocked`` says -- as this run's reason, naming
        the child. Bounded: see :mod:`durable.store.child_blocks` (its ``CHILDREN_CHECKED``
        children per run, :data:`~durable.store.child_blocks.CHILD_DEPTH` levels)."""
        return blocked_children(self, [record], lambda r: no_worker_reason(r, live))[0]

    def claim_current_build(self, queue: str, expected: str, build: str) -> bool:
        """Make ``build`` the current build of ``queue`` if it still is ``expected`` (``""``:
        none). Returns whether it was set (another writer may have changed it first)."""
        return bool(self._run_script("claim_build", [self.keys.current_build(queue)], [expected, build]))
