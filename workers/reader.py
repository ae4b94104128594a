"""The worker's blocking task reads, which a local event can interrupt.

A worker blocks on ``XREADGROUP ... BLOCK`` over its task streams, so it costs
nothing while idle. But results of activities it runs itself (eager mode,
local activities) and tasks its scheduler reclaimed arrive from other threads
of the same process, and a blocked Redis call cannot be woken from inside the
process (a short BLOCK does not help: Redis 6.2 checks blocking timeouts on its
100 ms cron).

So each read is sent on a dedicated connection and left outstanding; the
worker waits with ``select()`` on those sockets *and* a local pipe. A wake-up
returns at once with the reads still in flight; their replies are picked up on
a later call.

Streams are read in **lanes**, each with its own batch size and its own
outstanding read: the worker reads workflow tasks in large batches, but only as
many activity tasks as it has free threads, and stops asking for activity tasks
while its threads are busy, without holding up its workflow tasks meanwhile.

On one Redis each lane is a single ``XREADGROUP`` over its streams. On
a Redis Cluster a read over streams of several partitions is a CROSSSLOT error,
so streams are split into one group per partition, each with its own
outstanding read on a connection to the node owning that partition's slot; all
of them and the wake pipe are waited on in the same ``select()``. At most one
read is outstanding per group. A MOVED/ASK reply or a lost node drops every
connection (their delivered entries stay pending and are reclaimed) and the
caller retries after a pause; the next read reconnects along the new slot map. An ASK or
TRYAGAIN (the slot is being migrated, its keys on two nodes) concerns only that partition: it is
left out of the reads for a while, the others go on.

What speaks Redis -- the ``XREADGROUP`` command, its connection, the reply's
shape, which errors mean a lost connection or a moved slot -- is
:class:`durable.store.reads.GroupRead`, opened by the store. This module keeps
the lanes, the wake-up pipe and the ``select()``: they exist for the worker's
threads (a wake-up comes from an activity thread or the scheduler), not for
Redis, and the worker's loop is the only caller.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from durable.store.connect import is_slot_migrating
from durable.store.reads import CONNECTION_FAILURES, SLOT_MOVES, GroupRead, ReadLost, Reply

log = logging.getLogger("durable.worker")

MIGRATING_HOLD_S = 5.0
"""How long a read group (a partition) whose slot is being migrated is left out of the reads."""


class TaskReader:
    """Outstanding ``XREADGROUP`` reads on their own connections, interruptible by :meth:`wake`.

    Args:
        open_read: Opens the connection of a read group (the store's ``open_read``).
        consumer: The consumer name in every group.
        group_of: Maps a stream to its read group (the store's ``read_group``: on a
            cluster its partition; on one Redis ``None``, a single read over every stream).
        on_moved: Called after the connections were dropped because the cluster's slot map
            changed or a node went away (e.g. to refresh the cluster client's slot map).
        on_migrating: Called with a read group (a partition) and the error when its slot is
            being migrated (to say so).
    """

    def __init__(
        self,
        open_read: Callable[[Hashable], GroupRead],
        consumer: str,
        *,
        group_of: Callable[[str], Hashable] = lambda _stream: None,
        on_moved: Callable[[], None] | None = None,
        on_migrating: Callable[[Any, BaseException], None] = lambda _group, _exc: None,
    ) -> None:
        self._open_read = open_read
        self._consumer = consumer
        self._group_of = group_of
        self._on_moved = on_moved
        self._on_migrating = on_migrating
        self._held: dict[Hashable, float] = {}  # read groups whose slot is migrating -> until when
        self._reads: dict[tuple[str, Hashable], GroupRead] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # A wake-up byte is in the pipe and not drained yet: one is enough, so the threads
        # handing results over skip the write (and the reader's extra wake-up) meanwhile.
        self._woken = False
        # Once closed, the pipe's descriptor numbers go to whatever is opened next (a Redis
        # socket): a late wake-up written there would garble that connection's commands.
        self._pipe_lock = threading.Lock()
        self._closed = False

    @property
    def outstanding(self) -> bool:
        """True while a sent read has not been answered yet."""
        return any(r.outstanding for r in self._reads.values())

    def wake(self) -> None:
        """Interrupt a waiting :meth:`read` (thread-safe, never blocks). Callers change what
        the reader's owner will look at first, then wake it: a wake-up skipped because one is
        pending is drained after that change, so the owner sees it."""
        if self._woken:
            return
        self._woken = True
        with self._pipe_lock:
            if self._closed:
                return
            try:
                os.write(self._wake_w, b"!")
            except OSError:
                pass  # the pipe is full of wake-ups already

    def read(
        self, lanes: Mapping[str, tuple[list[str], int]], *, block_ms: int, wait: bool = True
    ) -> list[tuple[str, Reply]] | None:
        """The tasks delivered to reads over the streams of ``lanes`` (``{lane: (streams,
        count per stream)}``) as ``[(lane, reply)]`` (``[]`` when the reads timed out), or
        ``None`` when woken (or, with ``wait=False``, when no reply is there yet).

        A lane with no outstanding read is sent one; an outstanding read keeps the streams
        and count it was sent with, and its reply is collected even when its lane is no
        longer asked for.
        """
        try:
            for lane, (streams, count) in lanes.items():
                self._send(lane, streams, count, block_ms)
            ready = self._answered()
            if not ready:
                if not wait:
                    return None
                ready = self._wait()
                if not ready:
                    return None
            return [(key[0], reply) for key in ready if (reply := self._reply(key)) is not None]
        except CONNECTION_FAILURES as exc:
            self._reset(moved=True)
            if isinstance(exc, OSError) and not isinstance(exc, TimeoutError | ConnectionError):
                # A socket error redis-py did not wrap (select() on a dropped socket): say
                # what it is, a lost read connection, so the loop retries instead of stopping.
                raise ReadLost(f"task read connection failed: {exc}") from exc
            raise
        except SLOT_MOVES as exc:
            log.warning(
                "task read: the cluster's slot map changed (%s); dropping %d read connection(s) and "
                "reconnecting along the new map (their delivered tasks stay pending and are reclaimed)",
                str(exc).splitlines()[0][:200],
                len(self._reads),
            )
            self._reset(moved=True)
            raise ReadLost(f"cluster reconfigured: {exc}") from exc

    def _reply(self, key: tuple[str, Hashable]) -> Reply | None:
        """The reply of read ``key``; ``None`` when its slot is being migrated (a cluster's ASK or
        TRYAGAIN: its keys are on two nodes): that group is left out for :data:`MIGRATING_HOLD_S`,
        the other groups' reads go on (a slot left half-migrated stalled every partition)."""
        try:
            return self._reads[key].reply()
        except SLOT_MOVES as exc:
            if not is_slot_migrating(exc):
                raise
            self._held[key[1]] = time.monotonic() + MIGRATING_HOLD_S
            self._on_migrating(key[1], exc)
            return None

    def _send(self, lane: str, streams: list[str], count: int, block_ms: int) -> None:
        groups: dict[Hashable, list[str]] = {}
        for stream in streams:
            groups.setdefault(self._group_of(stream), []).append(stream)
        now = time.monotonic()
        for group, members in groups.items():
            if self._held.get(group, 0.0) > now:
                continue  # its slot is being migrated: tried again after the hold
            r = self._reads.get((lane, group))
            if r is None:
                r = self._reads[(lane, group)] = self._open_read(group)
            if not r.outstanding:
                r.send(self._consumer, members, count, block_ms)

    def _answered(self) -> list[tuple[str, Hashable]]:
        """The outstanding reads whose reply has begun to arrive (one ``select()`` for all:
        a read's reply is the only thing its connection receives)."""
        waiting = {r.socket(): key for key, r in self._reads.items() if r.outstanding}
        if not waiting:
            return []
        readable, _, _ = select.select(list(waiting), [], [], 0)
        return [waiting[sock] for sock in readable]

    def _wait(self) -> list[tuple[str, Hashable]]:
        waiting = {key: r for key, r in self._reads.items() if r.outstanding}
        if not waiting:
            return []
        socks = {r.socket(): key for key, r in waiting.items()}
        timeout = max(0.0, min(r.deadline for r in waiting.values()) - time.monotonic())
        readable, _, _ = select.select([*socks, self._wake_r], [], [], timeout)
        if self._wake_r in readable:
            self._drain()
        ready = [socks[sock] for sock in readable if sock in socks]
        late = not ready and not readable and any(time.monotonic() >= r.deadline for r in waiting.values())
        if late:
            raise ReadLost("no reply to a blocking read within its timeout")
        return ready

    def unblock(self) -> None:
        """End the outstanding reads now rather than at their timeout (the worker is stopping:
        it takes no new tasks, and the tasks they were delivered still come in their replies)."""
        for r in self._reads.values():
            r.unblock()

    def drop(self) -> None:
        """Drop the outstanding reads (their delivered entries stay pending); the next
        :meth:`read` opens new ones."""
        self._reset()

    def close(self) -> None:
        """Drop the connections (an outstanding read's entries stay pending for reclaim)."""
        self._reset()
        with self._pipe_lock:
            if self._closed:
                return
            self._closed = True
            for fd in (self._wake_r, self._wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _reset(self, moved: bool = False) -> None:
        for r in self._reads.values():
            r.close()
        self._reads.clear()
        if moved and self._on_moved is not None:
            try:
                self._on_moved()
            except Exception:  # noqa: BLE001 - the next read tries again
                log.exception("could not refresh the cluster slot map")

    def _drain(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        # Only now: a wake-up skipped before this line was for a change made before it (seen
        # by the owner's next look); one after it writes again. Reset before the read, a
        # byte written in between would be drained with the flag left set: wake-ups lost.
        self._woken = False
