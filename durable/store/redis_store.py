"""Everything durable stores in Redis, behind one class.

Each state change that must be atomic is one Lua script in ``lua/`` (named
for what it does); :class:`RedisStore` packs arguments for them and reads
plain data back. Reads that need a consistent view use MULTI/EXEC on keys of
one partition. Key names come only from :mod:`durable.store.keys`.
"""

from __future__ import annotations

import itertools
import logging
import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import msgpack
import redis
from redis import exceptions as rexc

from .. import codec
from .. import events as ev
from ..config import key_prefix, partitions, redis_url
from ..errors import (
    ConfigurationError,
    DurableError,
    EventConflict,
    HookError,
    WorkflowAlreadyStarted,
    WorkflowClosed,
    WorkflowNotFound,
)
from ..ids import check_workflow_id
from ..retention import type_retention_ms
from .keys import GROUP, Keys
from .wire import Wire, stream_rows

log = logging.getLogger("durable.store")

#: Errors that mean "Redis (or one cluster node) is unavailable or the cluster is
#: reconfiguring": callers wait a moment and retry; tasks in flight stay pending.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    rexc.ConnectionError,
    rexc.TimeoutError,
    rexc.ClusterDownError,
    rexc.TryAgainError,
    rexc.AskError,  # MovedError too (a subclass)
    rexc.SlotNotCoveredError,
)

OPEN_STATUSES = frozenset({"pending", "running", "suspended", "cancelling"})
CLOSED_STATUSES = frozenset({"completed", "failed", "cancelled", "terminated", "continued"})


def _load_scripts() -> dict[str, str]:
    folder = resources.files("durable.store") / "lua"
    lib = (folder / "_lib.lua").read_text()
    return {
        entry.name[:-4]: lib + "\n" + entry.read_text()
        for entry in folder.iterdir()
        if entry.name.endswith(".lua") and not entry.name.startswith("_")
    }


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


CLUSTER_SCHEME = "redis+cluster"


def is_cluster_url(url: str | None) -> bool:
    """Whether ``url`` names a Redis Cluster: ``redis+cluster://host:port[,host:port...]``, or any
    Redis URL with ``?cluster=1`` (also ``true``/``yes``)."""
    if not url:
        return False
    parts = urlsplit(url)
    if parts.scheme in (CLUSTER_SCHEME, "rediss+cluster"):
        return True
    flag = parse_qs(parts.query).get("cluster", [""])[-1].lower()
    return flag in ("1", "true", "yes", "on")


# redis-py's type hints cannot express that our clients return bytes (decode_responses
# is off), nor that a RedisCluster stands in for a Redis: the store types them as this.
Client = Any


def connect(url: str) -> Client:
    """A client for ``url``: ``redis.Redis`` for one server, ``redis.cluster.RedisCluster`` for a
    cluster URL (see :func:`is_cluster_url`), its startup nodes taken from the URL's host list."""
    if not is_cluster_url(url):
        return redis.Redis.from_url(url)
    from redis.cluster import ClusterNode, RedisCluster

    parts = urlsplit(url)
    tls = parts.scheme.startswith("rediss")
    netloc = parts.netloc.rsplit("@", 1)
    hosts = netloc[-1]
    nodes = []
    for item in hosts.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("["):  # [ipv6]:port
            host, _, port = item[1:].partition("]")
            port = port.lstrip(":")
        else:
            host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
        nodes.append(ClusterNode(host or "127.0.0.1", int(port or 6379)))
    if not nodes:
        raise ConfigurationError(f"cluster URL {url!r} names no host:port")
    kwargs: dict[str, Any] = {}
    if len(netloc) == 2:
        user, _, password = netloc[0].partition(":")
        if password:
            kwargs["username"] = unquote(user) or None
            kwargs["password"] = unquote(password)
        else:
            kwargs["password"] = unquote(user)
    if tls:
        kwargs["ssl"] = True
    return RedisCluster(startup_nodes=nodes, **kwargs)


@dataclass(frozen=True)
class RunRef:
    """Where a run lives: its partition, run id and workflow id."""

    partition: int
    run_id: str
    workflow_id: str


class StaleCompletion(DurableError):
    """An eager commit carried the result of an attempt that is no longer current."""


@dataclass(frozen=True)
class CommitResult:
    """Outcome of :meth:`RedisStore.commit`."""

    seq: int
    inbox: int


class RedisStore:
    """durable's state in Redis: histories, inboxes, task streams, timers.

    Args:
        url: Redis URL; default ``DURABLE_REDIS_URL`` or the embedded server.
        prefix: Key prefix (default ``DURABLE_PREFIX`` or ``durable``).
        partitions: Partition count (default ``DURABLE_PARTITIONS`` or 8). It
            is fixed per deployment: a store that already holds a different
            count refuses to open.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        prefix: str | None = None,
        partitions_: int | None = None,
        client: redis.Redis | None = None,
    ) -> None:
        self.url = url or (None if client is not None else redis_url())
        self.redis: Client = client or connect(self.url)  # type: ignore[arg-type]
        #: True on a Redis Cluster: batches go per node, MULTI per partition (slot).
        self.cluster = _is_cluster_client(self.redis)
        self.keys = Keys(prefix or key_prefix(), partitions_ or partitions())
        self._scripts = {name: self.redis.register_script(src) for name, src in _load_scripts().items()}
        # The hot path (load, commit, complete) on one Redis skips redis-py's pipeline layers.
        self._wire = None if self.cluster else Wire(self.redis, self._load_all_scripts)
        self._check_partitions()

    def _load_all_scripts(self) -> None:
        for script in self._scripts.values():
            self.redis.script_load(script.script)

    # ---------------------------------------------------------------- setup
    def _check_partitions(self) -> None:
        want = self.keys.partitions
        self.redis.hsetnx(self.keys.meta, "partitions", want)
        have = int(self.redis.hget(self.keys.meta, "partitions") or want)
        if have != want:
            raise ConfigurationError(
                f"this Redis holds a durable deployment (prefix {self.keys.prefix!r}) with {have} partitions, "
                f"but {want} were configured; the partition count cannot change while runs exist — set "
                f"DURABLE_PARTITIONS={have}, or use another prefix/database"
            )

    def close(self) -> None:
        self.redis.close()

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

    def _script_per_node(
        self, name: str, calls: Sequence[tuple[list[str], list[Any]]], *, raise_on_error: bool
    ) -> list[Any]:
        """Run script ``name`` once per ``(keys, args)``: one pipeline per cluster node (the
        scripts are loaded on a node when it lacks them: NOSCRIPT is handled by the pipeline)."""
        script = self._scripts[name]
        replies: list[Any] = [None] * len(calls)
        for indexes in self._by_node([keys[0] for keys, _ in calls]).values():
            client = self.node_client(calls[indexes[0]][0][0])
            try:
                with client.pipeline(transaction=False) as pipe:
                    for i in indexes:
                        script(keys=calls[i][0], args=calls[i][1], client=pipe)
                    got = pipe.execute(raise_on_error=raise_on_error)
            except (rexc.AskError, rexc.ConnectionError, rexc.ClusterDownError):
                self.refresh_topology()
                raise
            if any(isinstance(r, rexc.AskError) for r in got):
                self.refresh_topology()
            for i, reply in zip(indexes, got, strict=True):
                replies[i] = reply
        return replies

    def _script_many(
        self, name: str, calls: Sequence[tuple[list[str], list[Any]]], *, raise_on_error: bool
    ) -> list[Any]:
        """Run script ``name`` once per ``(keys, args)`` in one round trip per server (each call
        atomic on its own): raw EVALSHAs on one Redis, a pipeline per node on a cluster."""
        if self._wire is None:
            return self._script_per_node(name, calls, raise_on_error=raise_on_error)
        sha = self._scripts[name].sha
        replies = self._wire.execute([("EVALSHA", sha, len(keys), *keys, *args) for keys, args in calls])
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies

    def _run_script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return self._scripts[name](keys=list(keys), args=list(args))

    # ------------------------------------------------------------- lookups
    def ref(self, workflow_id: str, run_id: str | None = None) -> RunRef:
        """Locate a workflow's current run (or the given run of it).

        Raises:
            WorkflowNotFound: no such workflow id (or run).
        """
        check_workflow_id(workflow_id)
        p = self.keys.partition(workflow_id)
        if run_id is None:
            current = self.redis.hget(self.keys.instance(p, workflow_id), "run")
            if current is None:
                raise WorkflowNotFound(f"no workflow with id {workflow_id!r}")
            run_id = _s(current)
        elif not self.redis.exists(self.keys.run(p, run_id)):
            raise WorkflowNotFound(f"workflow {workflow_id!r} has no run {run_id!r}")
        return RunRef(p, run_id, workflow_id)

    def run_record(self, ref: RunRef) -> dict[str, Any]:
        """The run hash, decoded (snapshot unpacked; result/error left as payload bytes)."""
        raw = self.redis.hgetall(self.keys.run(ref.partition, ref.run_id))
        if not raw:
            raise WorkflowNotFound(f"run {ref.run_id!r} of workflow {ref.workflow_id!r} does not exist")
        return _decode_run(raw)

    def history(self, ref: RunRef, after_seq: int = 0) -> list[ev.Entry]:
        """The run's committed events after ``after_seq``, decoded, in seq order."""
        return self.decode_history(
            ref, self.redis.xrange(self.keys.history(ref.partition, ref.run_id), f"0-{after_seq + 1}", "+")
        )

    def decode_history(self, ref: RunRef, rows: Iterable[tuple[bytes, dict[bytes, bytes]]]) -> list[ev.Entry]:
        out = []
        for entry_id, fields in rows:
            seq = int(entry_id.split(b"-")[1])
            raw = fields.get(b"e")
            if raw is None:
                from ..errors import HistoryCorrupt

                raise HistoryCorrupt(
                    f"run {ref.run_id} seq {seq}: history entry has no 'e' field (foreign entry?)",
                    run_id=ref.run_id,
                    seq=seq,
                )
            out.append(ev.decode(raw, run_id=ref.run_id, seq=seq))
        return out

    def load_for_decision(
        self, p: int, run_id: str, after_seq: int
    ) -> tuple[dict[str, Any] | None, list[bytes], list[tuple[bytes, dict[bytes, bytes]]]]:
        """One consistent read for a decision: the run record's :data:`DECISION_FIELDS` (``None``:
        no such run), the inbox items, the history after ``after_seq``."""
        return self.load_many([(p, run_id, after_seq)])[0]

    def load_many(
        self, runs: Sequence[tuple[int, str, int]]
    ) -> list[tuple[dict[str, Any] | None, list[bytes], list[tuple[bytes, dict[bytes, bytes]]]]]:
        """:meth:`load_for_decision` for several runs in one round trip (MULTI/EXEC); on a
        cluster one MULTI per partition, on the node that holds it."""
        if self._wire is None:
            return self._load_many_cluster(runs)
        replies = self._wire.transaction([c for run in runs for c in self._load_commands(*run)])
        for i in range(2, len(replies), 3):
            replies[i] = stream_rows(replies[i])
        return self._loaded(replies)

    def _load_commands(self, p: int, run_id: str, after_seq: int) -> list[tuple[Any, ...]]:
        """The three reads of a decision's load: record fields, inbox, history after ``after_seq``."""
        k = self.keys
        return [
            ("HMGET", k.run(p, run_id), *DECISION_FIELDS),
            ("LRANGE", k.inbox(p, run_id), 0, -1),
            ("XRANGE", k.history(p, run_id), f"0-{after_seq + 1}", "+"),
        ]

    def _load_many_cluster(
        self, runs: Sequence[tuple[int, str, int]]
    ) -> list[tuple[dict[str, Any] | None, list[bytes], list[tuple[bytes, dict[bytes, bytes]]]]]:
        by_partition: dict[int, list[int]] = {}
        for i, (p, _, _) in enumerate(runs):
            by_partition.setdefault(p, []).append(i)
        replies: list[Any] = [None] * (3 * len(runs))
        for p, indexes in by_partition.items():
            try:
                with self.partition_client(p).pipeline(transaction=True) as pipe:
                    for i in indexes:
                        for command in self._load_commands(*runs[i]):
                            pipe.execute_command(*command)
                    got = pipe.execute()
            except (rexc.AskError, rexc.ExecAbortError, rexc.ConnectionError, rexc.ClusterDownError):
                self.refresh_topology()
                raise
            for n, i in enumerate(indexes):
                replies[3 * i : 3 * i + 3] = got[3 * n : 3 * n + 3]
        return self._loaded(replies)

    @staticmethod
    def _loaded(
        replies: list[Any],
    ) -> list[tuple[dict[str, Any] | None, list[bytes], list[tuple[bytes, dict[bytes, bytes]]]]]:
        return [
            (_decision_record(replies[i]), replies[i + 1], replies[i + 2]) for i in range(0, len(replies), 3)
        ]

    def log_entries(self, ref: RunRef, count: int = 1000) -> list[dict[str, Any]]:
        """Activity attempts and dropped inputs kept beside the history."""
        rows = self.redis.xrange(self.keys.log(ref.partition, ref.run_id), count=count)
        out = []
        for _, fields in rows:
            item = {_s(k): v for k, v in fields.items()}
            for k in ("kind", "act", "outcome", "reason"):
                if k in item:
                    item[k] = _s(item[k])
            for k in ("attempt", "ts"):
                if k in item:
                    item[k] = int(item[k])
            if "record" in item:
                item["record"] = codec.unpack(item["record"])
            out.append(item)
        return out

    # ------------------------------------------------------------- starting
    def start(
        self,
        *,
        workflow_type: str,
        workflow_id: str,
        run_id: str,
        args: bytes,
        queue: str,
        parent: dict[str, Any] | None = None,
        build_id: str = "",
        patches: Sequence[str] = (),
        options: dict[str, Any] | None = None,
    ) -> RunRef:
        """Create a run: instance + run record + WorkflowStarted + first workflow task.

        Raises:
            WorkflowAlreadyStarted: the workflow id has an open run.
        """
        p = self.keys.partition(workflow_id)
        data = ev.WorkflowStarted(
            workflow_type=workflow_type,
            workflow_id=workflow_id,
            run_id=run_id,
            args=args,
            queue=queue,
            parent=parent,
            build_id=build_id,
            patches=list(patches),
            options=options or {},
        ).to_data()
        k = self.keys
        result = self._run_script(
            "start_run",
            [
                k.instance(p, workflow_id),
                k.run(p, run_id),
                k.history(p, run_id),
                k.workflow_tasks(p, queue),
                k.runs(p),
            ],
            [
                workflow_id,
                run_id,
                workflow_type,
                queue,
                codec.pack(data),
                codec.pack(parent) if parent else b"",
                type_retention_ms(workflow_type) or "",  # recorded in the run: see durable.retention
            ],
        )
        if _s(result[0]) == "ALREADY":
            raise WorkflowAlreadyStarted(
                f"workflow {workflow_id!r} already has an open run ({_s(result[1])}); "
                "signal it, wait for it, or start with another id"
            )
        return RunRef(p, run_id, workflow_id)

    # ------------------------------------------------------------ decisions
    def commit_args(
        self,
        ref: RunRef,
        *,
        expected_seq: int,
        events: Sequence[bytes],
        consumed: int,
        dropped: Sequence[tuple[bytes, str, bool]] = (),
        activities: Sequence[tuple[str, str, bytes]] = (),
        timers: Sequence[tuple[str, int]] = (),
        untimers: Sequence[str] = (),
        cancel_activities: Sequence[str] = (),
        outbox: Sequence[bytes] = (),
        hooks: Sequence[tuple[str, str]] = (),
        pin: tuple[str, str] | None = None,
        leased: Sequence[tuple[str, str, bytes, int]] = (),
        eager: Sequence[tuple[str, int, bytes]] = (),
        status: str,
        snapshot: dict[str, Any],
        close: str | None = None,
        next_run: dict[str, Any] | None = None,
        task: tuple[str, str] | None = None,
        sticky: str = "",
    ) -> tuple[list[str], list[bytes]]:
        """Keys and arguments of the commit script for one decision.

        ``activities`` are ``(stream key, activity id, task body)``; ``leased``
        ``(stream key, activity id, task body, lease due ms)`` (run by this
        worker, no stream entry); ``eager`` ``(activity id, attempt, record)``
        completions applied in this decision; ``timers`` ``(member, due ms)``;
        ``dropped`` ``(raw, reason, poison)``; ``sticky`` the committing worker's
        private queue, where the run's next workflow tasks go while it lives.
        """
        p, rid = ref.partition, ref.run_id
        k = self.keys
        plan: dict[str, Any] = {
            "rid": rid,
            "seq": expected_seq,
            "events": list(events),
            "consumed": consumed,
            "dropped": [[raw, reason, 1 if poison else 0] for raw, reason, poison in dropped],
            "activities": [list(a) for a in activities],
            "timers": [list(t) for t in timers],
            "untimers": list(untimers),
            "cancel_activities": list(cancel_activities),
            "outbox": list(outbox),
            "hooks": [list(h) for h in hooks],
            "leased": [list(a) for a in leased],
            "eager": [list(e) for e in eager],
            "status": status,
            "snapshot": codec.pack(snapshot),
        }
        extra = [a[0] for a in activities]
        if close is not None:
            plan["close"] = close
        if sticky:
            plan["sticky"] = sticky
        if pin is not None:
            plan["pin"] = list(pin)
            extra.append(pin[1])
        if next_run is not None:
            plan["next"] = next_run
            extra += [next_run["run"], next_run["history"], next_run["wq"], next_run["runs"]]
        if task is not None:
            plan["task"] = list(task)
            extra.append(task[0])
        keys = [
            k.run(p, rid),
            k.history(p, rid),
            k.inbox(p, rid),
            k.instance(p, ref.workflow_id),
            k.timers(p),
            k.activities(p, rid),
            k.log(p, rid),
            k.outbox(p),
            k.hooks(p),
            k.dead(p),
            k.running(p),
            k.sessions(p),
            *dict.fromkeys(extra),
        ]
        # Lua's cmsgpack predates msgpack's bin type: send bytes as raw strings.
        return keys, [msgpack.packb(plan, use_bin_type=False)]

    def commit(self, ref: RunRef, **decision: Any) -> CommitResult:
        """Commit one decision atomically against its expected seq (see :meth:`commit_args`).

        Raises:
            EventConflict: the history moved past the expected seq.
            WorkflowClosed: the run closed meanwhile (terminated).
        """
        result = self.commit_many([(ref, decision)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def commit_many(
        self, decisions: Sequence[tuple[RunRef, dict[str, Any]]]
    ) -> list[CommitResult | Exception]:
        """Commit several runs' decisions in one round trip (each one atomic on its own).

        Returns, per decision, its :class:`CommitResult` or the exception it
        met (:class:`EventConflict`, :class:`WorkflowClosed`, a Redis error).
        """
        calls = [self.commit_args(ref, **decision) for ref, decision in decisions]
        try:
            replies = self._script_many("commit", calls, raise_on_error=False)
        except redis.RedisError as exc:
            replies = [exc] * len(decisions)
        return [
            _commit_outcome(ref.run_id, decision["expected_seq"], reply)
            for (ref, decision), reply in zip(decisions, replies, strict=True)
        ]

    # --------------------------------------------------------------- inputs
    def deliver(self, workflow_id: str, event: ev.Event, *, run_id: str | None = None) -> RunRef:
        """Push an input event onto a workflow's current run (or exactly ``run_id``).

        Raises:
            WorkflowNotFound: unknown workflow id.
            WorkflowClosed: the run is closed.
        """
        k = self.keys
        type_name, data = ev.encode_input_data(event)
        if run_id is None:
            check_workflow_id(workflow_id)
            p = k.partition(workflow_id)
            keys = [k.instance(p, workflow_id)]
        else:
            p = self.ref(workflow_id, run_id).partition
            keys = [k.instance(p, workflow_id), k.run(p, run_id), k.inbox(p, run_id)]
        result = self._run_script("deliver", keys, [run_id or "", type_name, data])
        outcome = _s(result[0])
        if outcome == "NOTFOUND":
            raise WorkflowNotFound(f"no workflow with id {workflow_id!r}")
        if outcome == "CLOSED":
            raise WorkflowClosed(
                f"workflow {workflow_id!r} (run {_s(result[2])}) is {_s(result[1])}; it takes no more "
                f"{event.type} — start a new run to continue"
            )
        return RunRef(p, _s(result[1]), workflow_id)

    def complete_activity(self, **attempt: Any) -> tuple[str, int]:
        """Finish an attempt (see :meth:`complete_args`); returns ``('OK'|'RETRY'|'STALE', due ms
        of the retry or 0)``."""
        return self.complete_many([attempt])[0]

    def complete_many(self, attempts: Sequence[dict[str, Any]]) -> list[tuple[str, int]]:
        """Finish several attempts in one round trip (each one atomic on its own)."""
        calls = [self.complete_args(**attempt) for attempt in attempts]
        replies = self._script_many("complete_activity", calls, raise_on_error=True)
        return [(_s(reply[0]), int(reply[1]) if _s(reply[0]) == "RETRY" else 0) for reply in replies]

    def complete_args(
        self,
        *,
        p: int,
        run_id: str,
        activity_id: str,
        attempt: int,
        stream: str,
        entry_id: str,
        outcome: str,
        event: ev.Event | None,
        retry_delay_ms: int = 0,
        next_body: bytes = b"",
        record: dict[str, Any],
    ) -> tuple[list[str], list[Any]]:
        """Keys and arguments of the completion script for one attempt.

        ``outcome`` is ``completed`` or ``failed`` (``event`` goes to the run's
        inbox), ``retry`` (``next_body`` is scheduled after ``retry_delay_ms``)
        or anything else (only logged, e.g. ``skipped``).
        """
        k = self.keys
        type_name, data = ev.encode_input_data(event) if event is not None else ("", b"")
        keys = [
            k.run(p, run_id),
            k.inbox(p, run_id),
            k.activities(p, run_id),
            k.log(p, run_id),
            k.timers(p),
            k.running(p),
            stream,
        ]
        args = [
            run_id,
            activity_id,
            attempt,
            entry_id,
            outcome,
            type_name,
            data,
            retry_delay_ms,
            next_body,
            codec.pack(record),
        ]
        return keys, args

    def heartbeat(
        self, p: int, run_id: str, activity_id: str, attempt: int, details: bytes, extend_ms: int
    ) -> bool:
        """Record a heartbeat; returns True when the activity was cancelled/superseded."""
        k = self.keys
        result = self._run_script(
            "heartbeat",
            [k.activities(p, run_id), k.running(p)],
            [run_id, activity_id, attempt, details, extend_ms],
        )
        return int(result) == 1

    def set_deadline(
        self, p: int, run_id: str, activity_id: str, attempt: int, due_ms: int, started_ms: int
    ) -> None:
        """Register a running attempt's deadline (start-to-close, heartbeat or schedule-to-close)."""
        with self.pipeline(self.keys.running(p)) as pipe:
            pipe.zadd(self.keys.running(p), {f"{run_id}|{activity_id}|{attempt}": due_ms})
            pipe.hset(self.keys.activities(p, run_id), f"{activity_id}:started", started_ms)
            pipe.execute()

    def attempt_started(self, p: int, run_id: str, activity_id: str) -> int | None:
        value = self.redis.hget(self.keys.activities(p, run_id), f"{activity_id}:started")
        return int(value) if value is not None else None

    def delivery_count(self, stream: str, entry_id: str) -> int:
        """How many times a pending task entry has been delivered (0 if it is not pending)."""
        rows = self.redis.xpending_range(stream, GROUP, min=entry_id, max=entry_id, count=1)
        return int(rows[0]["times_delivered"]) if rows else 0

    def activity_state(self, p: int, run_id: str, activity_id: str) -> tuple[bytes | None, bytes | None]:
        """(current task body, last heartbeat details) of a pending activity."""
        body, details = self.redis.hmget(self.keys.activities(p, run_id), activity_id, f"{activity_id}:hb")
        return body, details

    def terminate(self, workflow_id: str, reason: str) -> tuple[RunRef, dict[str, Any]]:
        """Close the current run now (WorkflowTerminated); returns its last snapshot."""
        for _ in range(5):
            ref = self.ref(workflow_id)
            k, p, rid = self.keys, ref.partition, ref.run_id
            parent_raw = self.redis.hget(k.run(p, rid), "parent")
            parent = codec.unpack(parent_raw) if parent_raw else None
            to_parent = b""
            if parent:
                to_parent = child_result_message(
                    parent, ev.ChildFailed(id=parent["cid"], status="terminated")
                )
            result = self._run_script(
                "terminate",
                [
                    k.instance(p, workflow_id),
                    k.run(p, rid),
                    k.history(p, rid),
                    k.inbox(p, rid),
                    k.activities(p, rid),
                    k.log(p, rid),
                    k.outbox(p),
                ],
                [rid, codec.pack(ev.WorkflowTerminated(reason=reason).to_data()), to_parent],
            )
            outcome = _s(result[0])
            if outcome == "OK":
                return ref, codec.unpack(result[2]) if result[2] else {}
            if outcome == "CLOSED":
                raise WorkflowClosed(f"workflow {workflow_id!r} (run {rid}) is already {_s(result[1])}")
        raise DurableError(f"workflow {workflow_id!r} kept moving to new runs; try again")

    # ------------------------------------------------------------ scheduler
    def fire_timers(self, parts: Sequence[int], limit: int = 500) -> list[tuple[int, int]]:
        """Fire due timers and retries of partitions ``parts`` (one script each, one round trip):
        ``(fired, next due ms or -1)`` per partition."""
        calls = [([self.keys.timers(p)], [self.keys.tag(p), limit]) for p in parts]
        return [(int(r[0]), int(r[1])) for r in self._script_many("fire_timers", calls, raise_on_error=True)]

    def unstick(self, p: int, host: str) -> int:
        """Hand the workflow tasks in the private stream of the stopped worker ``host`` back to
        their runs' queues. Returns how many moved, or -1 (and does nothing) while its lease lives."""
        k = self.keys
        keys = [k.workflow_tasks(p, host), k.alive(p, host), k.sticky_hosts(p)]
        return int(self._run_script("unstick", keys, [host]))

    def expired_attempts(self, p: int, now_ms: int, limit: int = 100) -> list[tuple[str, str, int]]:
        """Attempts whose start-to-close or heartbeat deadline has passed: (run, activity, attempt)."""
        members = self.redis.zrangebyscore(self.keys.running(p), "-inf", now_ms, start=0, num=limit)
        out = []
        for m in members:
            rid, aid, attempt = _s(m).rsplit("|", 2)
            out.append((rid, aid, int(attempt)))
        return out

    def next_deadlines(self, parts: Sequence[int]) -> list[int | None]:
        """The earliest running-attempt deadline (ms) of each partition in ``parts``, if any."""
        with self.redis.pipeline(transaction=False) as pipe:
            for p in parts:
                pipe.zrange(self.keys.running(p), 0, 0, withscores=True)
            firsts = pipe.execute()
        return [int(first[0][1]) if first else None for first in firsts]

    def server_time_ms(self) -> int:
        sec, usec = self.redis.time()
        return int(sec) * 1000 + int(usec) // 1000

    # ---------------------------------------------------------------- tasks
    def ensure_groups(self, streams: Iterable[str]) -> None:
        """Create the consumer group on each task stream (idempotent)."""
        for stream in streams:
            try:
                self.redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def park(
        self,
        *,
        p: int,
        stream: str,
        entry_id: str,
        kind: str,
        reason: str,
        fields: Mapping[Any, Any],
        run_id: str = "",
        block: bool = False,
    ) -> None:
        """Move a task that cannot run to the dead-letter stream (and block its run)."""
        k = self.keys
        safe = {
            key: (value if isinstance(value, bytes | str | int | float) else repr(value))
            for key, value in fields.items()
        }
        self._run_script(
            "park",
            [k.dead(p), stream, k.run(p, run_id) if run_id else k.runs(p)],
            [entry_id, kind, reason, codec.pack(safe), run_id, "1" if block else "0"],
        )
        log.warning("parked %s task %s of run %s: %s", kind, entry_id, run_id or "?", reason)

    def current_build(self, queues: Sequence[str]) -> list[str]:
        """The current build id of each queue (``""`` when none was promoted)."""
        names = [self.keys.current_build(q) for q in queues]
        if not names:
            values: list[Any] = []
        elif self.cluster:  # the keys are in different slots
            values = self.redis.mget_nonatomic(names)
        else:
            values = self.redis.mget(names)
        return [_s(v) if v is not None else "" for v in values]

    def promote_build(self, queues: Sequence[str], build: str) -> None:
        """Make ``build`` the one whose workers start the new runs of ``queues``."""
        with self.redis.pipeline(transaction=False) as pipe:
            for queue in queues:
                pipe.set(self.keys.current_build(queue), build)
            pipe.execute()

    def repin(self, workflow_id: str, build: str) -> RunRef:
        """Move a run to another build id (after checking with `durable replay` that the new
        code replays its history): its workflow tasks go to that build's workers."""
        ref = self.ref(workflow_id)
        record = self.run_record(ref)
        stream = self.keys.workflow_tasks(ref.partition, record.get("queue", "default"), build)
        self.ensure_groups([stream])
        with self.pipeline(stream) as pipe:
            run_key = self.keys.run(ref.partition, ref.run_id)
            pipe.hset(run_key, mapping={"build": build, "wq": stream})
            pipe.hdel(run_key, "sticky")
            pipe.xadd(stream, {"run": ref.run_id})
            pipe.execute()
        return ref

    def ack_task(self, stream: str, entry_id: str) -> None:
        """Ack and delete one task entry (MULTI/EXEC; on a cluster, on the stream's node)."""
        with self.pipeline(stream) as pipe:
            pipe.xack(stream, GROUP, entry_id)
            pipe.xdel(stream, entry_id)
            pipe.execute()

    def requeue(self, stream: str, entries: Sequence[tuple[str, Mapping[bytes, bytes]]]) -> None:
        """Put tasks this consumer claimed but will not run back at the end of ``stream``
        (as new entries, for any worker), in one MULTI/EXEC."""
        with self.pipeline(stream) as pipe:
            for entry_id, fields in entries:
                pipe.xadd(stream, dict(fields))
                pipe.xack(stream, GROUP, entry_id)
                pipe.xdel(stream, entry_id)
            pipe.execute()

    def reroute(self, p: int, stream: str, entry_id: str, run_id: str, target: str) -> None:
        """Hand a workflow task to the stream of the build its run is pinned to."""
        with self.pipeline(stream) as pipe:
            pipe.xadd(target, {"run": run_id})
            pipe.xack(stream, GROUP, entry_id)
            pipe.xdel(stream, entry_id)
            pipe.execute()

    def repair(self, workflow_id: str) -> RunRef:
        """Re-queue a blocked run (after a fixed deploy)."""
        ref = self.ref(workflow_id)
        result = self._run_script("repair", [self.keys.run(ref.partition, ref.run_id)], [ref.run_id])
        if _s(result[0]) == "CLOSED":
            raise WorkflowClosed(f"workflow {workflow_id!r} is {_s(result[1])}; nothing to repair")
        # Activity tasks parked for this run (e.g. a type no worker had) go back to their queue.
        dead = self.keys.dead(ref.partition)
        with self.redis.pipeline(transaction=False) as pipe:
            for entry_id, fields in self.redis.xrange(dead):
                if fields.get(b"run") != ref.run_id.encode() or fields.get(b"kind") != b"activity":
                    continue
                raw_body = codec.unpack(fields[b"task"]).get("body")
                if not isinstance(raw_body, bytes):
                    continue
                body = codec.unpack(raw_body)
                pipe.xadd(body["stream"], {"run": ref.run_id, "act": body["aid"], "body": raw_body})
                pipe.xdel(dead, entry_id)
            pipe.execute()
        return ref

    def dead_letters(self, count: int = 100) -> list[dict[str, Any]]:
        """Parked tasks of every partition, newest last."""
        out = []
        for p in range(self.keys.partitions):
            for entry_id, fields in self.redis.xrange(self.keys.dead(p), count=count):
                item = {_s(k): v for k, v in fields.items()}
                for key in ("kind", "stream", "entry", "run", "reason"):
                    if key in item:
                        item[key] = _s(item[key])
                if "task" in item:
                    try:
                        item["task"] = codec.unpack(item["task"])
                    except Exception:  # noqa: BLE001 - show raw bytes rather than hide the letter
                        pass
                item["id"] = _s(entry_id)
                item["partition"] = p
                out.append(item)
        return out

    # ----------------------------------------------------------------- hooks
    def resolve_hook(self, token: str) -> tuple[int, str, str]:
        """(partition, run id, hook id) of a hook token."""
        if not isinstance(token, str) or "." not in token:
            raise HookError(f"unknown hook token {token[:6] if isinstance(token, str) else token!r}…")
        p_text = token.split(".", 1)[0]
        if not p_text.isdigit() or int(p_text) >= self.keys.partitions:
            raise HookError("unknown hook token")
        p = int(p_text)
        target = self.redis.hget(self.keys.hooks(p), token)
        if target is None:
            raise HookError("unknown or already used hook token")
        rid, hook_id = _s(target).split("|", 1)
        return p, rid, hook_id

    # ------------------------------------------------------------------ list
    def list_runs(
        self,
        *,
        status: str | None = None,
        workflow_type: str | None = None,
        limit: int = 50,
        before_ms: int | None = None,
    ) -> list[dict[str, Any]]:
        """Runs of every partition, newest first, filtered by status and type.

        Page with ``before_ms`` = the ``created`` of the last row of the previous page.
        """
        upper = f"({before_ms}" if before_ms is not None else "+inf"
        candidates: list[tuple[int, int, str]] = []
        for p in range(self.keys.partitions):
            rows = self.redis.zrevrangebyscore(
                self.keys.runs(p), upper, "-inf", start=0, num=limit * 4, withscores=True
            )
            candidates += [(int(score), p, _s(rid)) for rid, score in rows]
        candidates.sort(reverse=True)
        out: list[dict[str, Any]] = []
        for created, p, rid in candidates:
            raw = self.redis.hgetall(self.keys.run(p, rid))
            if not raw:
                continue
            record = _decode_run(raw)
            if (
                status is not None
                and record.get("status") != status
                and not (status == "blocked" and record.get("blocked"))
            ):
                continue
            if workflow_type is not None and record.get("type") != workflow_type:
                continue
            record.update(run_id=rid, partition=p, created=created)
            out.append(record)
            if len(out) >= limit:
                break
        return out

    # ----------------------------------------------------------------- clock
    def set_clock_offset(self, ms: int) -> None:
        """Shift the clock every script stamps time with by ``ms`` (tests only: time skipping).

        Writes ``<tag>:clock`` in every partition (deleted for 0). Workflow
        ``now()``, timer due checks and event time stamps follow it; Python-side
        waits (worker and scheduler sleeps) do not.
        """
        ms = int(ms)
        with self.redis.pipeline(transaction=False) as pipe:
            for p in range(self.keys.partitions):
                key = self.keys.tag(p) + ":clock"
                if ms:
                    pipe.set(key, ms)
                else:
                    pipe.delete(key)
            pipe.execute()

    def clock_offset(self) -> int:
        """The clock offset set by :meth:`set_clock_offset` (ms; 0 when none)."""
        value = self.redis.get(self.keys.tag(0) + ":clock")
        return int(value) if value is not None else 0


def _is_cluster_client(client: Any) -> bool:
    try:
        from redis.cluster import RedisCluster
    except ImportError:  # pragma: no cover - redis-py always has it (>= 4.1)
        return False
    return isinstance(client, RedisCluster)


def _commit_outcome(run_id: str, expected_seq: int, reply: Any) -> CommitResult | Exception:
    if isinstance(reply, Exception):
        return reply
    outcome = _s(reply[0])
    if outcome == "CONFLICT":
        return EventConflict(
            f"run {run_id}: history is at seq {int(reply[1])}, decision expected {expected_seq} "
            "(another decider committed first)"
        )
    if outcome == "CLOSED":
        return WorkflowClosed(f"run {run_id} is {_s(reply[1])}; decision discarded")
    if outcome == "STALE":
        return StaleCompletion(
            f"run {run_id}: activity {_s(reply[1])} is no longer pending; eager result not applied"
        )
    return CommitResult(seq=int(reply[1]), inbox=int(reply[2]))


def child_result_message(parent: dict[str, Any], event: ev.Event) -> bytes:
    """An outbox message delivering a child's outcome to its parent run (another partition)."""
    return codec.pack(
        {
            "kind": "deliver",
            "wid": parent["wid"],
            "rid": parent["rid"],
            "type": event.type,
            "data": event.to_data(),
        }
    )


DECISION_FIELDS = ("seq", "status", "blocked", "build", "wq", "workflow_id", "parent", "queue")
"""The fields of a run record a decision reads (the rest, e.g. the snapshot, only clients use)."""


def _decision_record(values: Sequence[Any]) -> dict[str, Any] | None:
    """An HMGET of :data:`DECISION_FIELDS`, decoded like a whole record (``None``: no run)."""
    if values[0] is None:
        return None
    return _decode_run({name: v for name, v in zip(DECISION_FIELDS, values, strict=True) if v is not None})


def _decode_run(raw: Mapping[Any, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = _s(key)
        if name in ("seq", "created", "updated", "closed"):
            out[name] = int(value)
        elif name == "snapshot":
            out[name] = codec.unpack(value) if value else {}
        elif name == "parent":
            out[name] = codec.unpack(value) if value else None
        elif name in ("result", "error"):
            out[name] = value
        else:
            out[name] = _s(value)
    return out


_consumers = itertools.count(1)


def consumer_name() -> str:
    """A unique consumer name: host, pid, start time, and a counter (several workers may start
    in one process within the same millisecond; each needs its own private queue)."""
    import os

    return f"{socket.gethostname()}:{os.getpid()}:{int(time.time() * 1000) % 100000}.{next(_consumers)}"
