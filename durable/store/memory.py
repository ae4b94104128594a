"""Redis at ``maxmemory``: how full it is, whether it refuses writes, and saying so once.

With ``maxmemory`` reached under the ``noeviction`` policy, Redis still answers reads but
refuses every write that may allocate (``OOM command not allowed when used memory >
'maxmemory'``): no run can make progress, and the workers' registry heartbeats cannot be
written, so they look gone. The operator surface must say that rather than "no live
worker": :meth:`MemoryStore.memory_state` reads ``INFO memory`` (a read, which works under
OOM) and, near the limit, confirms with a tiny write probe. A worker reports the episode
once (:class:`OomEpisode`), naming the remedies, and keeps working.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis.exceptions as rexc

from .base import StoreBase

__all__ = ["REDIS_OOM", "MemoryState", "MemoryStore", "OomEpisode", "is_oom", "oom_reason"]

REDIS_OOM = "redis_out_of_memory"
"""The blocked kind of an open run while Redis refuses writes for ``maxmemory``."""

REMEDY = (
    "raise maxmemory (CONFIG SET maxmemory / redis.conf), purge old closed runs "
    "(`durable purge`), and check the runs' retention"
)
"""What an operator can do about it (said in logs and by ``describe``/``workers``/``/healthz``)."""

PROBE_FROM = 0.9
"""From this fraction of ``maxmemory`` used, a write probe confirms whether writes are refused
(``used_memory`` alone is approximate: Redis leaves replication and AOF buffers out)."""

HEADROOM = 1024 * 1024
"""Under ``noeviction``, Redis this close to ``maxmemory`` (at most 1% of it) counts as full: it
refuses a write as soon as one lands it over the limit, and while freed bytes (an expired
key, a closed client) let a tiny write through now and then, a run's history append does not."""

PROBE_TTL_MS = 1000
"""The probe key's time to live (it is deleted at once anyway)."""


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing a write for ``maxmemory`` (``OutOfMemoryError``, or a
    reply error whose code is ``OOM``: a pipeline's or a Lua script's carries it in its text)."""
    if isinstance(exc, rexc.OutOfMemoryError):
        return True
    if not isinstance(exc, rexc.ResponseError):
        return False
    message = str(exc)
    return message.startswith("OOM") or "-OOM " in message or "caused error: OOM" in message


def _size(n: int) -> str:
    """``n`` bytes for a person (``1.5 MiB``)."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"


def oom_reason(used: int, maxmemory: int) -> str:
    """The operator's sentence for Redis refusing writes (it starts with ``Redis is out of memory``)."""
    return (
        f"Redis is out of memory (used {_size(used)} of maxmemory {_size(maxmemory)}): writes are "
        f"refused, so no run can make progress; {REMEDY}"
    )


@dataclass(frozen=True)
class MemoryState:
    """How full Redis is (on a cluster: its fullest primary).

    Attributes:
        used: ``used_memory``, in bytes.
        maxmemory: ``maxmemory``, in bytes (``0``: no limit).
        policy: ``maxmemory_policy`` (``noeviction`` refuses writes at the limit; the others
            evict keys, durable's included).
        refused: Whether Redis refuses writes for lack of memory now: under ``noeviction``,
            what it counts is within :data:`HEADROOM` of ``maxmemory``, or a write probe
            answered OOM.
        node: Which server it is (``""`` on one Redis).
    """

    used: int
    maxmemory: int
    policy: str = ""
    refused: bool = False
    node: str = ""

    @property
    def reason(self) -> str | None:
        """The operator's sentence while writes are refused (:func:`oom_reason`), else ``None``."""
        if not self.refused:
            return None
        reason = oom_reason(self.used, self.maxmemory)
        return f"{reason} (node {self.node})" if self.node else reason

    def to_dict(self) -> dict[str, Any]:
        """As JSON: ``used``, ``maxmemory``, ``policy``, ``refused``, ``reason``."""
        return {
            "used": self.used,
            "maxmemory": self.maxmemory,
            "policy": self.policy,
            "refused": self.refused,
            "reason": self.reason,
        }


class MemoryStore(StoreBase):
    """Reading how full Redis is (:meth:`memory_state`)."""

    def memory_state(self, *, probe: bool = True) -> MemoryState:
        """``INFO memory`` of the server (the fullest primary on a cluster), and whether it
        refuses writes now.

        Args:
            probe: Near the limit (:data:`PROBE_FROM`), also try a tiny write (a key with a
                1 s time to live, deleted at once): under an eviction policy that finds no key
                to evict, it is refused too (not on a cluster).
        """
        try:
            infos = self._memory_infos()
        except rexc.NoPermissionError:
            # An ACL user without INFO (`-@dangerous`, docs/security.md): the limit is unknown,
            # so nothing is said about it (the views fall back to what the registry shows).
            return MemoryState(0, 0)
        states = [self._node_memory(name, info) for name, info in infos]
        state = max(states, key=lambda s: (s.refused, s.used / s.maxmemory if s.maxmemory else 0.0))
        if state.refused or not state.maxmemory or state.used < state.maxmemory * PROBE_FROM:
            return state
        if probe and not self.cluster:
            return MemoryState(state.used, state.maxmemory, state.policy, self._write_refused(), state.node)
        return state

    def _memory_infos(self) -> list[tuple[str, dict[str, Any]]]:
        if not self.cluster:
            return [("", dict(self.redis.info("memory")))]
        rc: Any = self.redis
        return [
            (str(node.name), dict(rc.get_redis_connection(node).info("memory")))
            for node in rc.get_primaries()
        ]

    @staticmethod
    def _node_memory(name: str, info: dict[str, Any]) -> MemoryState:
        used, maxmemory = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
        # Redis leaves these buffers out when it compares with maxmemory.
        counted = used - int(info.get("mem_not_counted_for_evict", 0))
        policy = str(info.get("maxmemory_policy", ""))
        headroom = min(HEADROOM, maxmemory // 100)
        refused = bool(maxmemory) and counted >= maxmemory - headroom and policy == "noeviction"
        return MemoryState(used, maxmemory, policy, refused, name)

    def _write_refused(self) -> bool:
        key = f"{self.keys.prefix}:memory-probe"
        try:
            self.redis.set(key, b"1", px=PROBE_TTL_MS)
        except rexc.ResponseError as exc:
            if is_oom(exc):
                return True
            raise
        self.redis.delete(key)
        return False


class OomEpisode:
    """A worker's view of Redis refusing its writes for ``maxmemory`` (thread-safe).

    :meth:`failed` on every error (an OOM one starts the episode, logged once as an ERROR
    naming the remedies); :meth:`wrote` after a write that succeeded ends it (an INFO line
    with its duration). While :attr:`active`, the worker takes nothing as abandoned: its own
    lease and heartbeat writes were refused, not its work stopped.

    Args:
        log: Where to log.
        what: Whose writes (``"worker w-1"``).
    """

    def __init__(self, log: logging.Logger, what: str = "this worker") -> None:
        self.log = log
        self.what = what
        self._lock = threading.Lock()
        self._started: float | None = None
        self._refusals = 0

    @property
    def active(self) -> bool:
        """Whether Redis refused a write of this worker and none has succeeded since."""
        return self._started is not None

    def failed(self, exc: BaseException, doing: str = "a write") -> bool:
        """Note an error of ``doing``; returns whether it was an OOM refusal (logged once per episode)."""
        if not is_oom(exc):
            return False
        with self._lock:
            first = self._started is None
            if first:
                self._started = time.monotonic()
                self._refusals = 0
            self._refusals += 1
        if first:
            self.log.error(
                "Redis is out of memory: it refused %s of %s (%s). Redis has reached its maxmemory "
                "and refuses writes (noeviction): no run can make progress until memory is freed; "
                "%s. This worker keeps running and retries; its registry heartbeat cannot be "
                "written meanwhile, so `durable workers` may not list it.",
                doing,
                self.what,
                (str(exc).splitlines() or [""])[0][:200],
                REMEDY,
            )
        return True

    def wrote(self) -> None:
        """Note a write that succeeded: ends the episode, logging how long it lasted."""
        if self._started is None:
            return
        with self._lock:
            started, refusals = self._started, self._refusals
            self._started = None
        if started is not None:
            self.log.info(
                "Redis accepts writes again: %s was refused for %.1f s (%d refused writes)",
                self.what,
                time.monotonic() - started,
                refusals,
            )
