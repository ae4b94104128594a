"""Worker leases in Redis: who is alive, what a dead worker left behind, and reclaiming it.

A worker holds a lease per partition (``T:alive:@<worker>``, expiring unless
renewed). Its sessions' activity tasks and its private (sticky) workflow tasks
depend on it: once it expires, the scheduler of any live worker fails the
sessions' tasks and hands the sticky tasks back to their runs' queues. A sticky
task its worker has not read within the sticky timeout goes back at once, lease or
not (:meth:`LeaseStore.sweep_sticky`): a dead worker's lease outlives it. Task
entries a dead worker had claimed are reclaimed from the consumer group's
pending list once idle long enough.

Every worker creates its private streams when it starts, so they go when it does
(:meth:`LeaseStore.unstick`: its own release, or the sweep once its lease lapsed); a private
activity stream that still holds tasks stays until the sweep has failed them.

Likewise its consumer in the groups of the shared streams it read: a stopping worker deletes it
(:meth:`LeaseStore.forget_consumer`), a dead worker's goes in a live worker's sweep
(:meth:`LeaseStore.drop_dead_consumers`); either only where it holds no pending entry.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

from .base import StoreBase
from .key_types import is_wrong_type
from .keys import GROUP, attempt_member
from .records import text

log = logging.getLogger("durable.store")

Entry = tuple[str, dict[bytes, bytes]]
"""A task stream entry: its id and its fields."""

DROP_CONSUMERS_MOST = 1000
"""Consumers one ``drop_consumers.lua`` call deletes at most (a stream's backlog of dead
consumers from before they were deleted clears over a few calls, none of them long)."""


class LeaseStore(StoreBase):
    """Worker leases, dead workers' sessions and sticky tasks, and reclaiming idle tasks."""

    _sticky_said: frozenset[str] = frozenset()  # sticky-host sets of the wrong kind said already

    def renew_worker(self, host: str, consumer: str, ttl_ms: int) -> None:
        """Take or renew the lease of the worker whose private queue is ``host`` (every partition)."""
        with self.redis.pipeline(transaction=False) as pipe:
            for p in range(self.keys.partitions):
                pipe.set(self.keys.alive(p, host), consumer, px=ttl_ms)
                pipe.sadd(self.keys.sticky_hosts(p), host)
            replies = pipe.execute(raise_on_error=False)
        for p, reply in zip(range(self.keys.partitions), replies[1::2], strict=True):
            if not isinstance(reply, Exception):
                continue
            if not is_wrong_type(reply):
                raise reply
            # A partition's set of the wrong kind stopped every worker from starting (a crash loop
            # under --processes): the lease is taken all the same, the key said once.
            key = self.keys.sticky_hosts(p)
            if key not in self._sticky_said:
                self._sticky_said = self._sticky_said | {key}
                log.error(
                    "%s is not a set (made by hand, or by another program sharing the database): this "
                    "worker's private tasks of partition %d are not handed back if it dies; delete or "
                    "rename the key (durable makes it again)",
                    key,
                    p,
                )
        for reply in replies[0::2]:
            if isinstance(reply, Exception):
                raise reply

    def release_worker(self, host: str) -> None:
        """Give up ``host``'s lease at once (graceful stop), hand its sticky tasks back and
        delete its private streams (an activity stream only if empty: see :meth:`unstick`)."""
        k = self.keys
        self.redis.delete(*[k.alive(p, host) for p in range(k.partitions)])
        for p in range(k.partitions):
            self.unstick(p, host)

    def unstick(self, p: int, host: str) -> int:
        """Hand the workflow tasks in the private stream of the stopped worker ``host`` back to
        their runs' queues and delete that stream; delete its private activity stream too if it
        holds no task, else keep ``host`` in the session hosts, whose tasks the scheduler fails
        (only that host could run them). Returns how many workflow tasks moved, or -1 (and does
        nothing) while its lease lives."""
        k = self.keys
        keys = [
            k.workflow_tasks(p, host),
            k.alive(p, host),
            k.sticky_hosts(p),
            k.activity_tasks(p, host),
            k.sessions(p),
        ]
        return int(self._run_script("unstick", keys, [host]))

    def sweep_sticky(self, timeout_ms: int, limit: int = 100, *, host: str = "") -> tuple[int, int | None]:
        """Hand back to their runs' queues the workflow tasks that waited unread in any worker's
        private stream for ``timeout_ms`` (its worker died with its lease still running, or is
        stuck): one script per partition (``lua/sweep_sticky.lua``), one round trip. With
        ``host``, only that worker's stream (a stopping worker's own, with ``timeout_ms`` 0).

        Returns ``(tasks moved, ms until the oldest unread task left times out, or None)``.
        """
        calls = [
            ([self.keys.sticky_hosts(p)], [timeout_ms, limit, host]) for p in range(self.keys.partitions)
        ]
        moved, waits = 0, []
        for reply in self._script_many("sweep_sticky", calls, raise_on_error=True):
            moved += int(reply[0])
            if int(reply[1]) >= 0:
                waits.append(int(reply[1]))
        return moved, (min(waits) if waits else None)

    def dead_workers(self, me: str) -> list[tuple[int, str, bool, bool]]:
        """Workers other than ``me`` whose lease ran out while they still have sessions or
        sticky runs: ``(partition, host, has session tasks, has a private workflow stream)``.

        Two reads for every partition at once (who is named, whose lease lives): live
        workers cost no script calls.
        """
        k, parts = self.keys, range(self.keys.partitions)
        with self.redis.pipeline(transaction=False) as pipe:
            for p in parts:
                pipe.smembers(k.sessions(p))
                pipe.smembers(k.sticky_hosts(p))
            named = pipe.execute()
        others: list[tuple[int, str, bool, bool]] = []
        for p in parts:
            sessions, stickies = ({text(h) for h in named[2 * p + i]} for i in (0, 1))
            for host in sorted((sessions | stickies) - {me}):
                others.append((p, host, host in sessions, host in stickies))
        if not others:
            return []
        with self.redis.pipeline(transaction=False) as pipe:
            for p, host, _, _ in others:
                pipe.exists(k.alive(p, host))
            alive = pipe.execute()
        return [other for other, live in zip(others, alive, strict=True) if not live]

    def session_tasks(self, p: int, host: str) -> tuple[str, list[Entry]]:
        """The activity tasks queued for the session host ``host``: ``(its stream, entries)``."""
        stream = self.keys.activity_tasks(p, host)
        return stream, [(text(entry_id), fields) for entry_id, fields in self.redis.xrange(stream)]

    def forget_consumer(self, streams: Iterable[str], consumer: str) -> tuple[int, int]:
        """Delete a stopping worker's ``consumer`` from the group of each of ``streams`` where it
        holds no pending entry (one script per stream, ``lua/drop_consumers.lua``, one round trip).
        Where it still holds some (a hand-back failed), it stays until a live worker's
        :meth:`drop_dead_consumers` finds it empty after a reclaim.

        Returns ``(consumers deleted, consumers kept for their pending entries)``.
        """
        return self._drop_consumers(streams, "only", 0, [consumer])

    def drop_dead_consumers(
        self, streams: Iterable[str], live: Iterable[str], idle_ms: int
    ) -> tuple[int, int]:
        """Delete from the group of each of ``streams`` the consumers of workers gone without a
        clean stop (killed, crashed): every consumer not named in ``live`` that holds no pending
        entry and has not read for ``idle_ms``. One holding entries is kept for the reclaim
        (``XAUTOCLAIM``), and deleted by a later call once it holds none.

        Returns ``(consumers deleted, consumers kept for their pending entries)``.
        """
        return self._drop_consumers(streams, "except", idle_ms, sorted(set(live)))

    def _drop_consumers(
        self, streams: Iterable[str], mode: str, idle_ms: int, names: list[str]
    ) -> tuple[int, int]:
        calls = [([stream], [mode, idle_ms, DROP_CONSUMERS_MOST, *names]) for stream in streams]
        if not calls:
            return 0, 0
        replies = self._script_many("drop_consumers", calls, raise_on_error=True)
        return sum(int(r[0]) for r in replies), sum(int(r[1]) for r in replies)

    def touch_claims(self, consumer: str, entries: Iterable[tuple[str, str]]) -> None:
        """Reset the idle time of ``(stream, entry id)`` tasks ``consumer`` is still working on,
        so other workers' reclaim passes only ever take tasks of dead workers."""
        by_stream: dict[str, list[str]] = {}
        for stream, entry_id in entries:
            by_stream.setdefault(stream, []).append(entry_id)
        for stream, ids in by_stream.items():
            self.redis.xclaim(stream, GROUP, consumer, 0, ids, justid=True)

    def extend_leases(self, attempts: Iterable[tuple[int, str, str, int]], due_ms: int) -> None:
        """Push the lease of running attempts ``(partition, run, activity, attempt)`` to ``due_ms``
        (attempts a worker runs itself: only a dead worker's lease runs out)."""
        with self.redis.pipeline(transaction=False) as pipe:
            for p, rid, aid, attempt in attempts:
                pipe.zadd(self.keys.running(p), {attempt_member(rid, aid, attempt): due_ms}, xx=True)
            pipe.execute()

    def reclaim(self, stream: str, consumer: str, idle_ms: int) -> Iterator[Entry]:
        """Claim for ``consumer`` the tasks of ``stream`` idle longer than ``idle_ms`` in any
        consumer's pending list, its own included (their worker died, or read them but could not
        finish them); a stream without a group yields nothing."""
        start: Any = "0-0"
        while True:
            try:
                start, entries = self.redis.xautoclaim(stream, GROUP, consumer, idle_ms, start, count=100)[:2]
            except Exception as exc:  # noqa: BLE001 - a missing group is created by the worker
                log.debug("xautoclaim %s: %s", stream, exc)
                return
            for entry_id, fields in entries:
                if fields is not None:  # deleted meanwhile
                    yield text(entry_id), fields
            if start in (b"0-0", "0-0") or not entries:
                return
