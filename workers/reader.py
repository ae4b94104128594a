"""The worker's blocking task read, which a local event can interrupt.

A worker blocks on one ``XREADGROUP ... BLOCK`` over all its task streams, so
it costs nothing while idle. But results of activities it runs itself (eager
mode, local activities) and tasks its scheduler reclaimed arrive from other
threads of the same process, and a blocked Redis call cannot be woken from
inside the process (a short BLOCK does not help: Redis 6.2 checks blocking
timeouts on its 100 ms cron).

So the read is sent on a dedicated connection and left outstanding; the
worker waits with ``select()`` on that socket *and* a local pipe. A wake-up
returns at once with the read still in flight; its reply is picked up on a
later call. At most one read is outstanding at a time.
"""

from __future__ import annotations

import os
import select
from typing import Any

import redis

from durable.store.keys import GROUP


class TaskReader:
    """One outstanding ``XREADGROUP`` on its own connection, interruptible by :meth:`wake`."""

    def __init__(self, client: redis.Redis, consumer: str) -> None:
        self._client = client
        self._consumer = consumer
        self._conn: Any = None
        self._outstanding = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    @property
    def outstanding(self) -> bool:
        """True while a sent read has not been answered yet."""
        return self._outstanding

    def wake(self) -> None:
        """Interrupt a waiting :meth:`read` (thread-safe, never blocks)."""
        try:
            os.write(self._wake_w, b"!")
        except OSError:
            pass  # the pipe is full of wake-ups already, or the reader is closed

    def read(self, streams: list[str], *, count: int, block_ms: int, wait: bool = True) -> list[Any] | None:
        """The reply of a ``XREADGROUP`` over ``streams`` (``[]`` when it timed out), or
        ``None`` when woken (or, with ``wait=False``, when no reply is there yet).

        ``streams``/``count`` apply when a new read is sent; an outstanding one
        keeps what it was sent with.
        """
        conn = self._connection()
        try:
            if not self._outstanding:
                args: list[Any] = ["XREADGROUP", "GROUP", GROUP, self._consumer, "COUNT", count]
                args += ["BLOCK", block_ms, "STREAMS", *streams, *([">"] * len(streams))]
                conn.send_command(*args)
                self._outstanding = True
            if not conn.can_read(timeout=0):
                if not wait:
                    return None
                sock = conn._get_socket()
                # Redis answers a BLOCK read within block_ms (+ its cron tick); much later
                # means the connection is gone.
                ready, _, _ = select.select([sock, self._wake_r], [], [], block_ms / 1000 + 5)
                if self._wake_r in ready:
                    self._drain()
                if not ready:
                    raise redis.ConnectionError("no reply to a blocking read within its timeout")
                if not conn.can_read(timeout=0):
                    return None
            reply = self._client.parse_response(conn, "XREADGROUP")
            self._outstanding = False
            return list(reply or [])
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            self._reset()
            raise

    def close(self) -> None:
        """Drop the connection (an outstanding read's entries stay pending for reclaim)."""
        self._reset()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _connection(self) -> Any:
        if self._conn is None:
            self._conn = self._client.connection_pool.make_connection()
        return self._conn

    def _reset(self) -> None:
        if self._conn is not None:
            try:
                self._conn.disconnect()
            except Exception:  # noqa: BLE001 - already broken
                pass
        self._conn = None
        self._outstanding = False

    def _drain(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
