"""Prometheus metrics of a worker process: one module, a no-op unless turned on.

The worker's seams (decider, attempts, scheduler) call the functions below. Until
:func:`enable` runs (``durable worker --metrics-port N``), or when
``prometheus-client`` (the ``metrics`` extra) is not installed, each returns at
its first line: the hot path pays one global read.

Labels are low-cardinality by design: workflow and activity types, queue names
(a worker's private queues are all ``@private``), outcomes, kinds. Never a run or
workflow id.

With ``--processes N`` the supervisor serves the port and the children record into
``prometheus-client``'s multiprocess files (:data:`MULTIPROC_ENV`, a fresh directory
the supervisor creates and removes): one scrape shows the sum over every process,
including processes that were restarted. Gauges of the children are summed over
the live ones. See docs/observability.md.
"""

from __future__ import annotations

import atexit
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from functools import wraps
from typing import Any

import redis
from redis.connection import AbstractConnection

try:  # the `metrics` extra; without it every function below is a no-op
    import prometheus_client as prom
    from prometheus_client import multiprocess as prom_multiprocess
    from prometheus_client.registry import Collector
except ImportError:  # pragma: no cover - exercised where the extra is absent
    prom = None  # type: ignore[assignment]
    Collector = object  # type: ignore[assignment,misc]

from durable import codec
from durable import events as ev
from durable.errors import EventConflict, WorkflowClosed, WorkflowTimeout
from durable.runinfo import BLOCKED_KINDS, classify_block
from durable.store.connect import is_transient
from durable.store.keys import PRIVATE
from durable.store.records import StaleCompletion
from workers import tally
from workers.config import WorkerConfig
from workers.queue_metrics import QueueCollector

log = logging.getLogger("durable.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""Where supervised worker processes write their metrics (set by the supervisor)."""

FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SLOW = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0)
PARK_KINDS = ("workflow", "activity", "outbox")
"""The ``kind`` label values of ``durable_tasks_parked_total``."""
REDIS_ERROR_KINDS = ("connection", "timeout", "busyloading", "readonly", "outofmemory")
"""The ``kind`` label values of ``durable_redis_errors_total`` every process shows from its start."""
# Activities run from a millisecond (a cache read) to an hour (a report): FAST stopped at 10 s, so
# the p95 of slower ones read 10 s whatever it was.
ACTIVITY = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
DEFAULT_HOST = WorkerConfig.metrics_host
"""Where ``/metrics`` listens unless ``--metrics-host`` says otherwise (:class:`WorkerConfig`)."""
CLOSES_GROUP = "metrics"
"""The consumer group (and consumer) the metrics processes read the closes streams in."""
FLUSH_S = 0.5
"""Counters are tallied per thread and written to ``prometheus-client`` this often (and at exit,
and before each scrape a worker serves itself): a supervised worker's scrape lags by at most this."""


def available() -> bool:
    """Whether ``prometheus-client`` is installed (``pip install -e '.[metrics]'`` in durable's checkout)."""
    return prom is not None


class _Metrics:
    """The metric objects of this process, with label children cached (``labels()`` is slow)."""

    def __init__(self) -> None:
        assert prom is not None
        c, h, g = prom.Counter, prom.Histogram, prom.Gauge
        wt, at, q = "workflow_type", "activity_type", "queue"
        self.started = c("durable_workflows_started_total", "Runs whose first decision committed.", [wt])
        self.closed = c(
            "durable_workflows_closed_total",
            "Runs closed, by outcome (completed, failed, timed_out, cancelled, terminated, continued).",
            [wt, "outcome"],
        )
        self.decisions = c(
            "durable_decisions_total",
            "Workflow tasks decided, by outcome (committed, conflict, void, error).",
            [wt, "outcome"],
        )
        self.decision_s = h(
            "durable_decision_seconds",
            "Workflow task: load, replay or cache hit, decide, commit.",
            [wt],
            buckets=FAST,
        )
        self.replays = c(
            "durable_replays_total", "Decisions that replayed the history (run cache miss).", [wt]
        )
        self.replay_s = h(
            "durable_replay_seconds", "Time replaying a run's history on a cache miss.", [wt], buckets=FAST
        )
        self.cache = c(
            "durable_sticky_cache_requests_total", "Run cache lookups by result (hit, miss).", ["result"]
        )
        self.cache_size = g(
            "durable_sticky_cache_runs", "Runs held in the worker's run cache.", multiprocess_mode="livesum"
        )
        self.attempts = c(
            "durable_activity_attempts_total",
            "Activity attempts by outcome (completed, retry, failed, timed_out, void, parked).",
            [at, q, "outcome"],
        )
        self.schedule_to_start = h(
            "durable_activity_schedule_to_start_seconds",
            "First attempts: scheduled to started (Redis clock).",
            [at, q],
            buckets=SLOW,
        )
        self.execution = h(
            "durable_activity_execution_seconds",
            "Activity attempt run time.",
            [at, q, "outcome"],
            buckets=ACTIVITY,
        )
        self.retries = c("durable_activity_retries_total", "Activity attempts retried after a failure.", [at])
        self.timeouts = c(
            "durable_activity_timeouts_total", "Activity attempts that timed out, by kind.", [at, "kind"]
        )
        self.timers = c("durable_timers_fired_total", "Timers and retry backoffs fired by this process.")
        self.lateness = h(
            "durable_timer_lateness_seconds", "Earliest fired timer of a pass: fired minus due.", buckets=FAST
        )
        self.parked = c(
            "durable_tasks_parked_total", "Tasks parked in a dead-letter stream, by task kind.", ["kind"]
        )
        self.blocked = c(
            "durable_runs_blocked_total", "Runs blocked (until `durable repair`), by reason.", ["reason"]
        )
        self.round_trips = c(
            "durable_redis_round_trips_total", "Requests written to Redis (commands or pipelines)."
        )
        self.redis_errors = c("durable_redis_errors_total", "Redis errors raised, by kind.", ["kind"])
        self._children: dict[tuple[Any, ...], Any] = {}
        self._zero_closed_labels()
        self._due: dict[int, int] = {}
        self._cache_len = -1
        self._closes_ready: set[str] = set()  # closes streams whose consumer group exists
        # Hot-path counter increments, (counter, *labels) -> count, written by flush().
        self.tally = tally.Tally([])

    def _zero_closed_labels(self) -> None:
        """Closed label sets start at 0: a series born at 1 shows no increase(), so the documented
        alerts missed each process's first blocked run or Redis error (every one, after a deploy)."""
        for reason in BLOCKED_KINDS:
            self.child(self.blocked, reason)
        for kind in PARK_KINDS:
            self.child(self.parked, kind)
        for kind in REDIS_ERROR_KINDS:
            self.child(self.redis_errors, kind)

    def child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found


_m: _Metrics | None = None


def flush() -> None:
    """Write the counts tallied so far into the ``prometheus-client`` counters."""
    m = _m
    if m is not None:
        for (metric, *labels), n in m.tally.drain().items():
            (m.child(metric, *labels) if labels else metric).inc(n)


def enabled() -> bool:
    """Whether this process records metrics."""
    return _m is not None


def enable() -> bool:
    """Start recording in this process (idempotent); ``False`` without ``prometheus-client``."""
    global _m
    if prom is None:
        return False
    if _m is None:
        prom.disable_created_metrics()  # the _created series double a scrape for nothing here
        _m = _Metrics()
        _count_redis_requests(_m)
        tally.every(FLUSH_S, flush, "durable-metrics-flush")
        atexit.register(flush)
    return True


# ------------------------------------------------------------------ recording (the seams)
def decided(workflow_type: str, outcome: str, seconds: float, *, first: bool, closing: str | None) -> None:
    """One workflow task decided (``closing``: the run's new closed status, if it closed)."""
    m = _m
    if m is None:
        return
    m.tally.add((m.decisions, workflow_type, outcome))
    if outcome != "committed":
        return
    m.child(m.decision_s, workflow_type).observe(seconds)
    if first:
        m.tally.add((m.started, workflow_type))
    if closing is not None:
        m.tally.add((m.closed, workflow_type, closing))


def measured(
    workflow_type: str, closing: ev.Event | None, record: dict[str, Any], result: Any, began: float
) -> None:
    """One decision's commit outcome (``result``: its commit's result or exception), timed from
    ``began`` (``time.perf_counter()``); ``record``: the run's as loaded (a first decision's
    status is ``pending``)."""
    decided(
        workflow_type,
        decision_outcome(result),
        time.perf_counter() - began,
        first=record.get("status") == "pending",
        closing=close_outcome(closing),
    )


def decision_outcome(result: Any) -> str:
    """The ``outcome`` label of a decision whose commit returned or raised ``result``."""
    if isinstance(result, EventConflict):
        return "conflict"
    if isinstance(result, WorkflowClosed | StaleCompletion):
        return "void"  # its run closed meanwhile, or its result came late: nothing to fix
    return "error" if isinstance(result, Exception) else "committed"


def close_outcome(closing: ev.Event | None) -> str | None:
    """The ``outcome`` label of a run's closing event: its status, but ``timed_out`` for a run
    a workflow timeout failed (its status is ``failed``)."""
    if closing is None:
        return None
    if isinstance(closing, ev.WorkflowFailedEvent):
        try:
            if isinstance(codec.loads(closing.error), WorkflowTimeout):
                return "timed_out"
        except Exception:  # noqa: BLE001 - an error this process cannot decode is counted as failed
            pass
    return ev.STATUS_OF_CLOSING[closing.type]


def _ensure_close_groups(m: _Metrics, client: Any, keys: Sequence[str]) -> None:
    """Create the consumer group of each closes stream (and the stream: the close scripts write
    to it only once it exists), reading from now on; an existing group keeps its cursor."""
    missing = [key for key in keys if key not in m._closes_ready]
    if not missing:
        return
    with client.pipeline(transaction=False) as pipe:
        for key in missing:
            pipe.xgroup_create(key, CLOSES_GROUP, id="$", mkstream=True)
        replies = pipe.execute(raise_on_error=False)
    for key, reply in zip(missing, replies, strict=True):
        if isinstance(reply, Exception) and "BUSYGROUP" not in str(reply):
            raise reply
        m._closes_ready.add(key)


def count_closes(store: Any) -> int:
    """Count the runs closed outside a decision (``terminate`` from a client, the CLI, the HTTP
    API, a parent's close policy, ``id_conflict_policy='terminate_existing'``) since the last
    call; returns how many. The closing scripts append them to each partition's closes stream;
    every metrics process reads it in one consumer group (without acks): each close is delivered
    to one reader once, whichever process reads first, so the sum over processes counts it once.
    """
    m = _m
    if m is None:
        return 0
    keys = [store.keys.closes(p) for p in range(store.keys.partitions)]
    _ensure_close_groups(m, store.redis, keys)
    counted = 0
    with store.redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.xreadgroup(CLOSES_GROUP, CLOSES_GROUP, {key: ">"}, count=1000, noack=True)
        replies = pipe.execute(raise_on_error=False)
    for key, reply in zip(keys, replies, strict=True):
        if isinstance(reply, Exception):
            if "NOGROUP" in str(reply):  # the stream was deleted: made again on the next call
                m._closes_ready.discard(key)
                continue
            raise reply
        for _, rows in reply or []:
            for _, fields in rows:
                m.child(m.closed, _text(fields.get(b"t", b"")), _text(fields.get(b"o", b""))).inc()
                counted += 1
    return counted


def cache_lookup(hit: bool) -> None:
    """The run cache was asked for a run."""
    m = _m
    if m is not None:
        m.tally.add((m.cache, "hit" if hit else "miss"))


def cache_size(size: int) -> None:
    """The run cache now holds ``size`` runs."""
    m = _m
    if m is not None and size != m._cache_len:
        m._cache_len = size
        m.cache_size.set(size)


def replayed(workflow_type: str, seconds: float) -> None:
    """A cache miss replayed a run's history in ``seconds``."""
    m = _m
    if m is None:
        return
    m.tally.add((m.replays, workflow_type))
    m.child(m.replay_s, workflow_type).observe(seconds)


def attempt(activity_type: str, stream: str, outcome: str, seconds: float | None, timeout: str = "") -> None:
    """An activity attempt on ``stream`` ended with ``outcome`` after ``seconds`` (begin, run,
    record; ``None``: not measured). ``timeout``: the kind of deadline it passed, then it counts
    as ``timed_out`` (whoever recorded it). ``discarded`` (another record of the attempt came
    first and is counted) counts nothing: one attempt, one outcome."""
    m = _m
    if m is None or outcome == "discarded":
        return
    queue, label = queue_of(stream), "timed_out" if timeout else outcome
    m.tally.add((m.attempts, activity_type, queue, label))
    if seconds is not None:
        m.child(m.execution, activity_type, queue, label).observe(seconds)
    if timeout:
        m.tally.add((m.timeouts, activity_type, timeout))
    if outcome == "retry":
        m.tally.add((m.retries, activity_type))


def started(activity_type: str, stream: str, waited_ms: int) -> None:
    """A first attempt began ``waited_ms`` after its activity was scheduled."""
    m = _m
    if m is not None:
        m.child(m.schedule_to_start, activity_type, queue_of(stream)).observe(max(0, waited_ms) / 1000)


def timed_out(activity_type: str, stream: str, kind: str, outcome: str) -> None:
    """The scheduler expired an attempt at a deadline of kind ``kind``; ``outcome``: retry, failed
    or discarded (the worker's own timeout of an async attempt was recorded first)."""
    attempt(activity_type, stream, outcome, None, kind)


def lease_lapsed(activity_type: str) -> None:
    """A leased attempt's worker died running it, and the attempt runs again (the same attempt:
    no attempt outcome); counted as a ``lease`` timeout, as docs/observability.md says."""
    m = _m
    if m is not None:
        m.tally.add((m.timeouts, activity_type, "lease"))


def timers_fired(partition: int, fired: int, next_due_ms: int, now_ms: int) -> None:
    """A scheduler pass fired ``fired`` timers of ``partition``; the next one is due at
    ``next_due_ms`` (-1: none). Lateness is measured against the due time the previous
    pass reported for that partition (the earliest timer fired)."""
    m = _m
    if m is None:
        return
    if fired:
        m.timers.inc(fired)
        due = m._due.get(partition, -1)
        if 0 <= due <= now_ms:
            m.lateness.observe((now_ms - due) / 1000)
    m._due[partition] = next_due_ms


def parked(kind: str, *, block: bool, reason: str, block_kind: str = "") -> None:
    """A task was parked (``block``: its run is blocked, for ``reason`` of kind ``block_kind``)."""
    m = _m
    if m is None:
        return
    m.child(m.parked, kind).inc()
    if block:
        m.child(m.blocked, block_kind or classify_block(reason)).inc()


def watch_store(store: Any) -> None:
    """Count the tasks ``store`` parks (and the runs it blocks), whoever parks them."""
    park: Callable[..., Any] = store.park

    @wraps(park)
    def counted_park(**kwargs: Any) -> Any:
        result = park(**kwargs)
        parked(
            kwargs.get("kind", ""),
            block=bool(kwargs.get("block")),
            reason=kwargs.get("reason", ""),
            block_kind=kwargs.get("block_kind", ""),
        )
        return result

    store.park = counted_park


_queues: dict[str, str] = {}


def queue_of(stream: str) -> str:
    """The queue name of a task stream key (private worker queues: ``@private``)."""
    queue = _queues.get(stream)
    if queue is None:
        queue = stream.rpartition(":")[2]
        if queue.startswith(PRIVATE):
            queue = PRIVATE + "private"
        _queues[stream] = queue
    return queue


def _count_error(m: _Metrics, exc: BaseException) -> None:
    """Count an error that means Redis is unavailable for now (``is_transient``: connection,
    timeout, loading, busy, OOM, read-only...). Command errors the caller expects and handles
    (``BUSYGROUP``, ``NOSCRIPT``) are not counted."""
    if not is_transient(exc):
        return
    if isinstance(exc, redis.TimeoutError):
        kind = "timeout"
    elif isinstance(exc, redis.ConnectionError):
        kind = "connection"
    else:
        kind = type(exc).__name__.removesuffix("Error").lower() or "response"
    m.child(m.redis_errors, kind).inc()


def _count_redis_requests(m: _Metrics) -> None:
    """Count requests and errors at redis-py's connection layer: every command and pipeline of
    this process (redis-py's own and durable's raw hot-path pipelines) goes through it."""
    send, read = AbstractConnection.send_packed_command, AbstractConnection.read_response
    if getattr(send, "_durable_counted", False):
        return

    trips = (m.round_trips,)

    def counted_send(self: Any, *args: Any, **kwargs: Any) -> Any:
        m.tally.add(trips)
        try:
            return send(self, *args, **kwargs)
        except redis.RedisError as exc:
            _count_error(m, exc)
            raise

    def counted_read(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return read(self, *args, **kwargs)
        except redis.RedisError as exc:
            _count_error(m, exc)
            raise

    counted_send._durable_counted = True  # type: ignore[attr-defined]
    AbstractConnection.send_packed_command = counted_send  # type: ignore[method-assign]
    AbstractConnection.read_response = counted_read  # type: ignore[method-assign]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ------------------------------------------------------------------ serving
class _Flushed(Collector):  # type: ignore[misc,valid-type,unused-ignore]
    """The default registry's metrics, with the counts tallied so far written first."""

    def collect(self) -> Iterator[Any]:
        flush()
        yield from prom.REGISTRY.collect()


def registry_for(
    store: Any, queues: Sequence[str] | None, *, multiproc_dir: str | None = None, fresh: bool = False
) -> Any:
    """The registry a scrape reads: this process's metrics (``fresh``: none), or with
    ``multiproc_dir`` the sum over the processes writing there; and the Redis queue collector
    (``queues`` ``None``: those live workers serve; either way also the known queues no live
    worker serves: :class:`~workers.queue_metrics.QueueCollector`)."""
    assert prom is not None
    if multiproc_dir is None and not fresh:
        registry = prom.CollectorRegistry()
        registry.register(_Flushed())  # this process's metrics, its tallied counts written first
    elif multiproc_dir is None:
        registry = prom.CollectorRegistry()
    else:
        registry = prom.CollectorRegistry()
        prom_multiprocess.MultiProcessCollector(registry, path=multiproc_dir)
    if store is not None:
        registry.register(QueueCollector(store, queues))
    return registry


def serve(
    port: int,
    store: Any,
    queues: Sequence[str],
    *,
    host: str = DEFAULT_HOST,
    multiproc_dir: str | None = None,
) -> None:
    """Serve ``/metrics`` on ``host``:``port`` from a background thread (``0.0.0.0``: every
    interface, for a scraper on another host or outside the worker's container)."""
    if prom is None:
        raise RuntimeError(
            "prometheus-client is not installed: pip install -e '.[metrics]' in durable's checkout"
        )
    if multiproc_dir is None:
        enable()
    registry = registry_for(store, queues, multiproc_dir=multiproc_dir)
    prom.start_http_server(port, addr=host, registry=registry)
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address, as a URL writes it
    log.info("metrics at http://%s:%d/metrics", shown, port)


def exposition(registry: Any) -> tuple[bytes, str]:
    """The text exposition of ``registry`` and its content type (the server's ``/metrics``)."""
    assert prom is not None
    return prom.generate_latest(registry), prom.CONTENT_TYPE_LATEST


def process_dead(pid: int, multiproc_dir: str) -> None:
    """A supervised child ended: drop its live gauges from the sum."""
    if prom is not None:
        prom_multiprocess.mark_process_dead(pid, multiproc_dir)


__all__ = [
    "DEFAULT_HOST",
    "MULTIPROC_ENV",
    "QueueCollector",
    "attempt",
    "available",
    "cache_lookup",
    "cache_size",
    "close_outcome",
    "count_closes",
    "decided",
    "enable",
    "enabled",
    "exposition",
    "parked",
    "process_dead",
    "queue_of",
    "registry_for",
    "replayed",
    "serve",
    "started",
    "timed_out",
    "timers_fired",
    "watch_store",
]
