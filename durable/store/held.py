"""Workers whose activity threads are all held by abandoned attempts, as their registry entries say.

Python cannot stop a thread: an activity that hangs past its timeout (or after its run closed)
keeps its worker's thread (``workers/hung.py``). A worker whose threads are all held so runs no
activity, while it still sends heartbeats. :func:`threads_note` says it of one worker (``durable
workers``), :func:`starved_queues` of the queues whose live workers are all such workers
(``describe``/``status`` of a run whose activity waits there).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .records import OPEN_STATUSES

if TYPE_CHECKING:  # workers.py asks this module why a run waits (why_blocked)
    from .workers import WorkerInfo

__all__ = ["STARVED_QUEUE", "busy_queues", "starved", "starved_queues", "starved_reason", "threads_note"]

STARVED_QUEUE = "starved_queue"
"""The blocked kind of an open run whose activity waits on a queue whose live workers all have
every thread held (:func:`starved_reason`; found on read, not recorded: it moves on by itself
once they are restarted)."""


def starved(worker: WorkerInfo) -> bool:
    """Whether every activity thread of ``worker`` is held by an abandoned attempt."""
    return worker.threads > 0 and worker.held >= worker.threads


def threads_note(worker: WorkerInfo) -> str:
    """``worker``'s threads in words: ``2/2 threads held by attempts past their timeout or of
    closed runs`` when some are held so, else ``3/4 threads busy`` (``""``: the entry does not say)."""
    if not worker.threads:
        return ""
    if not worker.held:
        return f"{worker.busy}/{worker.threads} threads busy"
    return f"{worker.held}/{worker.threads} threads held by attempts past their timeout or of closed runs"


def _names(worker: WorkerInfo) -> str:
    """``hang x2, fetch`` for a worker's held threads (each ``stuck`` entry starts with the name)."""
    counts = Counter(entry.split(" (", 1)[0] for entry in worker.stuck)
    listed = sum(counts.values())
    names = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in sorted(counts.items()))
    more = worker.held - listed
    return names + (f" and {more} more" if more > 0 else "")


def starved_queues(live: Iterable[WorkerInfo]) -> dict[str, str]:
    """Per queue whose live workers all have every activity thread held by abandoned attempts
    (:func:`starved`), why its activity tasks wait: ``its workers' threads are all held by hung
    activities (W: hang x2); restart them``. Queues with no live worker are not here."""
    by_queue: dict[str, list[WorkerInfo]] = {}
    for worker in live:
        for queue in worker.queues:
            by_queue.setdefault(queue, []).append(worker)
    out = {}
    for queue, workers in by_queue.items():
        if workers and all(starved(w) for w in workers):
            who = "; ".join(f"{w.name}: {_names(w)}" for w in sorted(workers, key=lambda w: w.name))
            out[queue] = (
                f"its workers' threads are all held by hung activities ({who}), which Python cannot "
                "stop; restart them (see `durable workers`)"
            )
    return out


def busy_queues(live: Iterable[WorkerInfo]) -> dict[str, str]:
    """Per queue whose live workers taking tasks have every activity thread running an attempt
    (some not abandoned: else :func:`starved_queues` says it), why a task queued there waits:
    ``all 2 activity threads of its workers are busy (W: fetch of workflow o-1 for 25 s (no
    timeout)); it starts when one frees up``. Not a block: it moves by itself."""
    by_queue: dict[str, list[WorkerInfo]] = {}
    for worker in live:
        if worker.state == "serving":
            for queue in worker.queues:
                by_queue.setdefault(queue, []).append(worker)
    out = {}
    for queue, workers in by_queue.items():
        if workers and all(0 < w.threads <= w.busy for w in workers) and not all(starved(w) for w in workers):
            threads = sum(w.threads for w in workers)
            who = "; ".join(
                f"{w.name}: {', '.join(w.running) or 'attempts'}"
                for w in sorted(workers, key=lambda w: w.name)
            )
            out[queue] = (
                f"all {threads} activity thread(s) of its workers are busy ({who}); it starts when one "
                "frees up (more workers or --concurrency, or a timeout on long activities, shorten the wait)"
            )
    return out


def starved_reason(record: Mapping[str, Any], starved_at: Mapping[str, str]) -> str | None:
    """Why an open run does not move (``why_blocked``, the runs lists): an activity it waits on is
    queued where every live worker's threads are held by hung activities (``starved_at``:
    :func:`starved_queues`), so nothing runs it until they are restarted; ``None`` otherwise (or
    when the run is closed or blocked already). Read from the run record's snapshot of its
    pending steps."""
    if not starved_at or record.get("blocked") or record.get("status", "pending") not in OPEN_STATUSES:
        return None
    for step in (record.get("snapshot") or {}).get("pending") or ():
        queue = step.get("queue")
        if step.get("kind") == "activity" and queue in starved_at:
            return f"activity {step.get('name', '')!r} (id {step.get('id')}) waits on queue {queue!r}: {starved_at[queue]}"
    return None
