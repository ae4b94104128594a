"""Whether Redis still holds what durable wrote: one origin marker per partition.

A Redis restarted without persistence, flushed, or replaced by a replica that never had the
writes comes back empty, and nothing says so: runs, timers, schedules and queued tasks are
just not there any more (``no workflow with id ...``), and a parent whose child lived on a
lost partition waits for it for ever. Redis cannot tell; only someone who saw the data
before can. So each partition holds a marker (``T:origin``: a random id, made once by the
first worker), and each worker remembers the ids it saw. A marker gone (or made anew) means
the partition's data from before is lost: the first worker to notice writes when, and who it
is, into the new marker (``origin.lua``); every worker that notices logs it. The operator's
views read it back (:meth:`OriginStore.data_losses`): ``durable workers`` and ``/healthz``
warn for :data:`LOSS_SHOWN_MS`; a workflow id that is not found, or a child that never
appears, names the loss of its partition whenever it was.

A loss is seen only by a worker that was running before it and after it: with no worker
running across it (or when a replica that had an older copy of the marker takes over), it
goes unnoticed; ``durable workers`` warns of a Redis without an append-only file beforehand.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import redis

from ..retention import DEFAULT_RETENTION, duration_text
from ..runinfo import DATA_LOST, utc_text
from .base import StoreBase
from .key_types import is_wrong_type
from .records import text

__all__ = [
    "DATA_LOST",
    "LOSS_SHOWN_MS",
    "DataLoss",
    "OriginStore",
    "absence_note",
    "data_losses",
    "loss_note",
]

LOSS_SHOWN_MS = 24 * 3600 * 1000
"""How long ``durable workers`` and ``/healthz`` warn of a loss after it was found."""


@dataclass(frozen=True)
class DataLoss:
    """A partition whose earlier data Redis lost, as its origin marker says."""

    partition: int
    found_ms: int
    """When a worker found the partition's earlier marker gone (Redis's clock, ms)."""
    found_by: str
    """The worker that found it."""

    def message(self) -> str:
        """The loss in the operator's words."""
        return (
            f"Redis lost durable's data of partition {self.partition}: worker {self.found_by} found it "
            f"gone at {utc_text(self.found_ms)} UTC (Redis restarted without persistence, was flushed, "
            "or a replica without the data took over); runs, timers, schedules and tasks of that "
            "partition written before then are gone for good"
        )


class OriginStore(StoreBase):
    """The partitions' origin markers (see the module's docstring)."""

    def check_origins(self, seen: Mapping[int, str], by: str) -> tuple[dict[int, str], list[int]]:
        """Make every partition's marker that is missing (one round trip), and compare.

        Args:
            seen: The marker ids the caller saw last, by partition (empty: none yet).
            by: The caller's name, written into a marker it finds replaced.

        Returns:
            The markers' ids now, and the partitions whose marker is not the one in ``seen``
            (their data from before is lost).
        """
        k = self.keys
        parts = range(k.partitions)
        calls = [([k.origin(p)], [secrets.token_hex(8), seen.get(p, ""), by]) for p in parts]
        replies = self._script_many("origin", calls, raise_on_error=False)
        ids: dict[int, str] = {}
        for p, reply in zip(parts, replies, strict=True):
            # A marker of the wrong kind says no loss, and is forgotten: the one made anew once it
            # is deleted is no loss either. It stopped every worker at its start.
            if not isinstance(reply, Exception):
                ids[p] = text(reply[0])
            elif not is_wrong_type(reply):
                raise reply
        return ids, [p for p in parts if seen.get(p) and p in ids and seen[p] != ids[p]]

    def data_losses(self, partitions: Iterable[int] | None = None, *, since_ms: int = 0) -> list[DataLoss]:
        """See :func:`data_losses`."""
        return data_losses(self, partitions, since_ms=since_ms)

    def recent_data_losses(self) -> list[DataLoss]:
        """:meth:`data_losses` found within :data:`LOSS_SHOWN_MS` (what the views warn of)."""
        return data_losses(self, since_ms=self.server_time_ms() - LOSS_SHOWN_MS)


def data_losses(
    store: StoreBase, partitions: Iterable[int] | None = None, *, since_ms: int = 0
) -> list[DataLoss]:
    """The partitions (default: all) whose marker says their earlier data was lost, found at
    ``since_ms`` or later. One round trip."""
    k = store.keys
    parts = list(range(k.partitions) if partitions is None else partitions)
    with store.redis.pipeline(transaction=False) as pipe:
        for p in parts:
            pipe.hmget(k.origin(p), "lost", "lost_by")
        rows = pipe.execute(raise_on_error=False)
    for row in rows:
        if isinstance(row, Exception) and not is_wrong_type(row):
            raise row
    # A marker of the wrong kind says no loss (it failed every view that warns of losses).
    losses = [_loss(p, *row) for p, row in zip(parts, rows, strict=True) if not isinstance(row, Exception)]
    return [loss for loss in losses if loss is not None and loss.found_ms >= since_ms]


def _loss(partition: int, lost: bytes | None, by: bytes | None) -> DataLoss | None:
    """The loss a marker's ``lost`` and ``lost_by`` fields say (``None``: it had none)."""
    return DataLoss(partition, int(lost), text(by or b"?")) if lost else None


def loss_note(loss: DataLoss | None) -> str:
    """For something of ``loss``'s partition that is not there: ``" (...)"`` naming the loss;
    ``""`` for ``None``."""
    if loss is None:
        return ""
    return (
        f" (Redis lost the data of its partition {loss.partition}, found at {utc_text(loss.found_ms)} "
        "UTC: if it was started before then, it is gone)"
    )


def absence_note(store: StoreBase, partition: int) -> str:
    """For a workflow id of ``partition`` that is not found: ``" (...)"`` saying why it may be
    missing -- the partition's data loss if it had one, else that closed runs are purged after
    the namespace's retention (one round trip)."""
    k = store.keys
    try:
        with store.redis.pipeline(transaction=False) as pipe:
            pipe.hmget(k.origin(partition), "lost", "lost_by")
            pipe.get(k.retention(partition))
            (lost, by), kept = pipe.execute()
    except redis.RedisError:  # the not-found error itself is what the caller needs
        return ""
    if lost:
        return loss_note(_loss(partition, lost, by))
    kept_ms = int(kept) if kept else int(DEFAULT_RETENTION.total_seconds() * 1000)
    return (
        f" (never started, or closed and purged since: closed runs are kept {duration_text(kept_ms)}, "
        "the namespace's retention, unless their workflow class sets its own)"
    )
