"""The store's connection layer: the client, the scripts, batches per server or per cluster node.

Each state change that must be atomic is one Lua script in ``lua/`` (named for
what it does). On one Redis the hot path (load, commit, complete) goes through
:class:`~durable.store.wire.Wire`'s raw pipelines; on a Redis Cluster through
:class:`~durable.store.cluster_wire.ClusterWire`'s, one write per node. The store's
feature modules (runs, activities, task queues, leases) build on :class:`StoreBase`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, TypeVar

import redis

from ..config import namespace as configured_namespace
from ..config import partitions, warn_if_shared_default
from ..errors import ConfigurationError
from ..quiet import Quiet
from .cluster_wire import ClusterWire
from .connect import (
    MIGRATING_FIX,
    Client,
    cluster_node_url,
    connect,
    is_cluster_client,
    is_slot_migrating,
    is_wrong_type,
    unsupported_server,
)
from .embedded import resolve_redis_url
from .keys import Keys
from .outage import CLIENT_RIDE_S, client_incident, ride_out
from .records import text
from .wire import Wire

T = TypeVar("T")

log = logging.getLogger("durable.store")

LOG_MAXLEN = 1000
"""Entries a run's log (its activity attempts and dropped inputs, kept beside the history)
keeps: the scripts that append to it trim it to about this many (``XADD MAXLEN ~``), so
``describe()`` shows the last ~1,000. Without a cap an activity retrying every 10 ms added
thousands of entries a minute to its open run. Reaches the scripts through
:func:`load_scripts`."""


def load_scripts() -> dict[str, str]:
    """Every script's source by name, with the shared ``_lib.lua`` prepended, and before it
    the constants the scripts share with this code (defined once, here)."""
    folder = resources.files("durable.store") / "lua"
    lib = f"local LOG_MAXLEN = {LOG_MAXLEN}\n" + (folder / "_lib.lua").read_text()
    return {
        entry.name[:-4]: lib + "\n" + entry.read_text()
        for entry in folder.iterdir()
        if entry.name.endswith(".lua") and not entry.name.startswith("_")
    }


class StoreBase:
    """The client, the key names and the scripts of one deployment (see :class:`RedisStore`)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        prefix: str | None = None,
        namespace: str | None = None,
        partitions_: int | None = None,
        client: redis.Redis | None = None,
        flush: bool = False,
        client_ride_s: float = CLIENT_RIDE_S,
    ) -> None:
        self.url = url or (None if client is not None else resolve_redis_url())
        #: How long the client calls made through this store ride out Redis being unavailable.
        self.client_ride_s = client_ride_s
        #: The outage log of those calls and of this process's waits on this store.
        self.client_outage = client_incident()
        self.redis: Client = client or connect(self.url)  # type: ignore[arg-type]
        #: True on a Redis Cluster: batches go per node, MULTI per partition (slot).
        self.cluster = is_cluster_client(self.redis)
        self.keys = Keys(configured_namespace(namespace or prefix), partitions_ or partitions())
        warn_if_shared_default(self.url, self.keys.prefix)
        self._scripts = {name: self.redis.register_script(src) for name, src in load_scripts().items()}
        # The hot path (load, commit, complete) skips redis-py's pipeline layers.
        self._wire: Wire | ClusterWire = (
            ClusterWire(self.redis, [str(s.script) for s in self._scripts.values()])
            if self.cluster
            else Wire(self.redis, self._load_all_scripts)
        )
        self._migrating_said = Quiet(60.0)  # by partition
        self._check_server()
        if flush:
            self.redis.flushdb()
        self._check_partitions()

    def skip_migrating(self, p: int, exc: BaseException) -> None:
        """Raise ``exc``, partition ``p``'s error reply, unless it says the partition's slot is
        being migrated: then say so (:meth:`partition_migrating`) and return, its work waiting."""
        if not is_slot_migrating(exc):
            raise exc
        self.partition_migrating(p, exc)

    def partition_migrating(self, p: int, exc: BaseException) -> None:
        """Say (once a minute per partition) that partition ``p``'s slot is being migrated
        (:func:`~durable.store.connect.is_slot_migrating`): its work waits; the others' goes on."""
        if not self._migrating_said.due(p):
            return
        log.warning(
            "partition %d waits: its Redis Cluster slot is being migrated (%s); %s",
            p,
            str(exc).splitlines()[0][:120],
            MIGRATING_FIX,
        )

    def _check_server(self) -> None:
        """Refuse a Redis older than 6.2 (a script would fail at its first XAUTOCLAIM, deep in
        a worker) and a plain URL at a Redis Cluster node (the keys of other nodes' slots would
        be refused, MOVED, which the loops take for a cluster reconfiguring, forever)."""
        if self.cluster:
            return
        try:
            with self.redis.pipeline(transaction=False) as pipe:
                server, cluster = pipe.info("server").info("cluster").execute()
        except redis.exceptions.ResponseError:
            return  # INFO refused (an ACL user without it) or renamed: the first MOVED says it
        old = unsupported_server(self.url, server)
        if old is not None:
            raise ConfigurationError(old)
        if str(cluster.get("cluster_enabled", 0)) == "1":
            raise ConfigurationError(cluster_node_url(self.url))

    def _load_all_scripts(self) -> None:
        for script in self._scripts.values():
            self.redis.script_load(script.script)

    def _check_partitions(self) -> None:
        want = self.keys.partitions
        # Read first: a store opened while Redis refuses writes (at maxmemory) must not fail here.
        try:
            recorded = self.redis.hget(self.keys.meta, "partitions")
        except redis.exceptions.ResponseError as exc:
            if not is_wrong_type(exc):
                raise
            # Every worker and command opens the store: a bare WRONGTYPE here stopped them all.
            kind = self.redis.type(self.keys.meta)
            raise ConfigurationError(
                f"Redis key {self.keys.meta} is a {text(kind)}, not "
                "a hash (made by hand, or by another program sharing the database): rename it aside or "
                "delete it, and the next process to open the store writes it anew with the partition "
                f"count it is configured with ({want} here): open it with the deployment's count"
            ) from exc
        if recorded is None:
            self.redis.hsetnx(self.keys.meta, "partitions", want)
            recorded = self.redis.hget(self.keys.meta, "partitions")
        have = int(recorded or want)
        if have != want:
            raise ConfigurationError(
                f"this Redis holds a durable deployment (prefix {self.keys.prefix!r}) with {have} partitions, "
                f"but {want} were configured; the partition count cannot change while runs exist — set "
                f"DURABLE_PARTITIONS={have}, or use another namespace (DURABLE_NAMESPACE)"
                + ("" if self.cluster else " or database")
            )

    def close(self) -> None:
        """Close the store's connections: its client's pool and the raw wire's idle ones."""
        self._wire.close()
        self.redis.close()

    def ride(
        self,
        what: str,
        call: Callable[[], T],
        *,
        writes: str = "",
        until: float | None = None,
        resend: Callable[[], T] | None = None,
    ) -> T:
        """``call()`` (a client call's Redis work, safe to repeat) through an outage of up to
        :attr:`client_ride_s` (and not past ``until``, a ``time.monotonic()`` deadline), then
        :class:`~durable.errors.RedisUnavailable` naming ``what``; ``resend`` runs for the tries
        after a failed one (see :func:`~durable.store.outage.ride_out`)."""
        within = self.client_ride_s
        if until is not None:
            within = max(0.0, min(within, until - time.monotonic()))
        return ride_out(
            call,
            url=self.url,
            what=what,
            within=within,
            writes=writes,
            outage=self.client_outage,
            resend=resend,
        )

    def flush(self) -> None:
        """Delete everything in this Redis database (tests), then record the partition count again."""
        self.redis.flushdb()
        self._check_partitions()

    def server_time_ms(self) -> int:
        sec, usec = self.redis.time()
        return int(sec) * 1000 + int(usec) // 1000

    # -------------------------------------------------------------- cluster
    def node_client(self, key: str) -> Client:
        """A plain client for the server holding ``key``'s slot: ``self.redis`` on one Redis; on a
        cluster, the node that owns the slot (its pipelines take EVALSHA and same-slot MULTI)."""
        if not self.cluster:
            return self.redis
        rc: Any = self.redis
        return rc.get_redis_connection(rc.get_node_from_key(key))

    def partition_client(self, p: int) -> Client:
        """:meth:`node_client` of partition ``p`` (every key of a partition is in one slot)."""
        return self.node_client(self.keys.tag(p))

    def node_name(self, key: str) -> str:
        """Which server holds ``key`` (one name on one Redis)."""
        if not self.cluster:
            return ""
        return str(self.redis.get_node_from_key(key).name)

    def pipeline(self, key: str, *, transaction: bool = True) -> Any:
        """A pipeline for commands on keys in ``key``'s slot (a MULTI on a cluster node is
        refused across slots): ``self.redis.pipeline`` on one Redis."""
        if not self.cluster:
            return self.redis.pipeline(transaction=transaction)
        return self.node_client(key).pipeline(transaction=transaction)

    def refresh_topology(self) -> None:
        """Re-read the cluster's slot map (after MOVED/ASK or a node going away); no-op on one Redis."""
        if not self.cluster:
            return
        try:
            self.redis.nodes_manager.initialize()
        except Exception as exc:  # noqa: BLE001 - the next command retries
            log.warning("could not refresh the cluster slot map: %s", exc)

    def _by_node(self, keys: Sequence[str]) -> dict[str, list[int]]:
        """Indexes of ``keys`` grouped by the node holding their slot, in first-seen order."""
        groups: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            groups.setdefault(self.node_name(key), []).append(i)
        return groups

    def round_trip(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """``commands`` in one round trip on the raw wire: their replies as Redis sends them
        (lists, bytes, ints; a stream range as nested lists), raising the first error replied."""
        replies = self._wire.execute(commands)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def _script_many(
        self,
        name: str,
        calls: Sequence[tuple[list[str], list[Any]]],
        *,
        raise_on_error: bool,
        then: Sequence[Sequence[Any]] = (),
    ) -> list[Any]:
        """Run script ``name`` once per ``(keys, args)`` in one round trip (each call atomic on its
        own): raw EVALSHAs, on a cluster one write per node (a script is loaded on a node that lacks it).
        ``then``: raw commands sent after the calls in the same write; their replies follow the
        calls' (as they are: ``raise_on_error`` is about the calls only)."""
        sha = self._scripts[name].sha
        replies = self._wire.execute(
            [*(("EVALSHA", sha, len(keys), *keys, *args) for keys, args in calls), *then]
        )
        if raise_on_error:
            for reply in replies[: len(calls)]:
                if isinstance(reply, Exception):
                    raise reply
        return replies

    def _run_script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run script ``name`` once: its raw reply, or the error Redis replied, raised. Through the
        raw wire, as the worker's batches go: redis-py's layers cost a client about as much CPU
        again as packing the call and reading its reply (measured on a start)."""
        return self._script_many(name, [(list(keys), list(args))], raise_on_error=True)[0]
