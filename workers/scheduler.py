"""The scheduler: due timers, retry backoff, expired attempts, dead workers' tasks.

Every worker runs one, in a thread. Several schedulers may run at once: each
action is a script (or a claim) that is safe to repeat, so the worst case of
two schedulers racing is a no-op.

It sleeps until the earliest due timer it knows of (capped at ``max_sleep``),
and its own worker wakes it early when a decision adds an earlier timer, so a
timer fires at its due time, not at the next poll.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from durable import codec
from durable.errors import ActivityTimeout, SessionLost
from durable.store.keys import GROUP
from durable.store.redis_store import RedisStore
from durable.store.retention import Purger

from . import faults
from .runner import attempt_failed, fail_attempt, timeout_kind

log = logging.getLogger("durable.scheduler")


class Scheduler:
    """Fires timers and retries, expires attempts, reclaims stale tasks.

    Args:
        store: The store.
        streams: Task streams to reclaim from (this worker's queues).
        consumer: This worker's consumer name (reclaimed tasks come to it).
        reclaimed: Called with ``(stream, entry_id, fields)`` for each reclaimed task.
        claim_idle_ms: A task idle this long in another consumer's pending list
            is taken as abandoned (its worker died). Live workers refresh theirs.
        max_sleep: Longest sleep between scans, in seconds.
    """

    def __init__(
        self,
        store: RedisStore,
        *,
        streams: list[str],
        consumer: str,
        reclaimed: Callable[[str, str, dict[bytes, bytes]], None],
        in_flight: Callable[[], list[tuple[str, str]]] = list,
        leases: Callable[[], list[tuple[int, str, str, int]]] = list,
        session_queue: str = "",
        claim_idle_ms: int = 30_000,
        max_sleep: float = 1.0,
    ) -> None:
        self.store = store
        self.streams = streams
        self.consumer = consumer
        self.reclaimed = reclaimed
        self.in_flight = in_flight
        self.leases = leases
        self.session_queue = session_queue
        self.claim_idle_ms = claim_idle_ms
        self.max_sleep = max_sleep
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._next_due = float("inf")
        self._thread: threading.Thread | None = None
        self._last_claim = 0.0
        self.fired = 0
        #: Purges closed runs whose retention ended (bounded batches, every ``purger.interval`` s).
        self.purger = Purger(store)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="durable-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def notify(self, due_ms: int) -> None:
        """A timer due at ``due_ms`` was added: wake up early if it is sooner than planned."""
        if due_ms / 1000 < self._next_due:
            self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            # While a pass runs, any notification must cut the following sleep short.
            self._next_due = float("inf")
            try:
                sleep = self.tick()
            except Exception:  # noqa: BLE001 - keep scheduling; Redis may be restarting
                log.exception("scheduler pass failed; retrying in 1 s")
                sleep = 1.0
            self._next_due = time.time() + sleep
            self._wake.wait(sleep)
            self._wake.clear()

    def tick(self) -> float:
        """One pass over every partition; returns seconds until the next due timer (capped)."""
        now = time.time()
        next_due = now + self.max_sleep
        now_ms = self.store.server_time_ms()
        parts = range(self.store.keys.partitions)
        for fired, due in self.store.fire_timers(parts):
            if fired:
                faults.point("timers.after_fire")
            self.fired += fired
            if due >= 0:
                next_due = min(next_due, due / 1000)
        # One read of every running set when nothing expired (the usual case).
        for p, deadline in zip(parts, self.store.next_deadlines(parts), strict=True):
            if deadline is not None and deadline <= now_ms:
                self._expire_attempts(p, now_ms)
                deadline = self.store.next_deadlines([p])[0]
            if deadline is not None:
                next_due = min(next_due, deadline / 1000)
        if now - self._last_claim >= self.claim_idle_ms / 3000:
            self._last_claim = now
            self._refresh_in_flight()
            self._reclaim()
            self._check_workers()
        self.purger.tick()
        return max(0.0, next_due - time.time())

    def _expire_attempts(self, p: int, now_ms: int) -> None:
        for rid, aid, attempt in self.store.expired_attempts(p, now_ms):
            body_raw, _ = self.store.activity_state(p, rid, aid)
            self.store.redis.zrem(self.store.keys.running(p), f"{rid}|{aid}|{attempt}")
            if body_raw is None:
                continue
            body: dict[str, Any] = codec.unpack(body_raw)
            if int(body["attempt"]) != attempt:
                continue
            kind = timeout_kind(body, self.store.attempt_started(p, rid, aid), now_ms)
            error = ActivityTimeout(
                f"activity {body['name']} ({aid}) attempt {attempt} timed out ({kind})", kind=kind
            )
            log.warning("activity %s of run %s attempt %d timed out (%s)", aid, rid, attempt, kind)
            fail_attempt(
                self.store,
                body,
                error,
                stream=body["stream"],
                entry_id="",
                started=time.time(),
                on_timer=self.notify,
            )

    def _refresh_in_flight(self) -> None:
        # Reset the idle time of tasks this worker is still working on, so other
        # workers' reclaim passes only ever take tasks of dead workers.
        by_stream: dict[str, list[str]] = {}
        for stream, entry_id in self.in_flight():
            by_stream.setdefault(stream, []).append(entry_id)
        for stream, ids in by_stream.items():
            self.store.redis.xclaim(stream, GROUP, self.consumer, 0, ids, justid=True)
        # Likewise push the leases of attempts this worker runs itself (eager, local):
        # only a dead worker's lease runs out.
        leases = self.leases()
        if leases:
            due = self.store.server_time_ms() + self.claim_idle_ms
            with self.store.redis.pipeline(transaction=False) as pipe:
                for p, rid, aid, attempt in leases:
                    pipe.zadd(self.store.keys.running(p), {f"{rid}|{aid}|{attempt}": due}, xx=True)
                pipe.execute()

    def release(self) -> None:
        """Give up this worker's lease at once (graceful stop): its sessions fail fast and the
        workflow tasks waiting in its private stream go back to their runs' queues."""
        if not self.session_queue:
            return
        keys = self.store.keys
        self.store.redis.delete(*[keys.alive(p, self.session_queue) for p in range(keys.partitions)])
        for p in range(keys.partitions):
            self.store.unstick(p, self.session_queue)

    def renew_lease(self) -> None:
        """Take or renew this worker's lease (its sessions' host lease and its sticky runs')."""
        keys = self.store.keys
        if self.session_queue:
            with self.store.redis.pipeline(transaction=False) as pipe:
                for p in range(keys.partitions):
                    pipe.set(keys.alive(p, self.session_queue), self.consumer, px=self.claim_idle_ms)
                    pipe.sadd(keys.sticky_hosts(p), self.session_queue)
                pipe.execute()

    def _check_workers(self) -> None:
        """Renew this worker's lease; clean up after workers whose lease ran out (they died).

        Two reads for every partition at once (who is named, whose lease lives), then
        work only for the dead: live workers cost no script calls.
        """
        self.renew_lease()
        keys = self.store.keys
        parts = range(keys.partitions)
        with self.store.redis.pipeline(transaction=False) as pipe:
            for p in parts:
                pipe.smembers(keys.sessions(p))
                pipe.smembers(keys.sticky_hosts(p))
            named = pipe.execute()
        # (partition, host, has session tasks, has a private workflow stream)
        others: list[tuple[int, str, bool, bool]] = []
        for p in parts:
            sessions, stickies = ({_name(h) for h in named[2 * p + i]} for i in (0, 1))
            for host in sorted((sessions | stickies) - {self.session_queue}):
                others.append((p, host, host in sessions, host in stickies))
        if not others:
            return
        with self.store.redis.pipeline(transaction=False) as pipe:
            for p, host, _, _ in others:
                pipe.exists(keys.alive(p, host))
            alive = pipe.execute()
        for (p, host, session, sticky), live in zip(others, alive, strict=True):
            if live:
                continue
            if session:
                self._fail_lost_sessions(p, host)
            # unstick checks the lease again, atomically: a worker that renewed meanwhile keeps its tasks.
            moved = self.store.unstick(p, host) if sticky else 0
            if moved > 0:
                log.warning(
                    "worker %s stopped: %d workflow task(s) it held (partition %d) went back to their queues",
                    host,
                    moved,
                    p,
                )

    def _fail_lost_sessions(self, p: int, host: str) -> None:
        """Fail the queued session tasks of the dead session host ``host`` in partition ``p``."""
        keys = self.store.keys
        stream = keys.activity_tasks(p, host)
        for entry_id, fields in self.store.redis.xrange(stream):
            self._fail_session_task(stream, entry_id, fields, host)
        if not self.store.redis.xlen(stream):
            self.store.redis.delete(stream)
            self.store.redis.srem(keys.sessions(p), host)

    def _fail_session_task(self, stream: str, entry_id: Any, fields: dict[bytes, bytes], host: str) -> None:
        entry = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        try:
            body = codec.unpack(fields[b"body"])
        except Exception:  # noqa: BLE001 - not ours to interpret: park it with the reason
            self.store.park(
                p=self.store.keys.partition_of_key(stream),
                stream=stream,
                entry_id=entry,
                kind="activity",
                reason="undecodable session task",
                fields={"raw": repr(fields)[:500]},
            )
            return
        error = SessionLost(
            f"worker session host {host} stopped; activity {body.get('name')} ({body.get('aid')}) cannot run "
            "there — open a new worker_session()"
        )
        log.warning("%s", error)
        record = {"error": str(error), "final": "session host lost"}
        self.store.complete_activity(**attempt_failed(body, error, record, stream=stream, entry_id=entry))

    def _reclaim(self) -> None:
        for stream in self.streams:
            start = "0-0"
            while True:
                try:
                    result = self.store.redis.xautoclaim(
                        stream, GROUP, self.consumer, self.claim_idle_ms, start, count=100
                    )
                except Exception as exc:  # noqa: BLE001 - a missing group is created by the worker
                    log.debug("xautoclaim %s: %s", stream, exc)
                    break
                start, entries = result[0], result[1]
                for entry_id, fields in entries:
                    if fields is None:
                        continue
                    log.warning("reclaimed task %s from %s (its worker stopped responding)", entry_id, stream)
                    self.reclaimed(
                        stream, entry_id.decode() if isinstance(entry_id, bytes) else entry_id, fields
                    )
                if start in (b"0-0", "0-0") or not entries:
                    break


def _name(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)
