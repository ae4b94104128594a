"""Redis refusing writes: at ``maxmemory``, or unable to persist; how full it is, and saying so once;
settings of Redis that can lose durable's data without a word (:func:`setup_hazards`).

With ``maxmemory`` reached under the ``noeviction`` policy, Redis still answers reads but
refuses every write that may allocate (``OOM command not allowed when used memory >
'maxmemory'``). When it cannot write to disk -- an RDB snapshot or an AOF write failed: a
full disk, a data directory it cannot write -- it refuses every write (``MISCONF``) until it
can again. Either way no run can make progress, and the workers' registry heartbeats cannot
be written, so they look gone. The operator surface must say that rather than "no live
worker": :meth:`MemoryStore.memory_state` reads ``INFO memory`` and ``INFO persistence``
(reads, which work meanwhile) and, when they suggest it, confirms with a tiny write probe. A
worker reports the episode once (:class:`OomEpisode`), naming the remedies, and keeps working.

The same two INFO sections say whether Redis is set up to keep what durable writes: a
``maxmemory`` with an evicting policy deletes keys (histories, queued tasks, timers) when
memory runs short, and a Redis without an append-only file loses every write since its last
snapshot when it restarts. Neither shows as an error anywhere: runs would just vanish or go
back in time. So they are said wherever Redis's state is (a worker's start, ``durable
workers``, ``/healthz``, the UI's workers page), as Sidekiq says an evicting policy at its start.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import redis.exceptions as rexc

from .base import StoreBase

__all__ = [
    "REDIS_CANNOT_PERSIST",
    "REDIS_OOM",
    "REFUSALS",
    "MemoryState",
    "MemoryStore",
    "OomEpisode",
    "Refusal",
    "disk_reason",
    "is_oom",
    "oom_reason",
    "setup_hazards",
    "write_refusal",
]

REDIS_OOM = "redis_out_of_memory"
"""The blocked kind of an open run while Redis refuses writes for ``maxmemory``."""

REDIS_CANNOT_PERSIST = "redis_cannot_persist"
"""The blocked kind of an open run while Redis refuses writes because it cannot write to disk."""

REMEDY = (
    "raise maxmemory (CONFIG SET maxmemory / redis.conf), purge old closed runs "
    "(`durable purge`), and check the runs' retention"
)
"""What an operator can do about it (said in logs and by ``describe``/``workers``/``/healthz``)."""

DISK_REMEDY = (
    "free disk space or fix Redis's data directory (the Redis log says what failed); Redis "
    "accepts writes again by itself once it can write (an RDB snapshot: its next successful BGSAVE)"
)
"""What an operator can do about Redis refusing writes because it cannot persist."""

PROBE_FROM = 0.9
"""From this fraction of ``maxmemory`` used, a write probe confirms whether writes are refused
(``used_memory`` alone is approximate: Redis leaves replication and AOF buffers out)."""

HEADROOM = 1024 * 1024
"""Under ``noeviction``, Redis this close to ``maxmemory`` (at most 1% of it) counts as full: it
refuses a write as soon as one lands it over the limit, and while freed bytes (an expired
key, a closed client) let a tiny write through now and then, a run's history append does not."""

PROBE_TTL_MS = 1000
"""The probe key's time to live (it is deleted at once anyway)."""


@dataclass(frozen=True)
class Refusal:
    """One reason Redis refuses every write, in the words the surfaces use.

    Attributes:
        kind: The blocked kind and the API's error code (:data:`REDIS_OOM`, ...).
        headline: What is wrong, in a few words (``Redis is out of memory``).
        cause: Why no run moves, for the worker's log.
        remedy: What an operator can do.
    """

    kind: str
    headline: str
    cause: str
    remedy: str


REFUSALS = {
    "oom": Refusal(
        REDIS_OOM,
        "Redis is out of memory",
        "Redis has reached its maxmemory and refuses writes (noeviction): no run can make progress "
        "until memory is freed",
        REMEDY,
    ),
    "disk": Refusal(
        REDIS_CANNOT_PERSIST,
        "Redis cannot write to disk",
        "Redis refuses every write while it cannot persist (MISCONF: a failed RDB snapshot or AOF "
        "write): no run can make progress until it can",
        DISK_REMEDY,
    ),
}
"""Per :func:`write_refusal` answer, how the surfaces say it."""


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing a write for ``maxmemory`` (``OutOfMemoryError``, or a
    reply error whose code is ``OOM``: a pipeline's or a Lua script's carries it in its text)."""
    return write_refusal(exc) == "oom"


def write_refusal(exc: BaseException) -> str | None:
    """Why Redis refused a write, if ``exc`` says it did for the whole server: ``"oom"``
    (``maxmemory``), ``"disk"`` (``MISCONF``: it cannot persist), else ``None``."""
    if isinstance(exc, rexc.OutOfMemoryError):
        return "oom"
    if not isinstance(exc, rexc.ResponseError):
        return None
    message = str(exc)
    for code, kind in (("OOM", "oom"), ("MISCONF", "disk")):
        # First (a plain reply), in a Lua script's error, or after a pipeline's prefix.
        if message.startswith(code) or f"-{code} " in message or f"caused error: {code}" in message:
            return kind
    return None


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


def disk_reason(failed: str) -> str:
    """The operator's sentence for Redis refusing writes because it cannot persist (it starts
    with ``Redis cannot write to disk``); ``failed``: what INFO says failed."""
    return (
        f"Redis cannot write to disk ({failed}): it refuses every write (MISCONF), so no run can "
        f"make progress; {DISK_REMEDY}"
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
        disk: What failed when Redis refuses writes because it cannot persist (``the last RDB
            snapshot failed``...; confirmed by a write probe answered MISCONF, except on a
            cluster), else ``""``.
        hazards: :func:`setup_hazards` of every server (on a cluster, each naming its node):
            settings that can lose durable's data, and memory nearly at ``maxmemory``.
    """

    used: int
    maxmemory: int
    policy: str = ""
    refused: bool = False
    node: str = ""
    disk: str = ""
    hazards: tuple[str, ...] = ()

    @property
    def kind(self) -> str | None:
        """:data:`REDIS_CANNOT_PERSIST` or :data:`REDIS_OOM` while writes are refused, else ``None``."""
        return REDIS_CANNOT_PERSIST if self.disk else REDIS_OOM if self.refused else None

    @property
    def reason(self) -> str | None:
        """The operator's sentence while writes are refused (:func:`disk_reason`,
        :func:`oom_reason`), else ``None``."""
        if self.disk:
            reason = disk_reason(self.disk)
        elif self.refused:
            reason = oom_reason(self.used, self.maxmemory)
        else:
            return None
        return f"{reason} (node {self.node})" if self.node else reason

    def to_dict(self) -> dict[str, Any]:
        """As JSON: ``used``, ``maxmemory``, ``policy``, ``refused``, ``disk``, ``kind``, ``reason``,
        ``hazards``."""
        return {
            "used": self.used,
            "maxmemory": self.maxmemory,
            "policy": self.policy,
            "refused": self.refused,
            "disk": self.disk,
            "kind": self.kind,
            "reason": self.reason,
            "hazards": list(self.hazards),
        }


SETTINGS_DOC = "docs/operations.md#redis-settings-durable-warns-about"


NEAR_FULL = 0.8
"""From this fraction of ``maxmemory`` used (``noeviction``), the views warn before writes stop."""


def setup_hazards(memory: dict[str, Any], persistence: dict[str, Any]) -> tuple[str, ...]:
    """What in one server's ``INFO memory`` and ``INFO persistence`` can lose durable's data or
    will soon stop every run, in the operator's words (each starts with ``Redis``): a
    ``maxmemory`` under a policy that evicts keys, no append-only file or one never fsynced
    (``appendfsync`` from ``CONFIG GET``, merged into ``persistence``), memory past
    :data:`NEAR_FULL` of ``maxmemory``. Empty when none, or when INFO does not say."""
    hazards = []
    policy = str(memory.get("maxmemory_policy", "noeviction"))
    maxmemory = int(memory.get("maxmemory", 0))
    counted = int(memory.get("used_memory", 0)) - int(memory.get("mem_not_counted_for_evict", 0))
    full_at = maxmemory - min(HEADROOM, maxmemory // 100)  # past it: refused (the views' problem)
    if maxmemory and policy == "noeviction" and maxmemory * NEAR_FULL <= counted < full_at:
        hazards.append(
            f"Redis is at {100 * counted // maxmemory}% of its maxmemory ({_size(counted)} of "
            f"{_size(maxmemory)}): at the limit it refuses writes and no run moves; {REMEDY}"
        )
    if maxmemory and policy != "noeviction":
        # volatile-* policies too: retention, leases and the worker registry have TTLs.
        hazards.append(
            f"Redis evicts keys at its maxmemory ({_size(maxmemory)}, maxmemory-policy {policy}): "
            "when memory runs short it deletes durable's histories, queued tasks and timers, and "
            "runs are lost without an error; set maxmemory-policy noeviction (CONFIG SET and "
            f"redis.conf), then durable waits at the limit instead ({SETTINGS_DOC})"
        )
    aof = str(persistence.get("aof_enabled", ""))  # "": INFO did not say
    if aof == "1" and persistence.get("appendfsync") == "no":
        hazards.append(
            "Redis leaves its append-only file to the OS to flush (appendfsync no): a power loss "
            "or kernel crash loses up to about 30 s of acknowledged writes, steps the world saw "
            f"happen; set appendfsync everysec or always (CONFIG SET and redis.conf) ({SETTINGS_DOC})"
        )
    if aof == "0":
        hazards.append(
            "Redis keeps no append-only file (appendonly no): a restart of Redis loses every write "
            "since its last RDB snapshot (every run, without one), and runs go back in time or "
            f"vanish; set appendonly yes (CONFIG SET and redis.conf) ({SETTINGS_DOC})"
        )
    return tuple(hazards)


def _config(reply: Any) -> dict[str, Any]:
    """A ``CONFIG GET`` reply as a dict; ``{}`` when it was refused (managed Redis, an ACL user
    without ``CONFIG``): what it would have said is then not said."""
    return dict(reply) if isinstance(reply, dict) else {}


def _fsync_of(node: Any) -> dict[str, Any]:
    try:
        return _config(node.config_get("appendfsync"))
    except rexc.ResponseError:
        return {}


class MemoryStore(StoreBase):
    """Reading how full Redis is (:meth:`memory_state`)."""

    def memory_state(self, *, probe: bool = True) -> MemoryState:
        """``INFO memory`` and ``INFO persistence`` of the server (the fullest primary on a
        cluster, or one that cannot persist), and whether it refuses writes now.

        Args:
            probe: When INFO suggests writes may be refused -- near the limit
                (:data:`PROBE_FROM`), or a failed RDB snapshot or AOF write, which refuse
                writes only with ``stop-writes-on-bgsave-error`` and save points, or with AOF
                on -- confirm with a tiny write (a key with a 1 s time to live, deleted at
                once; not on a cluster).
        """
        try:
            infos = self._server_infos()
        except rexc.NoPermissionError:
            # An ACL user without INFO (`-@dangerous`, docs/security.md): the limit is unknown,
            # so nothing is said about it (the views fall back to what the registry shows).
            return MemoryState(0, 0)
        states = [self._node_state(name, memory, persistence) for name, memory, persistence in infos]
        state = max(
            states, key=lambda s: (bool(s.disk), s.refused, s.used / s.maxmemory if s.maxmemory else 0.0)
        )
        state = replace(state, hazards=tuple(h for s in states for h in s.hazards))
        near = bool(state.maxmemory) and state.used >= state.maxmemory * PROBE_FROM
        if not probe or self.cluster or not (state.disk or (near and not state.refused)):
            return state
        refusal = self._write_refusal()
        return replace(
            state, refused=state.refused or refusal == "oom", disk=state.disk if refusal == "disk" else ""
        )

    def server_started(self) -> tuple[int, int] | None:
        """When the Redis server started at the latest (epoch ms, its clock: ``uptime_in_seconds``
        is whole seconds, so a moment before this one may be after the start) and how many
        seconds ago: the youngest node's on a cluster; ``None``: INFO refused or unreadable."""
        try:
            info = self.redis.info("server")
        except rexc.RedisError:
            return None
        # A cluster client answers per node ({node: info}); one Redis answers one dict.
        nodes = [v for v in info.values() if isinstance(v, dict)] if self.cluster else [info]
        starts = [
            (
                int(n["server_time_usec"]) // 1000 - int(n["uptime_in_seconds"]) * 1000,
                int(n["uptime_in_seconds"]),
            )
            for n in nodes
            if "uptime_in_seconds" in n and "server_time_usec" in n
        ]
        return max(starts) if starts else None

    def _server_infos(self) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
        """Per server (each primary on a cluster): its name, ``INFO memory``, ``INFO persistence``."""
        if not self.cluster:
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.info("memory").info("persistence").config_get("appendfsync")
                memory, persistence, fsync = pipe.execute(raise_on_error=False)
            for reply in (memory, persistence):
                if isinstance(reply, Exception):
                    raise reply
            return [("", dict(memory), {**persistence, **_config(fsync)})]
        rc: Any = self.redis
        nodes = [(str(node.name), rc.get_redis_connection(node)) for node in rc.get_primaries()]
        return [
            (name, dict(r.info("memory")), {**r.info("persistence"), **_fsync_of(r)}) for name, r in nodes
        ]

    @staticmethod
    def _node_state(name: str, info: dict[str, Any], persistence: dict[str, Any]) -> MemoryState:
        used, maxmemory = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
        # Redis leaves these buffers out when it compares with maxmemory.
        counted = used - int(info.get("mem_not_counted_for_evict", 0))
        policy = str(info.get("maxmemory_policy", ""))
        headroom = min(HEADROOM, maxmemory // 100)
        refused = bool(maxmemory) and counted >= maxmemory - headroom and policy == "noeviction"
        failed = [
            what
            for field, what in (
                ("rdb_last_bgsave_status", "its last RDB snapshot failed"),
                ("aof_last_write_status", "its last AOF write failed"),
            )
            if str(persistence.get(field, "ok")) == "err"
        ]
        hazards = tuple(f"{h} (node {name})" if name else h for h in setup_hazards(info, persistence))
        return MemoryState(used, maxmemory, policy, refused, name, " and ".join(failed), hazards)

    def _write_refusal(self) -> str | None:
        """Whether a tiny write is refused now, and why: :func:`write_refusal`'s ``"oom"`` or
        ``"disk"``, else ``None``."""
        key = f"{self.keys.prefix}:memory-probe"
        try:
            self.redis.set(key, b"1", px=PROBE_TTL_MS)
        except rexc.ResponseError as exc:
            refusal = write_refusal(exc)
            if refusal is not None:
                return refusal
            raise
        self.redis.delete(key)
        return None


SETTLE_S = 5.0
"""How long writes must go unrefused before an :class:`OomEpisode` is over."""


class OomEpisode:
    """A worker's view of Redis refusing its writes, for ``maxmemory`` or because it cannot
    persist (thread-safe).

    :meth:`failed` on every error (such a refusal starts the episode, logged once as an ERROR
    naming the remedies); :meth:`wrote` after a write that succeeded ends it (an INFO line
    with its duration) once no write was refused for :data:`SETTLE_S`: a Redis hovering at its
    ``maxmemory`` takes some writes between refusals (those that free memory, a small one as
    memory dips), which is not the end of it. While :attr:`active`, the worker takes nothing
    as abandoned: its own lease and heartbeat writes were refused, not its work stopped.

    Args:
        log: Where to log.
        what: Whose writes (``"worker w-1"``).
    """

    def __init__(self, log: logging.Logger, what: str = "this worker") -> None:
        self.log = log
        self.what = what
        self._lock = threading.Lock()
        self._started: float | None = None
        self._last_refusal = 0.0
        self._refusals = 0

    @property
    def active(self) -> bool:
        """Whether Redis refused a write of this worker and none has succeeded since."""
        return self._started is not None

    def failed(self, exc: BaseException, doing: str = "a write") -> bool:
        """Note an error of ``doing``; returns whether it was Redis refusing writes (logged once
        per episode)."""
        refusal = write_refusal(exc)
        if refusal is None:
            return False
        with self._lock:
            first = self._started is None
            if first:
                self._started = time.monotonic()
                self._refusals = 0
            self._refusals += 1
            self._last_refusal = time.monotonic()
        if first:
            said = REFUSALS[refusal]
            self.log.error(
                "%s: it refused %s of %s (%s). %s; %s. This worker keeps running and retries; its "
                "registry heartbeat cannot be written meanwhile, so `durable workers` may not list it.",
                said.headline,
                doing,
                self.what,
                (str(exc).splitlines() or [""])[0][:200],
                said.cause,
                said.remedy,
            )
        return True

    def wrote(self) -> None:
        """Note a write that succeeded: ends the episode, logging how long it lasted."""
        if self._started is None or time.monotonic() - self._last_refusal < SETTLE_S:
            return
        with self._lock:
            started, refusals, last = self._started, self._refusals, self._last_refusal
            self._started = None
        if started is not None:
            self.log.info(
                "Redis accepts writes again: %s was refused for %.1f s (%d refused writes)",
                self.what,
                last - started,
                refusals,
            )
