"""Everything durable stores in Redis, behind one class.

Each state change that must be atomic is one Lua script in ``lua/`` (named
for what it does); :class:`RedisStore` packs arguments for them and reads
plain data back. Reads that need a consistent view use MULTI/EXEC on keys of
one partition. Key names come only from :mod:`durable.store.keys`; the records
the worker hands over (:mod:`durable.store.tasks`) are encoded only here.

The class is assembled from one module per concern:

* :mod:`~durable.store.base` -- client, scripts, batches per server or cluster node;
* :mod:`~durable.store.runs` -- start, load, commit, deliver, terminate, hooks, listing;
* :mod:`~durable.store.queues` -- task streams, dead letters, builds, the test clock;
* :mod:`~durable.store.activities` -- attempt outcomes, heartbeats, deadlines, timers;
* :mod:`~durable.store.leases` -- worker leases, dead workers' tasks, reclaim;
* :mod:`~durable.store.workers` -- the worker registry (who serves what), current-build failover;
* :mod:`~durable.store.schedules` -- schedules: records, claimed and buffered times, indexes;
* :mod:`~durable.store.run_list` -- the operator surface's runs list (filters, cursor paging).
* :mod:`~durable.store.search` -- listing and counting runs by search attributes (``--where``).
"""

from __future__ import annotations

from .activities import ActivityStore
from .base import load_scripts
from .connect import CLUSTER_SCHEME, TRANSIENT_ERRORS, connect, consumer_name, is_cluster_url
from .dead_letters import DeadLetters
from .leases import LeaseStore
from .origins import OriginStore
from .queues import QueueStore
from .records import CLOSED_STATUSES, OPEN_STATUSES, ClaimedTask, CommitResult, RunRef, StaleCompletion
from .run_list import RunQueries
from .schedules import ScheduleStore
from .tasks import child_result_message
from .workers import WorkerRegistry

__all__ = [
    "CLOSED_STATUSES",
    "CLUSTER_SCHEME",
    "OPEN_STATUSES",
    "TRANSIENT_ERRORS",
    "ClaimedTask",
    "CommitResult",
    "RedisStore",
    "RunRef",
    "StaleCompletion",
    "child_result_message",
    "connect",
    "consumer_name",
    "is_cluster_url",
    "load_scripts",
]


class RedisStore(
    QueueStore, ActivityStore, LeaseStore, WorkerRegistry, ScheduleStore, RunQueries, OriginStore, DeadLetters
):
    """durable's state in Redis: histories, inboxes, task streams, timers.

    Args:
        url: Redis URL; default ``DURABLE_REDIS_URL`` or the embedded server.
        prefix: Older name of ``namespace``.
        namespace: The namespace, prefix of every key (default ``DURABLE_NAMESPACE``, else
            ``DURABLE_PREFIX``, else ``durable``); see docs/security.md.
        partitions: Partition count (default ``DURABLE_PARTITIONS`` or 8). It
            is fixed per deployment: a store that already holds a different
            count refuses to open.
        client: Use this client instead of connecting to ``url``.
        flush: Empty the Redis database first (tests).
        client_ride_s: How long the client calls made with this store (``WorkflowStub``'s
            start, signal, query, status ...) ride out Redis being unavailable (a restart, a
            failover) before they raise :class:`~durable.errors.RedisUnavailable` (default
            :data:`~durable.store.outage.CLIENT_RIDE_S`, 10 s; ``0``: at once).
    """
