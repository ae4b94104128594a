"""Waiting for runs to close, multiplexed: one thread and one Redis connection per process
and store, however many callers wait in :meth:`WorkflowStub.result`.

A caller first looks itself (the run may be closed or blocked already; the same round trip
checks that the run the caller knew is still its workflow's current one). Otherwise it
registers the run's history stream with the store's :class:`RunWaiter` and sleeps on
its own event. The waiter thread blocks in one ``XREAD`` over every watched stream;
the newest entry the read returns of a grown stream tells, from its type alone (no decode
unless it may close the run), whether to wake that run's callers: no second look. Reads
are paced (:data:`READ_PACE_S` per watched run, at most :data:`READ_PACE_MAX_S`), so under
load one read serves many grown streams. So a process waiting on N runs holds one
connection, and the work done is per read, not per event times waiter.
Every :data:`BLOCK_CHECK_S` it also reads the watched runs' ``blocked`` fields (a
block is written to the run record, not to the history) and wakes their callers.

A run pinned to a build that no live worker serves is blocked too, but only once that has
held for :data:`NO_LIVE_WORKER_GRACE_S`: restarting a build's only worker leaves it without
one for a moment, and that is no reason to give up on its runs.

A Redis Cluster cannot ``XREAD`` keys of different slots at once: there each caller
blocks on its own stream (:func:`wait_alone`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import redis

from .. import events as ev
from ..codec.plain import unpack
from ..codec.sealed import open_text
from ..errors import WorkflowBlocked, WorkflowNotFound
from ..runinfo import NO_LIVE_WORKER, BlockedReason, blocked_reason, blocked_text
from .child_blocks import children_gone
from .connect import unavailable_kind
from .outage import Incident, unavailable_error
from .redis_store import RedisStore, RunRef
from .wire import stream_rows
from .workers import REGISTRY_TTL_MS, WorkerInfo, no_live_worker_reason

log = logging.getLogger("durable.client")

BLOCK_MS = 1000
"""How long one ``XREAD`` of the waiter thread blocks (new runs to watch interrupt it)."""

IDLE_S = 10.0
"""How long the waiter thread stays (with its connection) after the last wait ended."""

READ_COUNT = 64
"""Entries one read returns per stream at most (the newest of them tells whether the run closed)."""

READ_PACE_S = 50e-6
"""Time between the starts of two of a waiter's reads, per watched run: a read costs client
and server time per watched stream, and under load many streams grow meanwhile, so one
read then serves many of them."""

READ_PACE_MAX_S = 0.010
"""The most a waiter lets pass between two reads' starts (what pacing may add to a wait)."""

BLOCK_CHECK_S = 1.0
"""How often the waiter thread reads the watched runs' blocked reasons."""

CHILD_CHECK_S = 5.0
"""How often the waiter reads whether a run watched that long waits on a child that no longer
exists (its data lost: it can never finish), a reason found on read, not in the record."""

OUTAGE_RIDE_S = 60.0
"""How long the waits ride out Redis being unreachable (a restart, a failover) before their
callers get the error: each caller's own timeout still ends its wait first."""

NO_LIVE_WORKER_GRACE_S = REGISTRY_TTL_MS / 1000
"""How long a pinned run must have had no live worker of its build before ``result()`` raises
(the registry's time to live: a dead worker's entry lasts that long anyway)."""

_RECORD_FIELDS = ("status", "blocked", "blocked_kind", "build", "queue", "workflow_id")


def blocked_error(workflow_id: str, run_id: str, reason: BlockedReason) -> WorkflowBlocked:
    """The error ``result()`` raises for a blocked run."""
    return WorkflowBlocked(
        f"{blocked_text(workflow_id, run_id, reason.kind, reason.message)} "
        f"(`durable describe {workflow_id}` shows more)",
        workflow_id=workflow_id,
        run_id=run_id,
        kind=reason.kind,
        reason=reason.message,
    )


def _record(values: list[Any]) -> dict[str, Any] | None:
    if values[0] is None:
        return None
    # The blocked reason may quote user data: with a payload hook installed it is stored sealed
    # (binary), and is opened like any stored reason; the other fields are plain text.
    return {
        name: open_text(v) if name == "blocked" else v.decode("utf-8", "replace")
        for name, v in zip(_RECORD_FIELDS, values, strict=True)
        if v is not None
    }


def _last_entry(rows: Any, run_id: str) -> tuple[str, ev.Entry | None]:
    """(stream id of the last entry or ``"0-0"``, that entry if it closes the run)."""
    if not rows:
        return "0-0", None
    entry_id, fields = rows[0]
    if not _may_close(fields):  # not decoded: an event type of a newer release is no close either
        return entry_id.decode(), None
    entry = ev.decode(fields[b"e"], run_id=run_id, seq=int(entry_id.split(b"-")[1]))
    return entry_id.decode(), entry if isinstance(entry.event, ev.CLOSING) else None


def peek_type(raw: bytes) -> str | None:
    """An entry's stored type name, not decoded further (``None``: not an entry durable wrote):
    a reader looking for some types passes over the rest, a newer release's included."""
    try:
        envelope = unpack(raw)
    except Exception:  # noqa: BLE001 - decode() says what is wrong with it
        return None
    type_name = envelope.get("type") if isinstance(envelope, dict) else None
    return type_name if isinstance(type_name, str) else None


_CLOSING_TYPES = frozenset(cls.TYPE for cls in ev.CLOSING)


def _may_close(fields: Any) -> bool:
    """Whether a history entry may close its run, from its type alone (most entries of a
    watched run do not: they are not decoded). Unreadable entries are left to the decoder."""
    type_name = peek_type(fields[b"e"])
    return type_name is None or type_name in _CLOSING_TYPES  # unreadable: the decoder says why


def newest(entry_id: bytes, fields: Any, run_id: str) -> tuple[str, ev.Entry | None]:
    """Of the newest entry a read returned of a watched stream: its id, and the entry if it
    closes the run (decoded only when its type may: most entries of a watched run do not)."""
    return _last_entry([(entry_id, fields)], run_id)


def read_pause(read_at: float, watched: int, now: float) -> float:
    """How long a waiter waits before its next read: :data:`READ_PACE_S` per watched run since
    the previous read began (``read_at``), at most :data:`READ_PACE_MAX_S`."""
    return read_at + min(READ_PACE_MAX_S, READ_PACE_S * watched) - now


def _unserved_error(ref: RunRef, reason: str) -> WorkflowBlocked:
    return blocked_error(ref.workflow_id, ref.run_id, BlockedReason(kind=NO_LIVE_WORKER, message=reason))


def _still_unserved(since: float | None, unserved: bool) -> float | None:
    """Since when (monotonic) a run has had no live worker of its build, given one more look."""
    return (since if since is not None else time.monotonic()) if unserved else None


def _unserved_too_long(since: float | None) -> bool:
    return since is not None and time.monotonic() - since >= NO_LIVE_WORKER_GRACE_S


def stalled_error(watch: Any, record: dict[str, Any] | None, live: list[WorkerInfo]) -> BaseException | None:
    """What a waiter of ``watch`` (its ``ref`` and ``unserved_since``, which this updates) is
    told now, given its run's ``record`` and the live workers (read only for a pinned run):
    the run is gone, blocked, or pinned to a build no live worker has served for
    :data:`NO_LIVE_WORKER_GRACE_S`. ``None``: it may still close, the wait goes on."""
    ref = watch.ref
    if record is None:
        return WorkflowNotFound(f"run {ref.run_id} of workflow {ref.workflow_id!r} no longer exists")
    reason = blocked_reason(record)
    if reason is not None:
        return blocked_error(ref.workflow_id, ref.run_id, reason)
    unserved = no_live_worker_reason(record, live) if record.get("build") else None
    watch.unserved_since = _still_unserved(watch.unserved_since, unserved is not None)
    if unserved is not None and _unserved_too_long(watch.unserved_since):
        return _unserved_error(ref, unserved)
    return None


class RunMoved(Exception):
    """The workflow id's current run is not the run looked at (another run took its place).

    Attributes:
        current: The id's current run as the look read it (``None``: the id has none).
    """

    def __init__(self, current: str | None) -> None:
        super().__init__(current)
        self.current = current


def check_current(ref: RunRef, current: bytes | str | None) -> None:
    """Raise :class:`RunMoved` unless ``current`` (the instance's ``run`` field, as read in a
    look's round trip) is ``ref``'s run."""
    run_id = current.decode() if isinstance(current, bytes) else current
    if run_id != ref.run_id:
        raise RunMoved(run_id or None)


def look(store: RedisStore, ref: RunRef, *, current: bool = False) -> tuple[str, ev.Entry | None, str | None]:
    """One look at a run: its closing entry, or the last stream id to wait after, and (a run
    pinned to a build) why no live worker can move it (``None``: one can).

    ``current``: ``ref`` is the run a caller last knew as its workflow's current one; the same
    round trip checks it still is (a caller's id lookup and its look in one round trip).

    Raises:
        RunMoved: ``current`` and the workflow's current run is another (or none).
        WorkflowBlocked: the run is open and blocked.
        WorkflowNotFound: the run record is gone (expired or purged).
    """
    k = store.keys
    commands: list[tuple[Any, ...]] = [
        ("XREVRANGE", k.history(ref.partition, ref.run_id), "+", "-", "COUNT", 1),
        ("HMGET", k.run(ref.partition, ref.run_id), *_RECORD_FIELDS),
    ]
    if current:
        commands.append(("HGET", k.instance(ref.partition, ref.workflow_id), "run"))
    rows, values, *now = store.round_trip(commands)
    if current:
        check_current(ref, now[0])
    last, closing = _last_entry(stream_rows(rows), ref.run_id)
    if closing is not None:
        return last, closing, None
    record = _record(values)
    if record is None:
        raise WorkflowNotFound(f"run {ref.run_id} of workflow {ref.workflow_id!r} no longer exists")
    reason = blocked_reason(record)
    if reason is not None:
        raise blocked_error(ref.workflow_id, ref.run_id, reason)
    return last, None, store.unserved_reason(record)


def wait_alone(store: RedisStore, ref: RunRef, deadline: float | None, *, current: bool = False) -> ev.Entry:
    """Wait for ``ref`` to close, blocking a connection of this caller's own (a cluster's way).
    ``current``: as for :func:`look` (checked once, first). Once waiting, it rides out an
    unreachable node for up to :data:`OUTAGE_RIDE_S`, as the shared waiter does."""
    key = store.keys.history(ref.partition, ref.run_id)
    since: float | None = None
    waiting = False
    outage = waits_outage(store)  # this caller's: other callers may read from nodes that answer
    child_check = time.monotonic() + CHILD_CHECK_S
    while True:
        try:
            last, closing, unserved = look(store, ref, current=current)
            current = False
            if closing is not None:
                return closing
            since = _still_unserved(since, unserved is not None)
            if unserved is not None and _unserved_too_long(since):
                raise _unserved_error(ref, unserved)
            if time.monotonic() >= child_check:  # as the shared waiter: a child lost for good
                child_check = time.monotonic() + CHILD_CHECK_S
                (gone,) = children_gone(store, [ref])
                if gone is not None:
                    raise blocked_error(ref.workflow_id, ref.run_id, gone)
            waiting = True
            block_s = BLOCK_CHECK_S
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"workflow {ref.workflow_id!r} did not close within the timeout")
                block_s = min(block_s, remaining)
            store.redis.xread({key: last}, count=1, block=max(1, int(block_s * 1000)))
            outage.recovered()
        except redis.RedisError as exc:
            if not waiting:
                raise  # a wait that never began fails at once, as the shared waiter's first look
            timeout = TimeoutError(f"workflow {ref.workflow_id!r} did not close within the timeout")
            sleep_out(outage, exc, deadline, timeout, store.url)


@dataclass
class _Caller:
    """One thread waiting in ``result()``: woken with the closing entry or an error."""

    event: threading.Event = field(default_factory=threading.Event)
    entry: ev.Entry | None = None
    error: BaseException | None = None


@dataclass
class _Watch:
    ref: RunRef
    last: str
    callers: list[_Caller] = field(default_factory=list)
    unserved_since: float | None = None  # monotonic: since when no live worker serves its build
    since: float = field(default_factory=time.monotonic)


class RunWaiter:
    """The process's waits on one store's runs (see the module docstring)."""

    def __init__(self, store: RedisStore) -> None:
        # No reference to the store: waiters live in a map weakly keyed by it. The thread
        # holds the store only while runs are watched.
        self._lock = threading.Lock()
        self._watches: dict[str, _Watch] = {}
        self._idle = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._client_id: int | None = None
        self._in_read = False
        self._kicked = False
        self._next_check = 0.0
        self._next_child_check = 0.0
        self._read_at = 0.0
        self._outage = waits_outage(store)

    def wait(
        self, store: RedisStore, ref: RunRef, deadline: float | None, *, current: bool = False
    ) -> ev.Entry:
        """The closing entry of ``ref`` (a run of ``store``) once it is written.
        ``current``: as for :func:`look`.

        Raises:
            RunMoved: ``current`` and ``ref`` is no longer its workflow's current run.
            WorkflowBlocked: the run is (or becomes) blocked.
            WorkflowNotFound: the run record is gone.
            TimeoutError: ``deadline`` (``time.monotonic()``) passed first.
            redis.RedisError: Redis failed while waiting (unreachable: for over :data:`OUTAGE_RIDE_S`).
        """
        last, closing, unserved = look(store, ref, current=current)
        if closing is not None:
            return closing
        caller = _Caller()
        key = store.keys.history(ref.partition, ref.run_id)
        with self._lock:
            watch = self._watches.get(key)
            fresh = watch is None
            if watch is None:
                watch = self._watches[key] = _Watch(ref, last)
            watch.unserved_since = _still_unserved(watch.unserved_since, unserved is not None)
            watch.callers.append(caller)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, args=(store,), name="durable-run-waiter", daemon=True
                )
                self._thread.start()
            self._idle.notify()
            kick = fresh and self._in_read and not self._kicked
            if kick:
                self._kicked = True
        if kick:
            self._interrupt_read(store)
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not caller.event.wait(remaining):
            with self._lock:
                self._drop(key, caller)
            if not caller.event.is_set():
                raise TimeoutError(f"workflow {ref.workflow_id!r} did not close within the timeout")
        if caller.error is not None:
            raise caller.error
        assert caller.entry is not None
        return caller.entry

    def _drop(self, key: str, caller: _Caller) -> None:
        watch = self._watches.get(key)
        if watch is not None and caller in watch.callers:
            watch.callers.remove(caller)
            if not watch.callers:
                del self._watches[key]

    def _interrupt_read(self, store: RedisStore) -> None:
        """End the thread's blocking read early, so it starts watching a new run now."""
        client_id = self._client_id
        if client_id is None:
            return
        try:
            store.redis.client_unblock(client_id)
        except redis.RedisError:  # e.g. CLIENT not allowed by an ACL: the read ends within BLOCK_MS
            self._client_id = None

    # ------------------------------------------------------------ the thread
    def _run(self, store: RedisStore) -> None:
        conn: Any = None
        try:
            while self._has_work():
                conn = self._read_once(store, conn)
        except Exception as exc:
            # A bug met here must not leave this process's waits hanging on a dead thread:
            # the callers waiting now get the error, and the next wait starts a new thread.
            log.exception("the run waiter thread stopped")
            with self._lock:
                self._thread = None
            self._fail_all(exc)
        finally:
            self._client_id = None
            if conn is not None:
                _close(conn)

    def _has_work(self) -> bool:
        """Whether runs are watched (after waiting up to IDLE_S for one; if not, the thread ends)."""
        with self._lock:
            if not self._watches:
                self._idle.wait(IDLE_S)
            if not self._watches:
                self._thread = None
                return False
            return True

    def _read_once(self, store: RedisStore, conn: Any) -> Any:
        """One blocking read over the watched streams and what follows from it; the
        connection to read on next (``None`` after an error: a new one)."""
        pause = read_pause(self._read_at, len(self._watches), time.monotonic())
        if pause > 0:
            time.sleep(pause)
        self._read_at = time.monotonic()
        with self._lock:
            streams = {key: w.last for key, w in self._watches.items()}
            self._in_read, self._kicked = True, False
        if not streams:
            return conn
        try:
            if conn is None:
                conn = _own_client(store)
                self._client_id = _client_id(conn)
            replies = conn.xread(streams, count=READ_COUNT, block=BLOCK_MS)
            with self._lock:
                self._in_read = False
                self._take(replies or [])
            if time.monotonic() >= self._next_check:
                self._check_blocked(store)
                self._next_check = time.monotonic() + BLOCK_CHECK_S
            self._outage.recovered()
            return conn
        except redis.RedisError as exc:
            if conn is not None:
                _close(conn)
            self._client_id = None
            delay = self._outage.failed(exc)
            error = give_up(self._outage, exc, store.url)
            if error is not None:
                # Every caller waiting now learns of it, as a caller blocking on its own would.
                self._fail_all(error)
            time.sleep(delay)
            return None

    def _watched(self, keys: list[str] | None = None) -> list[tuple[str, _Watch]]:
        with self._lock:
            if keys is None:
                return list(self._watches.items())
            return [(k, self._watches[k]) for k in keys if k in self._watches]

    def _take(self, replies: Any) -> None:
        """Follow the streams the read returned (the lock is held): wake the runs whose newest
        entry read closes them, remember where the others are (no second look at Redis)."""
        for raw_key, entries in replies.items() if isinstance(replies, dict) else replies:
            key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
            watch = self._watches.get(key)
            if watch is None or not entries:
                continue
            entry_id, fields = entries[-1]
            last, closing = newest(entry_id, fields, watch.ref.run_id)
            if closing is None:
                watch.last = last
            else:
                self._wake(key, entry=closing)

    def _check_blocked(self, store: RedisStore) -> None:
        watched = self._watched()
        if not watched:
            return
        keys = store.keys
        with store.redis.pipeline(transaction=False) as pipe:
            for _, watch in watched:
                pipe.hmget(keys.run(watch.ref.partition, watch.ref.run_id), _RECORD_FIELDS)
            rows = pipe.execute()
        records = [_record(values) for values in rows]
        # The registry is read only when a watched run is pinned to a build.
        live: list[WorkerInfo] = store.live_workers() if any(r and r.get("build") for r in records) else []
        errors = {
            key: stalled_error(watch, record, live)
            for (key, watch), record in zip(watched, records, strict=True)
        }
        if time.monotonic() >= self._next_child_check:
            self._next_child_check = time.monotonic() + CHILD_CHECK_S
            old = time.monotonic() - CHILD_CHECK_S
            long = [(k, w) for k, w in watched if errors[k] is None and w.since <= old]
            for (key, watch), gone in zip(long, children_gone(store, [w.ref for _, w in long]), strict=True):
                if gone is not None:
                    errors[key] = blocked_error(watch.ref.workflow_id, watch.ref.run_id, gone)
        with self._lock:
            for key, error in errors.items():
                if error is not None:
                    self._wake(key, error=error)

    def _wake(self, key: str, *, entry: ev.Entry | None = None, error: BaseException | None = None) -> None:
        """Wake every caller of ``key`` (the lock is held)."""
        watch = self._watches.pop(key, None)
        for caller in watch.callers if watch else ():
            caller.entry, caller.error = entry, error
            caller.event.set()

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            self._in_read = False
            for key in list(self._watches):
                self._wake(key, error=exc)


def waits_outage(store: RedisStore) -> Incident:
    """The outage log of this process's waits on ``store`` (backing off up to 2 s: waits resume
    soon after): its client's (``store.client_outage``), so one WARNING per
    outage however many ``result()`` and ``update()`` calls wait; on a Redis Cluster one per
    wait, since waits there read different nodes (one may answer while another is down)."""
    if store.cluster:
        return Incident(log, "waiter of this result() or update() call", cap=2.0)
    return store.client_outage


def give_up(outage: Incident, exc: BaseException, url: str | None) -> BaseException | None:
    """After ``exc`` (noted in ``outage`` already) failed a wait's read: ``None`` while the waits
    keep their callers (Redis unreachable for less than :data:`OUTAGE_RIDE_S`), else what the
    callers get: ``exc`` itself when it is no outage, or :class:`~durable.errors.RedisUnavailable`
    (its ``__cause__`` is ``exc``)."""
    if unavailable_kind(exc) is None:
        return exc
    if outage.lasted <= OUTAGE_RIDE_S:
        return None
    log.warning(
        "redis unreachable for over %.0f s: the result() and update() waits of this process give up",
        OUTAGE_RIDE_S,
    )
    return unavailable_error(exc, url, "the result() or update() wait", OUTAGE_RIDE_S)


def sleep_out(
    outage: Incident, exc: redis.RedisError, deadline: float | None, timeout: Exception, url: str | None
) -> None:
    """After ``exc`` failed a wait's own read: wait to try again unless :func:`give_up` says
    not to (then raise what it says); raise ``timeout`` when ``deadline`` (``time.monotonic()``)
    comes first."""
    delay = outage.failed(exc)
    error = give_up(outage, exc, url)
    if error is not None:
        raise error
    if deadline is not None and time.monotonic() + delay >= deadline:
        raise timeout from None
    time.sleep(delay)


def wait_closing(
    store: RedisStore, ref: RunRef, deadline: float | None, *, current: bool = False
) -> ev.Entry:
    """The closing entry of ``ref`` once it is written: through the process's
    :class:`RunWaiter`, or on a Redis Cluster (one ``XREAD`` cannot span its slots) by
    :func:`wait_alone`. Raises what :meth:`RunWaiter.wait` raises."""
    if store.cluster:
        return wait_alone(store, ref, deadline, current=current)
    return waiter_for(store).wait(store, ref, deadline, current=current)


_waiters: weakref.WeakKeyDictionary[RedisStore, tuple[int, RunWaiter]] = weakref.WeakKeyDictionary()
_waiters_lock = threading.Lock()


def waiter_for(store: RedisStore) -> RunWaiter:
    """The process's waiter for ``store`` (a new one after ``fork``: threads do not survive it)."""
    pid = os.getpid()
    with _waiters_lock:
        held = _waiters.get(store)
        if held is None or held[0] != pid:
            held = _waiters[store] = (pid, RunWaiter(store))
        return held[1]


def _own_client(store: RedisStore) -> redis.Redis:
    """A client for the waiter thread's blocking reads, on a connection pool of its own: closing
    the store disconnects every connection of its pool, in use or not, and a socket closed under
    a blocked read frees its file descriptor for the next socket opened, whose bytes that read
    would then take (seen as a garbled command in a later call on another store)."""
    pool = store.redis.connection_pool
    own = redis.ConnectionPool(
        connection_class=pool.connection_class, max_connections=1, **pool.connection_kwargs
    )
    return redis.Redis(connection_pool=own, single_connection_client=True)


def _close(conn: Any) -> None:
    """Close a client made by :func:`_own_client`, its pool with it."""
    conn.close()
    conn.connection_pool.disconnect()


def _client_id(conn: Any) -> int | None:
    """The connection's CLIENT ID, to cut its blocking read short; None when an ACL refuses
    CLIENT (the recipe in docs/security.md does): the read then ends within ``BLOCK_MS``."""
    try:
        return int(conn.client_id())
    except redis.exceptions.NoPermissionError:
        return None
