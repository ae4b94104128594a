"""Raw pipelines for the worker's hot path: commands packed by hiredis, replies read as they come.

A worker's pass sends tens of commands per round trip (load the runs, commit the
decisions, record activity results). Measured on a 2-core machine, redis-py's
pipeline layers (per-command bookkeeping, response callbacks, the retry wrapper)
cost the worker more CPU than Redis spent running the commands. Here a batch is
packed with ``hiredis.pack_command``, written with one ``sendall``, and its
replies are read raw (lists as Redis sends them, error replies as exception
objects in their place); callers decode the few shapes they use.

On a Redis Cluster, :class:`~durable.store.cluster_wire.ClusterWire` does the same per
node (one write per node owning a batch's slots), with the same interface.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
import redis
from redis import exceptions as rexc

from .connect import own_connection

Command = Sequence[Any]


class Wire:
    """Pipelined raw commands on connections of ``client``'s pool.

    Args:
        client: The client whose pool (server, credentials, timeouts) is used.
        load_scripts: Called once when Redis answers ``NOSCRIPT`` (it restarted or was
            flushed): it must load every script; the refused commands are then resent
            (a refused ``EVALSHA`` ran nothing, so resending it is safe).
    """

    def __init__(self, client: redis.Redis, load_scripts: Any) -> None:
        pool = client.connection_pool
        # As many connections as the client's pool may hold, waited for as long as it waits:
        # a process with more threads than that shares them instead of opening one per thread.
        self._idle = IdleConnections(
            lambda: own_connection(pool),
            limit=getattr(pool, "max_connections", None),
            wait_s=getattr(pool, "timeout", None) or 60.0,
        )
        self._load_scripts = load_scripts

    def execute(self, commands: Sequence[Command]) -> list[Any]:
        """Send ``commands`` in one write; their replies in order (errors as exception objects).

        Raises:
            redis.ConnectionError: the connection broke (it is dropped; nothing is retried).
            redis.TimeoutError: no reply within the socket timeout (Redis stalled; dropped too).
        """
        return self._resend_refused(commands, self._round_trip(commands))

    def begin(self) -> Sending:
        """A round trip written in parts while the caller prepares the next (see :class:`Sending`)."""
        return Sending(self)

    def _resend_refused(self, commands: Sequence[Command], replies: list[Any]) -> list[Any]:
        """``replies``, with those of the commands Redis refused with ``NOSCRIPT`` (it restarted
        or was flushed) replaced by their replies once every script is loaded again."""
        refused = [i for i, r in enumerate(replies) if isinstance(r, rexc.NoScriptError)]
        if refused:
            self._load_scripts()
            for i, reply in zip(refused, self._round_trip([commands[i] for i in refused]), strict=True):
                replies[i] = reply
        return replies

    def close(self) -> None:
        """Disconnect the idle connections (the store is closing; a later call opens new ones)."""
        self._idle.close()

    def execute_then_transactions(
        self, commands: Sequence[Command], batches: Sequence[Sequence[Command]]
    ) -> tuple[list[Any], list[list[Any]]]:
        """:meth:`execute` ``commands``, then each batch inside MULTI/EXEC, in one write: the
        commands' replies, and each transaction's every reply (for :func:`transaction_result`)."""
        units = [[("MULTI",), *batch, ("EXEC",)] for batch in batches]
        replies = self.execute([*commands, *(c for unit in units for c in unit)])
        out, at = [], len(commands)
        for unit in units:
            out.append(replies[at : at + len(unit)])
            at += len(unit)
        return replies[: len(commands)], out

    def transaction(self, commands: Sequence[Command]) -> list[Any]:
        """``commands`` inside MULTI/EXEC (one atomic read or write); their replies in order.

        Raises:
            redis.ResponseError: the first command Redis refused (e.g. WRONGTYPE on a
                foreign key, or OOM at ``maxmemory``: the transaction ran nothing), as
                redis-py's pipelines do. Redis being unavailable for now (BUSY, LOADING,
                OOM, EXECABORT, a timeout) is told apart by
                :func:`~durable.store.connect.is_transient`.
        """
        return transaction_result(self._round_trip([("MULTI",), *commands, ("EXEC",)]))

    def transactions(self, batches: Sequence[Sequence[Command]]) -> list[list[Any]]:
        """Several :meth:`transaction` s in one write (each atomic on its own); their replies."""
        units = [[("MULTI",), *batch, ("EXEC",)] for batch in batches]
        replies = self._round_trip([c for unit in units for c in unit])
        out, at = [], 0
        for unit in units:
            out.append(transaction_result(replies[at : at + len(unit)]))
            at += len(unit)
        return out

    def _round_trip(self, commands: Sequence[Command]) -> list[Any]:
        conn = self._idle.take()
        try:
            conn.send_packed_command([pack(commands)])
            replies = read_replies(conn, len(commands))
        except BaseException:
            # Replies may be left unread on the socket: never hand it to the next caller.
            conn.disconnect()  # reconnects on its next send
            raise
        finally:
            self._idle.give(conn)
        return replies


class Sending:
    """One round trip whose commands are written part by part (:meth:`send`) and whose replies
    are read once, after the last part (:meth:`replies`).

    A worker decides tens of runs per pass, then commits them together. Sent as each few are
    decided, the first commits run in Redis while the worker decides the rest, instead of Redis
    and the worker taking turns (on 2 cores, both waited on each other about half the time).

    A Redis error (the connection broke, no reply in time) never raises here: every command of
    the round trip gets it as its reply, as :meth:`Wire.execute`'s callers treat a failed batch
    (those written before the failure may have run: the commit scripts check what they apply).
    """

    def __init__(self, wire: Wire) -> None:
        self._wire = wire
        self._conn: Any = None
        self._commands: list[Command] = []
        self._error: redis.RedisError | None = None

    def send(self, commands: Sequence[Command]) -> None:
        """Write ``commands`` now; their replies come with :meth:`replies`."""
        self._commands += commands
        if self._error is not None or not commands:
            return
        try:
            if self._conn is None:
                self._conn = self._wire._idle.take()
            self._conn.send_packed_command([pack(commands)])
        except redis.RedisError as exc:
            self._fail(exc)
        except BaseException:
            self._fail(None)
            raise

    def replies(self) -> list[Any]:
        """Every sent command's reply, in order (errors as exception objects)."""
        replies: list[Any] = []
        if self._error is None and self._conn is not None:
            try:
                replies = read_replies(self._conn, len(self._commands))
            except redis.RedisError as exc:
                self._fail(exc)
            except BaseException:
                self._fail(None)
                raise
            else:
                self._wire._idle.give(self._conn)
                self._conn = None
        if self._error is None:
            try:
                return self._wire._resend_refused(self._commands, replies)
            except redis.RedisError as exc:  # the resend's round trip failed: as a failed batch
                self._error = exc
        return [self._error] * len(self._commands)

    def _fail(self, exc: redis.RedisError | None) -> None:
        self._error = exc or rexc.ConnectionError("the round trip was interrupted")
        if self._conn is not None:
            # Replies may be left unread on the socket: never hand it to the next caller.
            self._conn.disconnect()  # reconnects on its next send
            self._wire._idle.give(self._conn)
            self._conn = None


class Deferred:
    """:class:`Sending`'s interface for a wire that writes a round trip at once (a cluster's,
    one write per node): the parts are kept, then executed together by :meth:`replies`."""

    def __init__(self, execute: Callable[[Sequence[Command]], list[Any]]) -> None:
        self._execute = execute
        self._commands: list[Command] = []

    def send(self, commands: Sequence[Command]) -> None:
        """Keep ``commands`` for :meth:`replies`."""
        self._commands += commands

    def replies(self) -> list[Any]:
        """Every command's reply, in order; a Redis error as every command's reply."""
        try:
            return self._execute(self._commands) if self._commands else []
        except redis.RedisError as exc:
            return [exc] * len(self._commands)


class IdleConnections:
    """One server's connections between round trips: a lock-free stack (list append and pop
    are atomic) of (connection, when given back).

    A pool's checkout (a queue, a lock, a ``poll()`` per checkout, its bookkeeping) cost the
    worker more CPU per round trip than reading the replies. The connections are made by
    the pool (``make``: its server, credentials and timeouts) but never checked out of it: a
    ``BlockingConnectionPool`` lists them and disconnects them with its own, a cluster node's
    pool does not, so :meth:`close` does (else a connection closes when dropped, by redis-py's
    ``__del__``). A forked child starts with none.

    Args:
        make: Makes a new connection (it connects on its first send).
        limit: The most connections taken at once (``None``: no limit); one more
            :meth:`take` waits for a :meth:`give`.
        wait_s: How long such a take waits before ``redis.ConnectionError``.
    """

    def __init__(self, make: Any, *, limit: int | None = None, wait_s: float = 60.0) -> None:
        self._make = make
        self._limit, self._wait_s = limit, wait_s
        self._slots = threading.BoundedSemaphore(limit) if limit else None
        self._stack: list[tuple[Any, float]] = []
        self._pid = os.getpid()

    def take(self) -> Any:
        """An idle connection (checked first if idle a while), or a new one."""
        if self._pid != os.getpid():
            self._stack, self._pid = [], os.getpid()
            self._slots = threading.BoundedSemaphore(self._limit) if self._limit else None
        if self._slots is not None and not self._slots.acquire(timeout=self._wait_s):
            raise rexc.ConnectionError(
                f"no Redis connection free within {self._wait_s:g} s: this process's {self._limit} "
                "are all in use (more threads wait on Redis than its pool holds)"
            )
        try:
            try:
                conn, idle_since = self._stack.pop()
            except IndexError:
                return self._make()
            if time.monotonic() - idle_since > CHECK_IDLE_S:
                _check(conn)
            return conn
        except BaseException:
            if self._slots is not None:
                self._slots.release()
            raise

    def give(self, conn: Any) -> None:
        """Keep ``conn`` for the next round trip (a broken one was disconnected: it reconnects)."""
        self._stack.append((conn, time.monotonic()))
        if self._slots is not None:
            self._slots.release()

    def close(self) -> None:
        """Disconnect the idle connections (one taken now is kept by its round trip, and then
        given back: it reconnects if used again)."""
        while self._stack:
            try:
                conn, _ = self._stack.pop()
            except IndexError:
                return
            conn.disconnect()


def pack(commands: Sequence[Command]) -> bytes:
    """``commands`` in Redis's wire format, ready for one write."""
    return b"".join([hiredis.pack_command(tuple(c)) for c in commands])


def read_replies(conn: Any, n: int) -> list[Any]:
    """The next ``n`` replies on ``conn``, raw; error replies as exception objects in their place."""
    replies: list[Any] = []
    for _ in range(n):
        try:
            replies.append(conn.read_response())
        except rexc.ResponseError as exc:
            replies.append(exc)
    return replies


def transaction_result(replies: Sequence[Any]) -> list[Any]:
    """The replies of the commands of one ``MULTI ... EXEC`` given every reply of it (MULTI's,
    the queued ones, EXEC's); raises the first command Redis refused (see :meth:`Wire.transaction`)."""
    result = replies[-1]
    if isinstance(result, Exception):
        # EXECABORT: Redis refused a command as it was queued (OOM, a busy script, MOVED...)
        # and ran none; the refusal says why, and is what callers classify (as redis-py does).
        queued = [r for r in replies[1:-1] if isinstance(r, Exception)]
        raise queued[0] if isinstance(result, rexc.ExecAbortError) and queued else result
    if result is None:  # pragma: no cover - no WATCH is ever used
        raise rexc.WatchError("transaction aborted")
    for reply in result:
        if isinstance(reply, Exception):
            raise reply
    return list(result)


CHECK_IDLE_S = 0.002
"""A connection idle longer than this is checked before use, as the pool checks each: Redis
closed it meanwhile (a restart), so the round trip goes to a new connection instead of
failing. Busy connections skip the check (a syscall per round trip)."""


def _check(conn: Any) -> None:
    sock = conn._get_socket()
    if sock is not None and select.select([sock], [], [], 0)[0]:
        conn.disconnect()  # closed by Redis (or unread data): reconnects on its next send


def pairs(flat: Sequence[Any]) -> dict[Any, Any]:
    """A flat ``[field, value, ...]`` reply (HGETALL, a stream entry's fields) as a dict."""
    it = iter(flat)
    return dict(zip(it, it, strict=True))


def stream_rows(reply: Sequence[Any] | None) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """A raw XRANGE reply as redis-py shapes it: ``[(entry id, {field: value})]``."""
    return [(entry_id, pairs(fields)) for entry_id, fields in reply or ()]
