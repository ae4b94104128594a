"""The task queue gauges of ``/metrics``: backlogs, oldest task ages, dead letters and the live
workers (by state, and what a draining one has left), read from Redis on each scrape
(:class:`QueueCollector`).

A worker's port and the operator server's both register one (see
:func:`workers.metrics.registry_for`). The queues read are those the scrape's owner serves, and
every queue tasks were sent to that no live worker serves: an alert on a queue's backlog must
also fire for a queue whose workers all stopped (or never started), as ``durable workers`` lists it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import redis

try:  # the `metrics` extra; workers.metrics registers this collector only when it is installed
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError:  # pragma: no cover - exercised where the extra is absent
    Collector = object  # type: ignore[assignment,misc]

from durable.store.keys import GROUP, PRIVATE
from durable.store.records import text

log = logging.getLogger("durable.metrics")

QUEUE_SCAN_LIMIT = 2000
"""At most this many task streams are read per scrape (bounded cost on Redis)."""


class QueueCollector(Collector):  # type: ignore[misc,valid-type,unused-ignore]
    """Reads task queue backlogs and dead letters from Redis on each scrape (bounded: a few
    pipelined round trips over at most :data:`QUEUE_SCAN_LIMIT` streams).

    Args:
        store: The :class:`~durable.store.redis_store.RedisStore` to read.
        queues: The queues the scrape's owner serves (a worker's ``--queue``); ``None``: every
            shared queue a live worker serves, and ``default`` (the operator server). Either
            way, the queues tasks were sent to that no live worker serves are read too.
    """

    def __init__(self, store: Any, queues: Sequence[str] | None) -> None:
        self.store = store
        self.queues = list(queues) if queues is not None else None

    def _queue_names(
        self, live: Sequence[Any] | None = None, known: Sequence[str] | None = None
    ) -> list[str]:
        """The given queues (else those live workers serve, and ``default``), then the ``known``
        queues no live worker serves: those come last, so the scan limit drops them first
        (``None``: read from the store)."""
        served: set[str] = set()
        for info in self.store.live_workers() if live is None else live:
            served.update(q for q in info.queues if not q.startswith(PRIVATE))
        own = list(self.queues) if self.queues is not None else sorted(served | {"default"})
        # No worker reads these as its own: each port reports them (the same value on every
        # target), or an alert on the backlog would never see a queue whose workers all stopped.
        unserved = sorted(set(self.store.known_queues() if known is None else known) - served - set(own))
        return own + unserved

    def _streams(self, live: Sequence[Any], known: Sequence[str]) -> list[tuple[str, str, str]]:
        keys = self.store.keys
        out = []
        for queue in self._queue_names(live, known):
            for p in range(keys.partitions):
                out.append(("workflow", queue, keys.workflow_tasks(p, queue)))
                out.append(("activity", queue, keys.activity_tasks(p, queue)))
        return out[:QUEUE_SCAN_LIMIT]

    def collect(self) -> Iterator[Any]:
        """The backlog, oldest age and dead-letter gauges (none when Redis cannot be read)."""
        backlog = GaugeMetricFamily(
            "durable_task_queue_backlog",
            "Tasks waiting to be read, per queue and kind.",
            labels=["queue", "kind"],
        )
        oldest = GaugeMetricFamily(
            "durable_task_queue_oldest_age_seconds",
            "Age of the oldest task waiting to be read, per queue and kind.",
            labels=["queue", "kind"],
        )
        dead = GaugeMetricFamily("durable_dead_letters", "Tasks in the dead-letter streams (parked).")
        workers = GaugeMetricFamily(
            "durable_workers",
            "Live workers per queue, build and state (serving; stopping: finishing its activities; "
            "draining: finishing the runs pinned to its build, starting no new run).",
            labels=["queue", "build", "state"],
        )
        left = GaugeMetricFamily(
            "durable_worker_drain_pinned_runs",
            "Open runs pinned to a draining worker's builds: it stops once none is (one that stays "
            "above 0 for long waits on a run that does not finish).",
            labels=["worker", "build"],
        )
        # Said on every scrape: with Redis down the gauges below are left out, and an alert on a
        # backlog would resolve, silently, during the very incident (up stays 1: the port answers).
        up = GaugeMetricFamily(
            "durable_redis_up", "Whether this scrape read the task queues from Redis (0: it could not)."
        )
        try:
            live, known = self.store.live_workers(), self.store.known_queues()  # one read each per scrape
            holding = self._read(self._streams(live, known), backlog, oldest, dead)
            _count_workers(live, workers, left, holding)
        except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
            # The process's own metrics are still served; only these gauges are left out.
            log.warning("metrics: task queues not read from Redis: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield from (up, backlog, oldest, dead, workers, left)

    def _read(
        self, streams: Sequence[tuple[str, str, str]], backlog: Any, oldest: Any, dead: Any
    ) -> set[str]:
        """Fill the task gauges; returns the queues whose streams hold tasks (read or not)."""
        client = self.store.redis
        with client.pipeline(transaction=False) as pipe:
            for _, _, key in streams:
                pipe.xlen(key)
                pipe.xinfo_groups(key)
            for p in range(self.store.keys.partitions):
                pipe.xlen(self.store.keys.dead(p))
            replies = pipe.execute(raise_on_error=False)
        # Not in the pipeline: a cluster's pipeline refuses TIME (no key: no node to send it to).
        now_ms = self.store.server_time_ms()
        dead.add_metric([], sum(r for r in replies[2 * len(streams) :] if isinstance(r, int)))
        totals: dict[tuple[str, str], int] = {}
        waiting: list[tuple[str, str, str, str]] = []
        holding: set[str] = set()
        for i, (kind, queue, key) in enumerate(streams):
            length, groups = replies[2 * i], replies[2 * i + 1]
            if not isinstance(length, int):
                continue
            if length:
                holding.add(queue)
            group = _group(groups) or {}  # no group yet (no worker ever served it): all waiting
            # Acked tasks are deleted: what is left is either pending (read) or waiting.
            count = max(0, length - int(group.get("pending", 0)))
            totals[(queue, kind)] = totals.get((queue, kind), 0) + count
            if count:
                waiting.append((kind, queue, key, text(group.get("last-delivered-id", "0-0"))))
        ages = self._ages(waiting, now_ms)
        for (queue, kind), count in sorted(totals.items()):
            backlog.add_metric([queue, kind], count)
            oldest.add_metric([queue, kind], ages.get((queue, kind), 0.0))
        return holding

    def _ages(
        self, waiting: Iterable[tuple[str, str, str, str]], now_ms: int
    ) -> dict[tuple[str, str], float]:
        """Age of the first unread entry of each stream, oldest per (queue, kind)."""
        waiting = list(waiting)
        if not waiting:
            return {}
        with self.store.redis.pipeline(transaction=False) as pipe:
            for _, _, key, last in waiting:
                pipe.xrange(key, min=f"({last}", count=1)
            rows = pipe.execute(raise_on_error=False)
        ages: dict[tuple[str, str], float] = {}
        for (kind, queue, _, _), row in zip(waiting, rows, strict=True):
            if isinstance(row, list) and row:
                ms = int(text(row[0][0]).split("-", 1)[0])
                age = max(0.0, (now_ms - ms) / 1000)
                ages[(queue, kind)] = max(ages.get((queue, kind), 0.0), age)
        return ages


def _count_workers(live: Sequence[Any], workers: Any, left: Any, holding: Iterable[str]) -> None:
    counts: dict[tuple[str, str, str], int] = {}
    for w in live:
        for queue in w.queues:
            if not queue.startswith(PRIVATE):
                key = (queue, w.build, w.state)
                counts[key] = counts.get(key, 0) + 1
        if w.state == "draining":
            left.add_metric([w.name, w.build], w.pinned_left)
    # A queue whose tasks no worker serves now reads 0 serving, not no series at all: `sum by
    # (queue) (durable_workers{state="serving"}) == 0` fires while they wait. Only while some wait
    # (as `durable workers` lists it): a queue used once, or retired, paged for ever.
    serving = {queue for queue, _, state in counts if state == "serving"}
    for queue in holding:
        if queue not in serving and not queue.startswith(PRIVATE):
            counts[(queue, "", "serving")] = 0
    for labels, count in sorted(counts.items()):
        workers.add_metric(list(labels), count)


def _group(groups: Any) -> dict[str, Any] | None:
    if not isinstance(groups, list):
        return None
    for group in groups:
        if text(group.get("name", "")) == GROUP:
            return group
    return None


__all__ = ["QUEUE_SCAN_LIMIT", "QueueCollector"]
