"""The queues tasks were sent to: what ``durable workers`` and ``/metrics`` list, with the
backlog of those no live worker serves (their empty streams are swept, their names stay:
:meth:`~durable.store.queues.QueueStore.drop_unserved_streams`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .base import StoreBase
from .keys import activity_queue, is_private
from .records import RunRef, text

if TYPE_CHECKING:
    from .tasks import CommitPlan

__all__ = ["KnownQueues"]


class KnownQueues(StoreBase):
    """Noting the queues tasks go to, and reading them back."""

    _noted: frozenset[str] = frozenset()
    _noted_streams: frozenset[str] = frozenset()

    def note_queues(self, queues: Iterable[str]) -> None:
        """Record that tasks go to ``queues`` (once per name and process: off the hot path), so
        that a queue no worker serves still shows on the workers page, with its backlog."""
        new = {q for q in queues if q not in self._noted and not is_private(q)}
        if new:
            self.redis.sadd(self.keys.queues(), *sorted(new))
            self._noted = self._noted | new

    def _note_streams(self, decisions: Sequence[tuple[RunRef, CommitPlan]]) -> None:
        """:meth:`note_queues` of the activity streams the decisions send tasks to (new ones only:
        this runs on every commit)."""
        new = {t.stream for _, plan in decisions for t in plan.activities} | {
            t.stream for _, plan in decisions for t, _ in plan.claimed
        }
        new -= self._noted_streams
        if new:
            self.note_queues(activity_queue(s) for s in new)
            self._noted_streams |= new

    def known_queues(self) -> list[str]:
        """The queues tasks were sent to (:meth:`note_queues`), sorted."""
        return sorted(text(q) for q in self.redis.smembers(self.keys.queues()))
