"""A worker's place in the fleet: its registry entry, and whether it starts new runs.

The worker writes its registry entry (:class:`~durable.store.workers.WorkerInfo`:
build, queues, the types it can run, last heartbeat) when it starts, on every
heartbeat of its scheduler thread and, after a Redis outage, as soon as Redis answers
(the entry may have lapsed meanwhile, or been lost in a restart), and deletes it when
it stops.

Which workers start a queue's new runs (its unpinned workflow tasks):

* unversioned workers (no build id, the default): always;
* versioned workers: while their build is the queue's *current* build.

The current build changes only when an operator says so (``durable worker
--promote``, ``durable promote``) or when it has no live worker left: then a
live versioned worker of the queue takes over at its next heartbeat, and logs
it with both build ids. Starting a worker never takes new runs away from live
workers of the current build; stopping and draining workers do not count as live there.

A worker asked to **drain** (:meth:`Membership.drain`: ``kill -USR1``, ``durable drain``, or
a supervisor's reload that deployed a new build) starts no new run and takes over no queue: it decides the
runs pinned to its builds, says in its entry how many are still open, and stops once none is.
That is how the last process of an old build outlives a deploy without stranding its runs.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta

import redis

from durable.history_format import HISTORY_FORMAT
from durable.registry import declared_patches
from durable.release import release
from durable.retention import duration_text
from durable.store.records import REGISTRY_TTL_MS
from durable.store.redis_store import RedisStore
from durable.store.retention import set_namespace_retention, stored_retention_ms
from durable.store.workers import WorkerInfo

from .async_activities import loop_stall
from .broken_streams import said_wrong_kind
from .logging import name_process

__all__ = ["CURRENT_POLL_S", "Membership"]

log = logging.getLogger("durable.worker")

CURRENT_POLL_S = 1.0
"""How often the main thread re-reads the queues' current builds (an operator's promotion
shows within this)."""


class Membership:
    """This worker's registry entry, and the queues whose new runs it starts.

    Args:
        store: The store.
        name: The worker's consumer name.
        build: Its build id (``""``: unversioned).
        compatible: Builds whose pinned runs it also decides.
        queues: The shared queues it serves.
        workflows: The workflow types it can run.
        activities: The activity types it can run.
        complete: Whether those lists name everything it can run (see ``WorkerInfo.complete``).
        promote: Make ``build`` the queues' current build when starting (``--promote``).
        timeouts: Its ``(claim_idle_ms, sticky_timeout_ms)``, said in the entry: how soon it
            takes over what a gone worker left (``durable status`` says so of a waiting run).
    """

    def __init__(
        self,
        store: RedisStore,
        *,
        name: str,
        build: str,
        compatible: Sequence[str],
        queues: Sequence[str],
        workflows: Sequence[str],
        activities: Sequence[str],
        promote: bool,
        complete: bool = False,
        timeouts: tuple[int, int] = (0, 0),
    ) -> None:
        self.store = store
        self.build = build
        self.promote = promote
        name_process(name)
        self.queues = list(queues)
        self.info = WorkerInfo(
            name=name,
            host=socket.gethostname(),
            pid=os.getpid(),
            build=build,
            compatible=tuple(compatible),
            queues=tuple(queues),
            workflows=tuple(sorted(workflows)),
            activities=tuple(sorted(activities)),
            complete=complete,
            patches=declared_patches(workflows),
            claim_idle_ms=timeouts[0],
            sticky_timeout_ms=timeouts[1],
            release=release(),
            history_format=HISTORY_FORMAT,
        )
        self._started = 0
        self._renewed = 0  # server ms of the last registry write that went through
        self._settled_at = 0  # no queue is taken over from another build before (server ms)
        # Queues whose new runs this worker starts: all of them when unversioned.
        self.new_run_queues: list[str] = [] if build else list(queues)
        self._polled = 0.0
        #: ``(threads, held, stuck, busy, running)`` for the entry, asked on every heartbeat (the
        #: worker sets it to :meth:`workers.hung.HungWatch.check`: its activity threads' use).
        self.threads: Callable[[], tuple[int, int, tuple[str, ...], int, tuple[str, ...]]] | None = None
        #: ``(run id, words)`` of a decision stalled past ``SLOW_DECISION_S``, asked on every
        #: heartbeat (:meth:`workers.watchdog.DecisionWatchdog.slow`).
        self.deciding: Callable[[], tuple[str, str]] | None = None
        self._drain_asked = False
        self._activity_queues: list[str] | None = None  # while draining: see activity_queues()
        #: Set once a drain found no open pinned run left (the worker then stops).
        self.drained = False
        #: Called (on the scheduler thread) once a draining worker has no open pinned run left.
        self.on_drained: Callable[[], None] | None = None
        self._origins: dict[int, str] = {}  # the partitions' origin markers seen last
        self._retention: int | None = None  # the namespace's retention (ms) when first checked

    def join(self) -> None:
        """Register, then (versioned) promote if asked or take over queues nobody serves; warn of
        the settings of Redis that can lose durable's data (nothing else would say it)."""
        self._started = self.store.server_time_ms()
        self._check_origins()  # first: once the views see this worker live, it has seen the markers
        # A registry (or known-queues set) of the wrong kind, made by hand, stopped every worker
        # at its start: this one serves, said by name, and registers once the key is mended.
        self._tolerating_wrong_kind("this worker's registration", self._register)
        # Known, its queues' streams are swept once no live worker serves them (a mistyped or a
        # per-host --queue created 16 empty streams that stayed for good).
        self._tolerating_wrong_kind(
            "the note of this worker's queues", lambda: self.store.note_queues(self.queues)
        )
        if self.build and self.promote:
            before = self.store.current_build(self.queues)
            self.store.promote_build(self.queues, self.build)
            for queue, old in zip(self.queues, before, strict=True):
                if old != self.build:
                    log.warning(
                        "queue %s: new runs now go to build %s (was %s), as --promote asked",
                        queue,
                        self.build,
                        old or "none",
                    )
        self.heartbeat(register=False)
        for hazard in self.store.memory_state(probe=False).hazards:
            log.warning("%s", hazard)

    def stopping(self) -> None:
        """Say in the registry entry that this worker is stopping (it takes no new task, and
        finishes its running activities first): the views count it out at once. The scheduler's
        heartbeats keep saying so until :meth:`leave`."""
        self.info = replace(self.info, stopping=self.store.server_time_ms())
        self._register()

    def drain(self) -> None:
        """Start no new run from now on, and stop (:attr:`on_drained`) once no open run pinned
        to this worker's builds is left on its queues; an unversioned worker pins nothing, so
        it stops at its next heartbeat. Only sets a flag (a signal handler calls it): the
        heartbeat counts the runs and says so in the registry entry."""
        self._drain_asked = True

    def leave(self) -> None:
        """Remove the registry entry at once (a graceful stop): others fail over now."""
        self.store.unregister_worker(self.info.name)

    def heartbeat(self, *, register: bool = True) -> None:
        """Renew the entry; a versioned worker takes over queues whose current build has no
        live worker, a draining one counts what it has left instead (:meth:`drain`) (scheduler
        thread, every :data:`~durable.store.workers.HEARTBEAT_S`)."""
        if register and not self._drain_asked:
            self._register()  # (which also reads whether an operator asked for a drain)
        self._check_origins()
        if self._drain_asked:
            self._drain_step()
            return
        if not self.build or self._renewed < self._settled_at:
            # Right after this worker's own entry lapsed (Redis stalled or was away, or this
            # process was stopped), every entry may have lapsed with it: another build's live
            # workers are not taken for gone until they had a registry lifetime to renew theirs.
            return
        current = self.store.current_build(self.queues)
        stale = [(q, c) for q, c in zip(self.queues, current, strict=True) if c != self.build]
        if not stale:
            return
        everyone = self.store.live_workers()
        # Stopping and draining workers start no new run: they do not keep the queue.
        live = [w for w in everyone if w.state == "serving"]
        for queue, old in stale:
            if old and any(queue in w.queues and w.build == old for w in live):
                continue  # the current build is alive: it keeps the new runs
            if self.store.claim_current_build(queue, old, self.build):
                self._say_taken_over(queue, old, everyone)
        self._polled = 0.0  # re-read the current builds at the next pass

    def _tolerating_wrong_kind(self, doing: str, call: Callable[[], None]) -> None:
        try:
            call()
        except redis.exceptions.ResponseError as exc:
            if not said_wrong_kind(self.store, exc, doing):
                raise

    def _check_origins(self) -> None:
        """Compare the partitions' origin markers with those seen last: one gone means Redis
        lost that partition's data (:mod:`durable.store.origins`), which nothing else says."""
        first = not self._origins
        self._origins, lost = self.store.check_origins(self._origins, self.info.name)
        if first:  # the namespace's settings as this worker found them, to put back after a loss
            self._retention = stored_retention_ms(self.store)
        if lost:
            log.error(
                "Redis lost durable's data of partition(s) %s: the origin marker this worker saw is "
                "gone (Redis restarted without persistence, was flushed, or a replica without the "
                "data took over); runs, timers, schedules and tasks written there before now are gone "
                "for good. Keep Redis's data: appendonly yes (docs/operations.md)",
                ", ".join(map(str, lost)),
            )
            self._restore_retention()

    def _restore_retention(self) -> None:
        """Write the namespace's retention back after a loss took it (from a partition that kept
        it, else as this worker found it): runs closing from now on were kept the default 3 days."""
        retention = stored_retention_ms(self.store) or self._retention
        if retention is None:
            return
        set_namespace_retention(self.store, timedelta(milliseconds=retention))
        self._retention = retention
        log.warning(
            "the namespace's retention (%s) was written again: Redis lost it with the data",
            duration_text(retention),
        )

    def _say_taken_over(self, queue: str, old: str, live: list[WorkerInfo]) -> None:
        if not old:
            log.info("queue %s: new runs go to build %s (no build was current)", queue, self.build)
        elif old in self.info.compatible:
            log.info(
                "queue %s: new runs now go to build %s (this worker), which also decides the runs "
                "pinned to %s (--compatible-build-id)",
                queue,
                self.build,
                old,
            )
        elif any(queue in w.queues and w.build == old and w.state == "draining" for w in live):
            log.info(
                "queue %s: build %s's workers are draining (they finish the runs pinned to it); new "
                "runs now go to build %s (this worker)",
                queue,
                old,
                self.build,
            )
        else:
            log.warning(
                "queue %s: build %s has no live worker left; new runs now go to build %s (this "
                "worker). Runs pinned to %s wait for a worker of that build (`durable list --status "
                "blocked` lists them): start `durable worker --build-id %s` on that build's code until they finish, or "
                "move one with `durable repair ID --build-id %s`",
                queue,
                old,
                self.build,
                old,
                old,
                self.build,
            )

    def activity_queues(self) -> list[str]:
        """The queues whose shared activity tasks this worker reads (main thread): all of them,
        but while draining only those no other worker serves. Activity tasks are not pinned to
        a build: a new build's runs, whose tasks a draining worker of an old build would
        otherwise take too, then run their activities on the new code; and a queue only draining
        workers serve still has its tasks run (those of the drained runs among them)."""
        return self.queues if self._activity_queues is None else self._activity_queues

    def left_alone(self, streams_of: Mapping[str, list[str]]) -> list[str]:
        """Of ``streams_of`` (per queue, its shared activity streams), those of the queues
        :meth:`activity_queues` leaves to the other workers: not reclaimed from either."""
        mine = self.activity_queues()
        return [s for q, streams in streams_of.items() if q not in mine for s in streams]

    def _drain_step(self) -> None:
        """Count the open runs pinned to this worker's builds, say it in the entry, leave the
        shared activity tasks to the other workers, and stop once there are no such runs."""
        others = [w for w in self.store.live_workers() if w.name != self.info.name and w.state == "serving"]
        self._activity_queues = [q for q in self.queues if not any(q in w.queues for w in others)]
        left = self.store.count_pinned_open(self.info.builds, self.queues) if self.build else 0
        first = not self.info.draining
        if first and self.build:
            log.info(
                "draining: starting no new run; %d open run(s) pinned to build %s on queues %s left (this "
                "worker stops once none is; `durable list --where \"build_id = '%s' and status = 'open'\"` "
                "lists them)",
                left,
                self.build
                + (f" (or compatible {', '.join(self.info.compatible)})" if self.info.compatible else ""),
                ", ".join(self.queues),
                self.build,
            )
        # Said before the entry says it: whoever sees the entry finds the line in the log.
        self.info = replace(
            self.info, draining=self.info.draining or self.store.server_time_ms(), pinned_left=left
        )
        self._register()
        if left == 0 and not self.drained:
            self.drained = True
            log.info(
                "drained: no open run is pinned to build %s on its queues; stopping",
                self.build or "(unversioned)",
            )
            if self.on_drained is not None:
                self.on_drained()

    def poll(self) -> list[str]:
        """The queues whose new runs this worker starts, re-read at most every
        :data:`CURRENT_POLL_S` (main thread: it decides which streams to read)."""
        if self._drain_asked:  # (checked first: drain() may come between a read and its use)
            return []
        if not self.build:
            return self.new_run_queues
        now = time.monotonic()
        if now - self._polled >= CURRENT_POLL_S:
            self._polled = now
            current = self.store.current_build(self.queues)
            self.new_run_queues = [q for q, c in zip(self.queues, current, strict=True) if c == self.build]
        return self.new_run_queues

    def _register(self) -> None:
        threads, held, stuck, busy, running = (
            self.threads() if self.threads is not None else (0, 0, (), 0, ())
        )
        now = self.store.server_time_ms()
        deciding_run, deciding = self.deciding() if self.deciding is not None else ("", "")
        entry = replace(
            self.info,
            threads=threads,
            held=held,
            stuck=stuck,
            busy=busy,
            running=running,
            deciding_run=deciding_run,
            deciding=deciding,
            async_stall=loop_stall(),
        )
        asked, lapsed = self.store.renew_registration(replace(entry, started=self._started or now, seen=now))
        if lapsed and self._renewed:
            self._settled_at = now + REGISTRY_TTL_MS
            log.warning(
                "this worker's registry entry had lapsed: %.0f s passed without a heartbeat (the process "
                "was stopped or starved, or cut off from Redis), so other workers may have taken it for "
                "gone and run its unfinished activities again (at least once); results of attempts "
                "superseded meanwhile are refused",
                (now - self._renewed) / 1000,
            )
        self._renewed = now
        if asked and not self._drain_asked:
            log.info("an operator asked this worker to drain (`durable drain`)")
            self.drain()
