"""Decisions committed as they are made: one ``commit`` script per run, one round trip written
in parts.

A worker decides a batch of runs (each replayed to its next command), then commits them. With
:meth:`RunStore.commits <durable.store.runs.RunStore.commits>`, every few decisions are written
to Redis as soon as they are made: Redis runs those scripts while the worker decides the next,
and the replies of all are read once at the end.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis

from ..errors import ConfigurationError
from .key_types import is_wrong_type
from .records import CommitResult, RunRef, commit_outcome
from .tasks import CommitPlan

log = logging.getLogger("durable.worker")

if TYPE_CHECKING:
    from .runs import RunStore

PART = 4
"""Decisions per write of :meth:`Commits.add`: a write costs a syscall in the worker and a read in
Redis, so not every decision gets its own; 4 keeps Redis busy from early in a typical batch
(30-40 runs). Measured on 2 cores (``benchmarks/ab_workers.py``; ``benchmarks/README.md``, "Wave 7,
eighth session"): W2 1.13x of one write per batch; parts of 2 against 4, 0.91x (more CPU)."""


class Commits:
    """Decisions to commit in one round trip (each atomic on its own), written ``part`` at a time.

    :meth:`add` each decision as it is made; :meth:`outcomes` writes what is left and reads
    every reply. Call :meth:`outcomes` whatever happens after the first :meth:`add`: what was
    written may have been committed, and its outcome must be read (a Redis error becomes the
    outcome of every decision it kept from Redis; neither method raises one).
    """

    def __init__(self, store: RunStore, sending: Any, part: int | None = PART) -> None:
        self._store = store
        self._sending = sending
        self._part = part
        self._sha = store._scripts["commit"].sha
        self._decisions: list[tuple[RunRef, CommitPlan]] = []
        self._unsent: list[tuple[RunRef, CommitPlan, tuple[list[str], list[bytes]]]] = []
        self._refused: redis.RedisError | None = None  # what stopped the writing: none sent after

    def add(self, ref: RunRef, plan: CommitPlan) -> None:
        """Commit ``plan`` (its arguments are packed now: a plan that cannot be raises here,
        and is not part of the round trip)."""
        self._unsent.append((ref, plan, self._store.commit_args(ref, plan)))
        self._decisions.append((ref, plan))
        if self._part is not None and len(self._unsent) >= self._part:
            self._write()

    def outcomes(self) -> list[CommitResult | Exception]:
        """Per decision, in the order added: its :class:`CommitResult` or the exception it met
        (:class:`~durable.errors.EventConflict`, :class:`~durable.errors.WorkflowClosed`, a
        Redis error)."""
        self._write()
        replies = self._sending.replies()  # of the parts written, in order
        replies += [self._refused] * (len(self._decisions) - len(replies))
        outcomes = [
            commit_outcome(ref.run_id, plan.expected_seq, reply)
            for (ref, plan), reply in zip(self._decisions, replies, strict=True)
        ]
        # A key the script writes holds another kind of value: the run's, said by name (it failed
        # half-way, retried for ever as "not decided yet").
        return [
            self._store.wrong_kind_error(ref.partition, ref.run_id, out) if is_wrong_type(out) else out
            for (ref, _), out in zip(self._decisions, outcomes, strict=True)
        ]

    def _write(self) -> None:
        if not self._unsent or self._refused is not None:
            return
        unsent, self._unsent = self._unsent, []
        decisions: Sequence[tuple[RunRef, CommitPlan]] = [(ref, plan) for ref, plan, _ in unsent]
        try:  # the queues and attribute types are noted before the commits that use them
            self._store._note_streams(decisions)
            upserted = [name for _, plan in decisions for name in plan.search_attributes or ()]
            if upserted:
                self._store.publish_search_types(upserted, strict=False)
        except ConfigurationError as exc:  # said once per name; the values are indexed all the same
            log.error("%s", exc)
        except redis.RedisError as exc:  # e.g. refused at maxmemory: this part and the rest unsent
            self._refused = exc
            return
        self._sending.send([("EVALSHA", self._sha, len(keys), *keys, *args) for _, _, (keys, args) in unsent])
