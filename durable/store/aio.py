"""The store's waits for asyncio: one blocking read per event loop, however many coroutines wait.

The asyncio twin of :mod:`durable.store.waits`. Each event loop gets one
:class:`AsyncRunWaiter` per store: a task that blocks in one ``XREAD`` over every watched
run's history stream on a connection of its own, and wakes the futures of the runs whose
closing entry it reads. So ``await stub.result()`` holds neither a thread nor a
connection: N awaiting coroutines cost one blocking read. Every :data:`BLOCK_CHECK_S` it
also reads the watched runs' ``blocked`` fields (a block is written to the run record, not
to the history) and fails their futures with :class:`~durable.errors.WorkflowBlocked`.

What a wait costs the loop is kept per closed run rather than per event (issue 18): the
``XREAD`` is packed from pieces each watch keeps (nothing re-encoded per read), its reply
carries the new entries, so the newest one tells whether a run closed without a second
look, and only an entry whose type closes a run is decoded; a burst of new waits restarts
the read once (one ``CLIENT UNBLOCK``); reads are paced by the number of watched runs
(:data:`READ_PACE_S`), so under load one read serves many grown streams; and the waits'
short commands (a look, the current run, the blocked check) of one loop go out together
(:class:`_Batch`), one round trip for all the coroutines that asked meanwhile.

Only the waits are asynchronous here. The short calls of the async client (start, signal,
query, update delivery) run the store's synchronous code on the loop's default executor
(see :mod:`durable.aio`): each is one round trip, and keeping one implementation of their
Lua scripts' arguments and replies is worth the executor hop."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aredis
from redis.asyncio import connection as aconnection

from .. import events as ev
from ..errors import WorkflowNotFound
from ..ids import shown_id
from ..runinfo import blocked_reason
from .child_blocks import children_gone
from .records import RunRef, text
from .redis_store import RedisStore
from .updates import scan_for_outcome, update_timeout
from .waits import (
    _RECORD_FIELDS,
    BLOCK_CHECK_S,
    BLOCK_MS,
    CHILD_CHECK_S,
    IDLE_S,
    READ_COUNT,
    _last_entry,
    _record,
    blocked_error,
    check_current,
    give_up,
    newest,
    read_pause,
    stalled_error,
    waits_outage,
)
from .workers import WorkerInfo

log = logging.getLogger("durable.client")

POOL_SIZE = 32
"""Connections of a loop's async client (looks, update waits); more callers wait for one."""

_CONNECTION_CLASSES: dict[type, type] = {
    redis.connection.Connection: aconnection.Connection,
    redis.connection.SSLConnection: aconnection.SSLConnection,
    redis.connection.UnixDomainSocketConnection: aconnection.UnixDomainSocketConnection,
}


def async_client(store: RedisStore) -> aredis.Redis:
    """A ``redis.asyncio`` client for the server of ``store`` (same URL, or the same
    connection options when the store was given a client instead of a URL)."""
    if store.url:
        pool = aredis.BlockingConnectionPool.from_url(store.url, max_connections=POOL_SIZE, timeout=60)
    else:
        sync_pool = store.redis.connection_pool
        kwargs = dict(sync_pool.connection_kwargs)
        connection_class = _CONNECTION_CLASSES.get(sync_pool.connection_class, aconnection.Connection)
        pool = aredis.BlockingConnectionPool(
            connection_class=connection_class, max_connections=POOL_SIZE, timeout=60, **kwargs
        )
    return aredis.Redis(connection_pool=pool)


def _bulk(value: str) -> bytes:
    """``value`` as one RESP bulk string (a piece of a packed command)."""
    raw = value.encode()
    return b"$%d\r\n%s\r\n" % (len(raw), raw)


_XREAD_HEAD = (
    b"$5\r\nXREAD\r\n$5\r\nCOUNT\r\n" + _bulk(str(READ_COUNT)) + b"$5\r\nBLOCK\r\n" + _bulk(str(BLOCK_MS))
)


def _entry_fields(fields: Any) -> Any:
    """An entry's fields as a mapping (a raw RESP2 reply has them as a flat list)."""
    return dict(zip(fields[::2], fields[1::2], strict=True)) if isinstance(fields, list) else fields


def _pack(*args: str) -> bytes:
    """A command packed for the wire (RESP)."""
    return b"*%d\r\n%s" % (len(args), b"".join(_bulk(arg) for arg in args))


class _Batch:
    """The short commands of one loop's waits (looks, current runs, blocked checks), sent
    together on one connection: whatever is asked while a batch is out goes in the next, so
    200 coroutines looking at once cost a few round trips, not 200 pool checkouts."""

    def __init__(self, pool: aredis.ConnectionPool) -> None:
        self._pool = pool
        self._conn: aconnection.AbstractConnection | None = None
        self._pending: list[tuple[bytes, asyncio.Future[Any]]] = []
        self._task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None

    def call(self, *args: str) -> asyncio.Future[Any]:
        """The raw reply of one command (bytes undecoded), once its batch is answered."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((_pack(*args), future))
        if self._task is None:
            self._task = loop.create_task(self._flush(), name="durable-async-batch")
        return future

    async def _flush(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                await self._send(batch)
        finally:
            self._task = None
            self._idle = asyncio.get_running_loop().call_later(IDLE_S, self._close_idle)

    async def _send(self, batch: list[tuple[bytes, asyncio.Future[Any]]]) -> None:
        answered = 0
        try:
            if self._conn is None:
                conn = self._pool.make_connection()
                await conn.connect()
                self._conn = conn
            await self._conn.send_packed_command(
                b"".join(command for command, _ in batch), check_health=False
            )
            for _, future in batch:
                try:
                    reply: Any = await self._conn.read_response(disable_decoding=True)
                except redis.ResponseError as exc:  # this command's error; the connection is fine
                    reply = exc
                answered += 1
                if not future.done():
                    future.set_exception(reply) if isinstance(reply, Exception) else future.set_result(reply)
        except (redis.RedisError, OSError) as exc:
            for _, future in batch[answered:]:
                if not future.done():
                    future.set_exception(exc)
            await self._drop_connection()
        except BaseException:
            await self._drop_connection()  # cancelled mid-reply: the connection is out of step
            raise

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.disconnect()

    async def aclose(self) -> None:
        """Close the connection now (its loop is shutting down)."""
        if self._idle is not None:
            self._idle.cancel()
        await self._drop_connection()

    def _close_idle(self) -> None:
        if self._task is None and self._conn is not None:
            self._task = asyncio.get_running_loop().create_task(self._close())

    async def _close(self) -> None:
        try:
            await self._drop_connection()
        finally:
            self._task = None
            if self._pending:  # asked for while closing
                self._task = asyncio.get_running_loop().create_task(self._flush())


async def current_ref(batch: _Batch, store: RedisStore, workflow_id: str) -> RunRef:
    """The workflow's current run (``RedisStore.ref`` without a thread).

    Raises:
        WorkflowNotFound: no workflow with that id.
    """
    p = store.keys.partition(workflow_id)
    current = await batch.call("HGET", store.keys.instance(p, workflow_id), "run")
    if current is None:
        raise WorkflowNotFound(f"no workflow with id {shown_id(workflow_id)}")
    return RunRef(p, text(current), workflow_id)


def _rows(reply: Any) -> list[tuple[bytes, Any]]:
    """A raw ``XRANGE``/``XREVRANGE``/``XREAD`` entry list as (id, fields mapping) pairs."""
    return [(entry_id, _entry_fields(fields)) for entry_id, fields in reply or ()]


async def look(
    batch: _Batch, store: RedisStore, ref: RunRef, *, current: bool = False
) -> tuple[str, ev.Entry | None]:
    """One look at a run (:func:`durable.store.waits.look`, awaited).

    Raises:
        RunMoved: ``current`` and the workflow's current run is another (or none).
        WorkflowBlocked: the run is open and blocked.
        WorkflowNotFound: the run record is gone (expired or purged).
    """
    calls = [
        batch.call("XREVRANGE", store.keys.history(ref.partition, ref.run_id), "+", "-", "COUNT", "1"),
        batch.call("HMGET", store.keys.run(ref.partition, ref.run_id), *_RECORD_FIELDS),
    ]
    if current:
        calls.append(batch.call("HGET", store.keys.instance(ref.partition, ref.workflow_id), "run"))
    rows, values, *now = await asyncio.gather(*calls)
    if current:
        check_current(ref, now[0])
    last, closing = _last_entry(_rows(rows), ref.run_id)
    if closing is not None:
        return last, closing
    record = _record(values)
    if record is None:
        raise WorkflowNotFound(f"run {ref.run_id} of workflow {ref.workflow_id!r} no longer exists")
    reason = blocked_reason(record)
    if reason is not None:
        raise blocked_error(ref.workflow_id, ref.run_id, reason)
    return last, None


@dataclass
class _Watch:
    ref: RunRef
    last: str
    key_arg: bytes  # the stream's key, packed once for every XREAD
    last_arg: bytes = b""  # ``last``, packed (renewed as the stream grows)
    futures: list[asyncio.Future[ev.Entry]] = field(default_factory=list)
    unserved_since: float | None = None  # monotonic: since when no live worker serves its build
    since: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.last_arg = _bulk(self.last)

    def advance(self, last: str) -> None:
        self.last, self.last_arg = last, _bulk(last)


class AsyncRunWaiter:
    """One event loop's waits on one store's runs (see the module docstring)."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.client = async_client(store)
        self.batch = _Batch(self.client.connection_pool)
        self._watches: dict[str, _Watch] = {}
        self._task: asyncio.Task[None] | None = None
        self._kick_task: asyncio.Task[None] | None = None
        self._wanted = asyncio.Event()
        self._reader_id: int | None = None
        self._in_read = False
        self._kicked = False
        self._next_check = 0.0
        self._next_child_check = 0.0
        self._read_at = 0.0
        self._outage = waits_outage(store)

    async def aclose(self) -> None:
        """Stop the waits' tasks and close every connection of this waiter (its loop is
        shutting down)."""
        for task in (self._task, self._kick_task):
            if task is not None and not task.done():
                task.cancel()
        await self.batch.aclose()
        await self.client.connection_pool.disconnect()

    async def ref(self, workflow_id: str) -> RunRef:
        """The workflow's current run."""
        return await current_ref(self.batch, self.store, workflow_id)

    async def wait(self, ref: RunRef, deadline: float | None, *, current: bool = False) -> ev.Entry:
        """The closing entry of ``ref`` once it is written (``deadline``: the loop's clock).
        ``current``: as for :func:`look`.

        Raises:
            RunMoved: ``current`` and ``ref`` is no longer its workflow's current run.
            WorkflowBlocked: the run is (or becomes) blocked.
            WorkflowNotFound: the run record is gone.
            TimeoutError: ``deadline`` passed first.
            redis.RedisError: Redis failed while waiting (unreachable: for over :data:`~durable.store.waits.OUTAGE_RIDE_S`).
        """
        loop = asyncio.get_running_loop()
        last, closing = await look(self.batch, self.store, ref, current=current)
        if closing is not None:
            return closing
        key = self.store.keys.history(ref.partition, ref.run_id)
        future: asyncio.Future[ev.Entry] = loop.create_future()
        watch = self._watches.get(key)
        if watch is None:
            watch = self._watches[key] = _Watch(ref, last, _bulk(key))
            self._kick(loop)
        watch.futures.append(future)
        if self._task is None:
            self._task = loop.create_task(self._run(), name="durable-async-run-waiter")
        self._wanted.set()
        remaining = None if deadline is None else max(0.0, deadline - loop.time())
        try:
            async with asyncio.timeout(remaining):
                return await future
        except TimeoutError:
            raise TimeoutError(f"workflow {ref.workflow_id!r} did not close within the timeout") from None
        finally:
            self._drop(key, future)

    def _drop(self, key: str, future: asyncio.Future[ev.Entry]) -> None:
        watch = self._watches.get(key)
        if watch is not None and future in watch.futures:
            watch.futures.remove(future)
            if not watch.futures:
                del self._watches[key]

    def _kick(self, loop: asyncio.AbstractEventLoop) -> None:
        """End the blocking read early, so it watches a new run now (else within BLOCK_MS).

        One kick serves every run registered until the next read starts: a burst of new
        waits costs one ``CLIENT UNBLOCK`` and one restarted read, not one each.
        """
        if self._in_read and not self._kicked and self._reader_id is not None:
            self._kicked = True
            self._kick_task = loop.create_task(self._interrupt_read(self._reader_id))

    async def _interrupt_read(self, reader_id: int) -> None:
        try:
            await self.client.client_unblock(reader_id)
        except redis.RedisError:  # e.g. CLIENT refused by an ACL: the read ends within BLOCK_MS
            self._reader_id = None

    # ------------------------------------------------------------- the task
    async def _run(self) -> None:
        conn: aconnection.AbstractConnection | None = None
        try:
            while await self._has_work():
                conn = await self._read_once(conn)
        except Exception as exc:
            # A bug met here must not leave the loop's waits hanging on a dead task: the
            # callers waiting now get the error, and the next wait starts a new task.
            log.exception("the async run waiter stopped")
            for key in list(self._watches):
                self._wake(key, error=exc)
        finally:
            self._task, self._reader_id = None, None
            if conn is not None:
                await conn.disconnect()

    async def _has_work(self) -> bool:
        if not self._watches:
            self._wanted.clear()
            try:
                async with asyncio.timeout(IDLE_S):
                    await self._wanted.wait()
            except TimeoutError:
                pass
        return bool(self._watches)

    def _xread_command(self) -> bytes:
        """``XREAD COUNT .. BLOCK .. STREAMS <keys> <ids>`` over the watched runs, packed from
        the pieces each watch keeps (nothing is encoded again per read)."""
        watches = self._watches.values()
        head = b"*%d\r\n%s$7\r\nSTREAMS\r\n" % (6 + 2 * len(watches), _XREAD_HEAD)
        return b"".join((head, *(w.key_arg for w in watches), *(w.last_arg for w in watches)))

    async def _read_once(
        self, conn: aconnection.AbstractConnection | None
    ) -> aconnection.AbstractConnection | None:
        """One blocking read over the watched streams and what follows from it; the
        connection to read on next (``None`` after an error: a new one)."""
        loop = asyncio.get_running_loop()
        try:
            if conn is None:
                conn = self.client.connection_pool.make_connection()
                await conn.connect()
                self._reader_id = await _client_id(conn)
            await self._pace(loop)
            if not self._watches:  # every wait ended meanwhile
                return conn
            self._in_read, self._kicked = True, False
            await conn.send_packed_command(self._xread_command(), check_health=False)
            reply: Any = await conn.read_response(disable_decoding=True)
            self._in_read = False
            if reply:
                self._take(reply)
            if loop.time() >= self._next_check:
                await self._check_blocked()
                self._next_check = loop.time() + BLOCK_CHECK_S
            self._outage.recovered()
            return conn
        except redis.RedisError as exc:
            self._in_read, self._reader_id = False, None
            delay = self._outage.failed(exc)
            error = give_up(self._outage, exc, self.store.url)
            if error is not None:
                for key in list(self._watches):
                    self._wake(key, error=error)
            if conn is not None:
                await conn.disconnect()
            await asyncio.sleep(delay)
            return None

    async def _pace(self, loop: asyncio.AbstractEventLoop) -> None:
        """Pause as :func:`~durable.store.waits.read_pause` says before the next read."""
        pause = read_pause(self._read_at, len(self._watches), loop.time())
        if pause > 0:
            await asyncio.sleep(pause)
        self._read_at = loop.time()

    def _take(self, reply: Any) -> None:
        """Follow the streams the read returned: wake the runs whose newest entry read closes
        them, remember where the others are (the entries are in the reply: no second look)."""
        for raw_key, entries in reply.items() if isinstance(reply, dict) else reply:
            key = raw_key.decode()
            watch = self._watches.get(key)
            if watch is None or not entries:
                continue
            entry_id, fields = entries[-1]
            last, closing = newest(entry_id, _entry_fields(fields), watch.ref.run_id)
            if closing is None:
                watch.advance(last)
            else:
                self._wake(key, entry=closing)

    async def _check_blocked(self) -> None:
        watched = list(self._watches.items())
        if not watched:
            return
        keys = self.store.keys
        rows = await asyncio.gather(
            *(
                self.batch.call("HMGET", keys.run(w.ref.partition, w.ref.run_id), *_RECORD_FIELDS)
                for _, w in watched
            )
        )
        records = [_record(values) for values in rows]
        # The registry is read only when a watched run is pinned to a build (on the executor,
        # like the client's other short calls: one read every BLOCK_CHECK_S at most).
        pinned = any(r and r.get("build") for r in records)
        live: list[WorkerInfo] = await asyncio.to_thread(self.store.live_workers) if pinned else []
        for (key, watch), record in zip(watched, records, strict=True):
            error = stalled_error(watch, record, live)  # as the threads' waiter decides
            if error is not None:
                self._wake(key, error=error)
        if time.monotonic() >= self._next_child_check:  # and a child lost for good, as it does
            self._next_child_check = time.monotonic() + CHILD_CHECK_S
            old = time.monotonic() - CHILD_CHECK_S
            long = [(k, w) for k, w in watched if k in self._watches and w.since <= old]
            gone = (
                await asyncio.to_thread(children_gone, self.store, [w.ref for _, w in long]) if long else []
            )
            for (key, watch), reason in zip(long, gone, strict=True):
                if reason is not None:
                    self._wake(key, error=blocked_error(watch.ref.workflow_id, watch.ref.run_id, reason))

    def _wake(self, key: str, *, entry: ev.Entry | None = None, error: BaseException | None = None) -> None:
        watch = self._watches.pop(key, None)
        for future in watch.futures if watch else ():
            if future.done():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                assert entry is not None
                future.set_result(entry)


async def _client_id(conn: aconnection.AbstractConnection) -> int | None:
    """The connection's CLIENT ID (None when an ACL refuses CLIENT: reads end within BLOCK_MS)."""
    try:
        await conn.send_command("CLIENT", "ID")
        return int(await conn.read_response())
    except redis.exceptions.NoPermissionError:
        return None


async def wait_update(
    waiter: AsyncRunWaiter, ref: RunRef, update_id: str, after: str, deadline: float | None
) -> ev.UpdateCompleted | ev.UpdateRejectedEvent:
    """:func:`durable.store.updates.wait_update`, awaited: read the run's history after
    ``after`` (``XREAD BLOCK`` on a pooled connection) until the update's outcome.

    Raises:
        WorkflowClosed: the run closed before the update had an outcome.
        WorkflowBlocked: the run is (or becomes) blocked.
        WorkflowNotFound: the run is gone.
        TimeoutError: ``deadline`` (the loop's clock) passed first.
    """
    loop = asyncio.get_running_loop()
    key = waiter.store.keys.history(ref.partition, ref.run_id)
    last = after
    outage = waits_outage(waiter.store)
    while True:
        block_s = BLOCK_CHECK_S
        if deadline is not None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise update_timeout(ref, update_id)
            block_s = min(block_s, remaining)
        try:
            reply: Any = await waiter.client.xread({key: last}, count=256, block=max(1, int(block_s * 1000)))
            rows: list[Any] = reply[0][1] if reply else []
            last, outcome = scan_for_outcome(rows, ref, update_id, last)
            if outcome is not None:
                return outcome
            if not rows:
                await look(waiter.batch, waiter.store, ref)  # raises for a blocked or vanished run
            outage.recovered()
        except redis.RedisError as exc:  # rides out an unreachable Redis, as result() does
            delay = outage.failed(exc)
            error = give_up(outage, exc, waiter.store.url)
            if error is not None:
                raise error from error.__cause__  # exc itself, or RedisUnavailable caused by it
            if deadline is not None and loop.time() + delay >= deadline:
                raise update_timeout(ref, update_id) from None
            await asyncio.sleep(delay)


class _LoopWaiters:
    """One event loop's waiters (one per store), closed when the loop shuts down.

    A waiter's connections belong to its loop and a loop has no close hook, so an async
    generator stands in for one: started on the loop, it is closed by the loop's
    ``shutdown_asyncgens()`` (``asyncio.run`` and ``asyncio.Runner`` call it before closing the
    loop), and its ``finally`` closes every waiter and forgets the loop. Without it each
    ``asyncio.run`` left its connections open for the life of the process (the registry kept
    the closed loop, and they refer to it).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.by_store: weakref.WeakKeyDictionary[RedisStore, AsyncRunWaiter] = weakref.WeakKeyDictionary()
        self._loop = weakref.ref(loop)
        self._guard = self._until_shutdown()  # the loop holds async generators weakly
        advance = self._guard.__anext__()  # its first step registers it with the running loop
        self._started = loop.create_task(_awaited(advance), name="durable-async-loop-guard")

    async def _until_shutdown(self) -> AsyncIterator[None]:
        try:
            yield
        finally:
            loop = self._loop()
            if loop is not None:
                _waiters.pop(loop, None)
            for waiter in list(self.by_store.values()):
                await waiter.aclose()


async def _awaited(step: Awaitable[Any]) -> None:
    await step


_waiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaiters] = weakref.WeakKeyDictionary()


def async_waiter_for(store: RedisStore) -> AsyncRunWaiter:
    """The running event loop's waiter for ``store`` (made on first use; one loop never
    shares its futures or connections with another; closed with the loop)."""
    loop = asyncio.get_running_loop()
    per_loop = _waiters.get(loop)
    if per_loop is None:
        per_loop = _waiters[loop] = _LoopWaiters(loop)
    waiter = per_loop.by_store.get(store)
    if waiter is None:
        waiter = per_loop.by_store[store] = AsyncRunWaiter(store)
    return waiter
