"""Blocking task reads: one ``XREADGROUP`` left outstanding on a dedicated connection.

The worker's reader (``workers/reader.py``) waits on several such reads and on
a wake-up pipe at once, with ``select()``. The split is by what each side
knows: this module speaks Redis (the command, its connection and socket, the
reply's shape, which errors mean the connection or the cluster's slot map is
gone); the worker side owns the lanes, the wake-up pipe and the waiting, which
are about the worker's threads, not about Redis.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from redis import exceptions as rexc

from .connect import own_connection
from .keys import GROUP

#: The read's connection (or its node) is gone: drop every read connection and retry.
CONNECTION_FAILURES: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError, OSError)

#: The cluster's slot map changed under a read (AskError covers MOVED).
SLOT_MOVES: tuple[type[BaseException], ...] = (rexc.AskError, rexc.TryAgainError, rexc.ClusterDownError)

#: What a reader raises after dropping its connections (callers pause and retry).
ReadLost = redis.ConnectionError

Reply = list[tuple[str, list[tuple[str, dict[bytes, bytes]]]]]
"""``[(stream, [(entry id, fields)])]``: the tasks one read delivered."""


class GroupRead:
    """One connection for ``XREADGROUP`` reads, at most one outstanding at a time.

    Args:
        client: The client whose server (a cluster: the node owning the streams' slot)
            the connection goes to.
    """

    __slots__ = ("client", "conn", "outstanding", "deadline", "client_id", "__weakref__")

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.conn: Any = own_connection(client.connection_pool)
        self.outstanding = False
        self.deadline = 0.0
        self.client_id: int | None = None  # the connection's CLIENT ID, for :meth:`unblock`
        self.conn.register_connect_callback(self._identify)  # (held as a weak reference)

    def _identify(self, conn: Any) -> None:
        """Learn the connection's CLIENT ID each time it (re)connects: a round trip of its own."""
        conn.send_command("CLIENT", "ID")
        try:
            self.client_id = int(conn.read_response())
        except rexc.ResponseError:  # an ACL without CLIENT (docs/security.md's recipe)
            self.client_id = None

    def send(self, consumer: str, streams: list[str], count: int, block_ms: int) -> None:
        """Send a read of up to ``count`` new tasks per stream, blocking up to ``block_ms``."""
        args: list[Any] = ["XREADGROUP", "GROUP", GROUP, consumer, "COUNT", count]
        args += ["BLOCK", block_ms, "STREAMS", *streams, *([">"] * len(streams))]
        self.conn.send_command(*args)
        self.outstanding = True
        # Redis answers a BLOCK read within block_ms (+ its cron tick); much later means
        # the connection (or the node) is gone.
        self.deadline = time.monotonic() + block_ms / 1000 + 5

    def ready(self) -> bool:
        """Whether the outstanding read's reply has arrived."""
        return self.outstanding and bool(self.conn.can_read(timeout=0))

    def socket(self) -> Any:
        """The connection's socket, to wait on with ``select()``."""
        return self.conn._get_socket()

    def reply(self) -> Reply:
        """The outstanding read's reply (``[]``: it timed out); the connection is free again."""
        try:
            raw = self.client.parse_response(self.conn, "XREADGROUP")
        finally:
            # Answered, if only with an error (NOGROUP): the connection is free again.
            self.outstanding = False
        return [
            (_text(stream), [(_text(entry_id), fields) for entry_id, fields in entries])
            for stream, entries in raw or ()
        ]

    def unblock(self) -> None:
        """End the outstanding read now, as if its BLOCK had timed out, with ``CLIENT UNBLOCK``
        sent on another connection (a stopping worker takes no new task meanwhile); tasks it was
        delivered before still come in its reply. Best effort: where Redis refuses (an ACL
        user without CLIENT), the read ends at its timeout, as it did without this."""
        if not self.outstanding or self.client_id is None:
            return
        try:
            self.client.client_unblock(self.client_id)
        except redis.RedisError:
            pass

    def close(self) -> None:
        """Drop the connection (an outstanding read's entries stay pending for reclaim).

        An outstanding read is ended on the server first (``CLIENT KILL ID``, on another
        connection): Redis sees a closed socket only at its next turn, and a task added
        meanwhile (the take-back after an outage puts the tasks back) was delivered to the dead
        read, pending for this worker until a reclaim after ``--claim-idle``. Best effort."""
        if self.outstanding and self.client_id is not None:
            try:
                self.client.execute_command("CLIENT", "KILL", "ID", self.client_id)
            except Exception:  # noqa: BLE001, S110 - Redis away, no such client, an ACL without CLIENT
                pass
        try:
            self.conn.disconnect()
        except Exception:  # noqa: BLE001 - already broken
            pass
        self.outstanding = False


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def unread(length: Any, groups: Any) -> int:
    """A task stream's entries no worker has read yet, from its ``XLEN`` and ``XINFO GROUPS``
    replies (errors for a stream or group that does not exist): its length less the pending
    entries of the workers' group (acknowledged tasks are deleted)."""
    if not isinstance(length, int):
        return 0
    if not isinstance(groups, list):  # no group yet (no worker ever read it): all waiting
        return length
    return max(
        0, length - sum(int(g.get("pending", 0)) for g in groups if _text(g.get("name", b"")) == GROUP)
    )
