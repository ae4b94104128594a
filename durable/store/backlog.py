"""How much waits on a queue's task streams, over every partition: what ``durable workers``
and the API's workers page show per queue (its backlog, and how old its oldest task is).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .base import StoreBase
from .key_types import is_wrong_type
from .records import text

__all__ = ["Backlogs"]


class Backlogs(StoreBase):
    """Reading the task streams' lengths per queue."""

    def queue_backlog(self, queues: Iterable[str], builds: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
        """Per queue, what its task streams hold over every partition, and how old the oldest is.

        Acknowledged tasks leave their stream, so a stream's length is its backlog: tasks
        waiting plus tasks a worker is on. ``workflow_tasks`` sums the unpinned workflow
        stream and those pinned to each of ``builds``; ``activity_tasks`` the activity stream;
        ``oldest_ms`` is when the oldest task still there was added (``None``: empty), ``lag_ms`` how
        long ago that is, in Redis time; ``unreadable`` (if any) streams whose key is another kind.
        """
        queues = list(queues)
        pinned = sorted({b for b in builds if b})
        plan: list[tuple[str, str, str]] = []  # (queue, counter, stream)
        for p in range(self.keys.partitions):
            for queue in queues:
                for build in ("", *pinned):
                    plan.append((queue, "workflow_tasks", self.keys.workflow_tasks(p, queue, build)))
                plan.append((queue, "activity_tasks", self.keys.activity_tasks(p, queue)))
        out: dict[str, dict[str, Any]] = {
            q: {"workflow_tasks": 0, "activity_tasks": 0, "oldest_ms": None, "lag_ms": None} for q in queues
        }
        for indexes in self._by_node([stream for _, _, stream in plan]).values():
            with self.pipeline(plan[indexes[0]][2], transaction=False) as pipe:
                for i in indexes:
                    pipe.xlen(plan[i][2])
                    pipe.xrange(plan[i][2], count=1)
                replies = pipe.execute(raise_on_error=False)
            for n, i in enumerate(indexes):
                queue, counter, stream = plan[i]
                length, first = replies[2 * n], replies[2 * n + 1]
                if isinstance(length, Exception):
                    if not is_wrong_type(length):
                        raise length
                    out[queue].setdefault("unreadable", []).append(stream)  # workers set it aside
                    continue
                out[queue][counter] += int(length)
                if first:
                    added = int(text(first[0][0]).split("-")[0])
                    oldest = out[queue]["oldest_ms"]
                    out[queue]["oldest_ms"] = added if oldest is None else min(oldest, added)
        now = self.server_time_ms()
        for row in out.values():
            if row["oldest_ms"] is not None:
                row["lag_ms"] = max(0, now - row["oldest_ms"])
        return out
