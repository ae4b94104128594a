"""durable's side of the benchmark workloads (see ``peers/common.py`` for the shared surface).

The engine: an embedded Redis (``EmbeddedRedis``, AOF with the chosen
``appendfsync``) in a temp dir -- or, with ``--cluster N``, a local Redis Cluster
of N masters (``durable.store.cluster_dev.LocalCluster``) -- workers as separate processes
(``python -m workers.cli worker --app bench_apps --processes N``), and this
process as the client (``WorkflowStub`` on a ``RedisStore``). W6 drives the
``Decider`` of ``workers/decider.py`` in this process on a separate key prefix,
so the worker processes never see its tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from peers.common import (
    STEPS,
    NotMeasured,
    Options,
    cpu_seconds,
    descendants,
    latency_summary,
    rss_bytes,
    stop_process_group,
    wait_for,
)

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent

NAME = "durable"


def unavailable() -> str | None:
    try:
        import durable  # noqa: F401
        from durable.store.embedded import find_redis_server

        find_redis_server()
    except Exception as exc:  # noqa: BLE001 - reported, not hidden
        return f"{type(exc).__name__}: {exc}"
    return None


def _cli_has_processes() -> bool:
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", "worker", "--help"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return "--processes" in out.stdout


def _env(tracing: bool = False) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BENCH), str(ROOT)]))
    env.pop("DURABLE_BENCH_TRACING", None)
    if tracing:
        env["DURABLE_BENCH_TRACING"] = "1"
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_workers(
    url: str,
    processes: int,
    *,
    cache_size: int = 1000,
    log: Path | None = None,
    eager: bool = False,
    metrics: bool = False,
    tracing: bool = False,
) -> list[subprocess.Popen[bytes]]:
    """Start worker processes for ``bench_apps``: one supervisor with ``--processes N``,
    or N single workers when the CLI has no ``--processes``. Each in its own session
    (so :func:`stop_process_group` stops it with everything it started). ``metrics``: each
    command gets ``--metrics-port`` (a free port). ``tracing``: they make OpenTelemetry spans
    (``bench_apps`` turns :mod:`bench_tracing` on)."""
    base = [sys.executable, "-m", "workers.cli", "--redis", url, "worker", "--app", "bench_apps"]
    base += ["--cache-size", str(cache_size), "--log-level", "WARNING"] + (["--eager"] if eager else [])
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - closed once they are started
    commands = (
        [base + ["--processes", str(processes)]] if _cli_has_processes() else [base for _ in range(processes)]
    )
    if metrics:
        commands = [[*argv, "--metrics-port", str(_free_port())] for argv in commands]
    procs = []
    try:
        for argv in commands:
            procs.append(
                subprocess.Popen(
                    argv, cwd=ROOT, env=_env(tracing), stdout=out, stderr=out, start_new_session=True
                )
            )
    except BaseException:
        for proc in procs:
            stop_process_group(proc)
        raise
    finally:
        if not isinstance(out, int):  # a file, not subprocess.DEVNULL
            out.close()  # the children hold their own copies
    return procs


def worker_pids(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    """The processes that run workflow code: the workers, not a supervisor above them."""
    pids = []
    for proc in procs:
        below = descendants(proc.pid)
        pids += below if below else [proc.pid]
    return pids


class Engine:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.server: Any = None
        self.store: Any = None
        self.url = ""
        self.workers: list[subprocess.Popen[bytes]] = []
        self.cache_size = 1000
        self._old_url: str | None = None
        self._worker_pids: list[int] = []
        self._loop: asyncio.Runner | None = None  # W2A's event loop, made on first use
        self._limit: Any = None  # the ceiling's ``limit.Limit``, made on first use
        self._inbox: Any = None  # its runs of the step through the inbox (same server)
        self._limit_server: Any = None

    # ----------------------------------------------------------- lifecycle
    def __enter__(self) -> Engine:
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        from durable.store.embedded import EmbeddedRedis
        from durable.store.redis_store import RedisStore

        if getattr(self.options, "cluster", 0):
            # A local Redis Cluster (N masters on loopback), started like the tests' fixture.
            from durable.store.cluster_dev import LocalCluster

            self.server = LocalCluster(
                self.options.tmpdir / "cluster",
                masters=self.options.cluster,
                appendfsync=self.options.appendfsync,
            )
            self.url = self.server.start()
        else:
            self.server = EmbeddedRedis(self.options.tmpdir / "redis", appendfsync=self.options.appendfsync)
            self.url = self.server.ensure()
        self._old_url = os.environ.get("DURABLE_REDIS_URL")
        os.environ["DURABLE_REDIS_URL"] = self.url
        sys.path[:0] = [str(BENCH), str(ROOT)]
        import bench_apps  # noqa: F401 - registers the workflows in this process

        self.store = RedisStore(self.url)
        self._restart_workers(self.cache_size)

    def _restart_workers(self, cache_size: int) -> None:
        self._stop_workers()
        self.cache_size = cache_size
        self.workers = start_workers(
            self.url,
            self.options.processes,
            cache_size=cache_size,
            log=self.options.tmpdir / "workers.log",
            eager=self.options.eager,
            metrics=self.options.metrics,
            tracing=self.options.tracing,
        )
        with self.turn():
            self._warm_up()
        self._worker_pids = worker_pids(self.workers)

    def _warm_up(self) -> None:
        from bench_apps import TenSteps

        from durable import WorkflowStub

        # Imports, script loading, consumer groups; every worker process gets a share.
        stubs = [
            WorkflowStub.make(TenSteps, store=self.store).start(STEPS)
            for _ in range(4 * self.options.processes)
        ]
        for stub in stubs:
            stub.result(timeout=120)

    def _stop_workers(self) -> None:
        for proc in self.workers:
            stop_process_group(proc)
        self.workers = []

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._loop is not None:
                self._loop.close()
            self._stop_limit()
            self._stop_workers()
        finally:
            if self.store is not None:
                self.store.close()
            if self.server is not None:
                self.server.stop()
                if self._old_url is None:
                    os.environ.pop("DURABLE_REDIS_URL", None)
                else:
                    os.environ["DURABLE_REDIS_URL"] = self._old_url

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Around each measured run (the harness's turns): with ``tracing``, this client makes
        spans too (StartWorkflow...), but only during this engine's turns, since engines of
        other modes measured in turns with it share this process."""
        if not self.options.tracing:
            yield
            return
        import bench_tracing  # here, not at the top: it needs the otel extra

        bench_tracing.enable()
        try:
            yield
        finally:
            bench_tracing.disable()

    # ----------------------------------------------------------- workloads
    def w1(self, n_runs: int) -> dict[str, Any]:
        from bench_apps import TenSteps

        from durable import WorkflowStub

        times = []
        for _ in range(n_runs):
            t0 = time.perf_counter()
            result = WorkflowStub.make(TenSteps, store=self.store).start(STEPS).result(timeout=60)
            times.append(time.perf_counter() - t0)
            assert result == STEPS
        return latency_summary(times)

    def w2(self, n_workflows: int) -> dict[str, Any]:
        from bench_apps import TenSteps

        from durable import WorkflowStub

        cpu0 = self._cpu()
        t0 = time.perf_counter()
        stubs = [WorkflowStub.make(TenSteps, store=self.store).start(STEPS) for _ in range(n_workflows)]
        started = time.perf_counter() - t0
        for stub in stubs:
            assert stub.result(timeout=300) == STEPS
        elapsed = time.perf_counter() - t0
        return {
            "seconds": elapsed,
            "workflows_per_s": n_workflows / elapsed,
            "steps_per_s": n_workflows * STEPS / elapsed,
            "start_s": started,
            **self._cpu_spent(cpu0),
        }

    def _cpu(self) -> tuple[float, float, float]:
        """CPU seconds so far of this process (the client), the workers and Redis."""
        info = self.store.redis.info("cpu") if not getattr(self.options, "cluster", 0) else {}
        redis_s = float(info.get("used_cpu_user", 0)) + float(info.get("used_cpu_sys", 0))
        workers_s = sum(cpu_seconds(pid) for pid in self._worker_pids)
        return time.process_time(), workers_s, redis_s

    def _cpu_spent(self, before: tuple[float, float, float]) -> dict[str, float]:
        """CPU seconds since ``before``: where a workload's time went (2 shared cores)."""
        after = self._cpu()
        return {
            f"cpu_{name}_s": round(b - a, 3)
            for name, a, b in zip(("client", "workers", "redis"), before, after, strict=True)
        }

    def w2t(self, n_workflows: int) -> dict[str, Any]:
        """W2 with a client thread per workflow: each starts its run and waits for its result
        at once (a web server's request threads), instead of one client waiting in turn."""
        from bench_apps import TenSteps

        from durable import WorkflowStub

        gate = threading.Barrier(n_workflows + 1)

        def client() -> Any:
            gate.wait()
            return WorkflowStub.make(TenSteps, store=self.store).start(STEPS).result(timeout=300)

        with ThreadPoolExecutor(n_workflows) as pool:
            futures = [pool.submit(client) for _ in range(n_workflows)]
            cpu0 = self._cpu()
            gate.wait()
            t0 = time.perf_counter()
            for future in futures:
                assert future.result() == STEPS
            elapsed = time.perf_counter() - t0
        return {
            "seconds": elapsed,
            "workflows_per_s": n_workflows / elapsed,
            "steps_per_s": n_workflows * STEPS / elapsed,
            "clients": n_workflows,
            **self._cpu_spent(cpu0),
        }

    def w2a(self, n_workflows: int) -> dict[str, Any]:
        """W2 with one asyncio task per workflow on one event loop: each starts its run and
        awaits its result (``AsyncWorkflowStub``), as the handlers of an asyncio web server
        would. The loop lives as long as the engine, like a server's."""
        from bench_apps import TenSteps

        from durable import AsyncWorkflowStub

        async def client(gate: asyncio.Event) -> Any:
            await gate.wait()
            stub = await AsyncWorkflowStub.make(TenSteps, store=self.store).start(STEPS)
            return await stub.result(timeout=300)

        async def clients() -> dict[str, Any]:
            gate = asyncio.Event()
            tasks = [asyncio.create_task(client(gate)) for _ in range(n_workflows)]
            await asyncio.sleep(0)  # every task now waits on the gate
            cpu0 = self._cpu()
            t0 = time.perf_counter()
            gate.set()
            results = await asyncio.gather(*tasks)
            elapsed = time.perf_counter() - t0
            assert results == [STEPS] * n_workflows
            return {
                "seconds": elapsed,
                "workflows_per_s": n_workflows / elapsed,
                "steps_per_s": n_workflows * STEPS / elapsed,
                "clients": n_workflows,
                **self._cpu_spent(cpu0),
            }

        if self._loop is None:
            self._loop = asyncio.Runner()
        return self._loop.run(clients())

    def ceiling(self, seconds: float, runs: int = 64) -> dict[str, Any]:
        """``limit.py``'s "as written" ceiling (:meth:`limit.Limit.as_written`) on a private
        embedded Redis with this engine's ``appendfsync``, for W2 to be read as a fraction
        of it in the same minutes. The runs are made on first call and advance across calls.
        Not for eager workers: their floor is ``limit.py --eager``'s, not measured here."""
        if self.options.eager:
            raise NotMeasured("the ceiling is of the queued step (eager: limit.py --eager)")
        from limit import Limit, busy, cpu

        from durable.store.redis_store import RedisStore

        if self._limit is None:
            self._limit = self._start_limit(runs)
            self._limit.as_written(min(0.5, seconds))  # warm up: scripts, first pass
            # Runs of its own that last across turns (limit.beside() makes new ones per call,
            # and their tasks would share the stream with the last call's leftovers).
            self._inbox = Limit(RedisStore(self._limit_server.ensure(), prefix="limit-inbox"), runs)
            self._inbox.conn = self._limit.conn
            self._inbox.through_inbox(min(0.5, seconds))
        before = cpu(self._limit.store)
        steps, elapsed = self._limit.as_written(seconds)
        load = busy(before, cpu(self._limit.store), elapsed)
        # The step through the inbox (3 commands), as the engine wrote it when issue 18 was
        # filed: its "today ~63-65 %" was of this ceiling.
        inbox_steps, inbox_elapsed = self._inbox.through_inbox(seconds)
        return {
            "steps_per_s": steps / elapsed,
            "steps": steps,
            "seconds": elapsed,
            "runs": runs,
            **load,
            "inbox_steps_per_s": inbox_steps / inbox_elapsed,
        }

    def _start_limit(self, runs: int) -> Any:
        from limit import Limit

        from durable.store.embedded import EmbeddedRedis
        from durable.store.redis_store import RedisStore

        self._limit_server = EmbeddedRedis(
            self.options.tmpdir / "limit", appendfsync=self.options.appendfsync
        )
        store = RedisStore(self._limit_server.ensure(), prefix="limit")
        bench = Limit(store, runs)
        bench.take_connection()
        return bench

    def _stop_limit(self) -> None:
        if self._inbox is not None:
            self._inbox.store.close()
            self._inbox = None
        if self._limit is not None:
            self._limit.close()
            self._limit = None
        if self._limit_server is not None:
            self._limit_server.stop()
            self._limit_server = None

    def w3(self, n_branches: int, repeats: int) -> dict[str, Any]:
        from bench_apps import FanOut

        from durable import WorkflowStub

        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            assert (
                WorkflowStub.make(FanOut, store=self.store).start(n_branches).result(timeout=120)
                == n_branches
            )
            times.append(time.perf_counter() - t0)
        return {"seconds": statistics.median(times), "min_s": min(times), "n": repeats}

    def w4(self, n_samples: int, seconds: float) -> dict[str, Any]:
        from bench_apps import Sleeper

        from durable import WorkflowStub

        extra = []
        for _ in range(n_samples):
            t0 = time.perf_counter()
            WorkflowStub.make(Sleeper, store=self.store).start(seconds).result(timeout=seconds + 60)
            extra.append(time.perf_counter() - t0 - seconds)
        return {"overhead_s": statistics.median(extra), "max_s": max(extra), "n": n_samples}

    def w5(self, n_samples: int) -> dict[str, Any]:
        from bench_apps import WaitSignal

        from durable import WorkflowStub

        times = []
        for i in range(n_samples):
            stub = WorkflowStub.make(WaitSignal, store=self.store).start()
            wait_for(lambda s=stub: s.status() == "suspended", 30, what="the run to wait on its signal")
            t0 = time.perf_counter()
            stub.signal("go", i)
            assert stub.result(timeout=30) == i
            times.append(time.perf_counter() - t0)
        return {"p50_s": statistics.median(times), "min_s": min(times), "n": n_samples}

    def w6(self, sizes: list[int]) -> dict[str, Any]:
        """Cost of one decision on a run with N events in history, cache hit vs no cache.

        One run of ``TenSteps(max(sizes)/2 + 60)`` is driven by Deciders in this
        process (key prefix ``bench-w6``, invisible to the worker processes): a
        default-cache Decider builds the history; at each size it times 21
        decisions with the cache, then 3 decisions of a ``cache_size=0`` Decider
        (full replay each). Timed: ``Decider.handle`` = load + replay/apply + commit,
        with the garbage collector set up as in a worker process (``tune_gc``).
        """
        import gc

        from bench_apps import TenSteps

        from durable import WorkflowStub
        from durable.store.keys import GROUP
        from durable.store.redis_store import RedisStore
        from workers.attempts import run_activity
        from workers.decider import Decider
        from workers.worker import tune_gc

        store = RedisStore(self.url, prefix="bench-w6")
        # Decide as a worker process does: with its garbage-collector settings.
        threshold = gc.get_threshold()
        tune_gc(10_000)
        try:
            steps = max(sizes) // 2 + 60  # room for the timed decisions past the largest size
            stub = WorkflowStub.make(TenSteps, store=store).start(steps)
            keys = store.keys
            p = keys.partition(stub.id)
            wq, aq = keys.workflow_tasks(p, "default"), keys.activity_tasks(p, "default")
            store.ensure_groups([wq, aq])
            r = store.redis

            def read(stream: str) -> tuple[str, dict[bytes, bytes]]:
                resp = r.xreadgroup(GROUP, "bench-w6", {stream: ">"}, count=1, block=5000)
                entry_id, fields = resp[0][1][0]
                return entry_id.decode(), fields

            def step(decider: Decider) -> float:
                entry_id, fields = read(wq)
                t0 = time.perf_counter()
                decider.handle(p, wq, entry_id, fields)
                dt = time.perf_counter() - t0
                entry_id, fields = read(aq)
                run_activity(store, aq, entry_id, fields)
                return dt

            def seq() -> int:
                return int(r.hget(keys.run(p, stub.run_id), "seq"))

            cached = Decider(store, cache_size=1000)
            out: dict[str, Any] = {}
            for size in sorted(sizes):
                while seq() < size - 1:
                    step(cached)
                at = seq()
                hit = statistics.median(step(cached) for _ in range(21))
                uncached = Decider(store, cache_size=0)
                miss = statistics.median(step(uncached) for _ in range(3))
                out[size] = {"events": at, "cached_s": hit, "uncached_s": miss}
            stub.terminate("benchmark done")
            return {"sizes": out}
        finally:
            gc.unfreeze()
            gc.set_threshold(*threshold)
            store.close()

    def w7(self, n_runs: int) -> dict[str, Any]:
        """Memory per waiting run (Redis, workers with the runs cached) and wake-up rate."""
        from bench_apps import WaitSignal

        from durable import WorkflowStub

        self._restart_workers(n_runs + 1000)
        r = self.store.redis
        keys = self.store.keys

        def memory() -> tuple[int, int]:
            return int(r.info("memory")["used_memory"]), sum(
                rss_bytes(pid) for pid in worker_pids(self.workers)
            )

        def count(status: str, stubs: list[Any]) -> int:
            with r.pipeline(transaction=False) as pipe:
                for stub in stubs:
                    pipe.hget(keys.run(keys.partition(stub.id), stub.run_id), "status")
                return sum(1 for s in pipe.execute() if s == status.encode())

        time.sleep(1.0)
        redis0, rss0 = memory()
        t0 = time.perf_counter()
        stubs = [WorkflowStub.make(WaitSignal, store=self.store).start() for _ in range(n_runs)]
        started = time.perf_counter() - t0
        wait_for(lambda: count("suspended", stubs) == n_runs, 600, interval=0.25, what="all runs suspended")
        time.sleep(1.0)
        redis1, rss1 = memory()
        # Where the bytes go: MEMORY USAGE of one waiting run's keys (the rest is shared structure).
        sample = stubs[0]
        sp = keys.partition(sample.id)
        per_key = {
            name: r.memory_usage(key, samples=0) or 0
            for name, key in {
                "instance": keys.instance(sp, sample.id),
                "run": keys.run(sp, sample.run_id),
                "history": keys.history(sp, sample.run_id),
                "inbox": keys.inbox(sp, sample.run_id),
                "activities": keys.activities(sp, sample.run_id),
                "log": keys.log(sp, sample.run_id),
            }.items()
        }

        t0 = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda s: s.signal("go", 1), stubs, chunksize=64))
        sent = time.perf_counter() - t0
        wait_for(lambda: count("completed", stubs) == n_runs, 600, interval=0.05, what="all runs completed")
        woke = time.perf_counter() - t0
        self._restart_workers(1000)
        return {
            "redis_bytes_per_run": (redis1 - redis0) / n_runs,
            "redis_keys_of_one_run": per_key,
            "worker_bytes_per_run": (rss1 - rss0) / n_runs,
            "wakes_per_s": n_runs / woke,
            "wake_s": woke,
            "signal_send_s": sent,
            "start_s": started,
            "n": n_runs,
        }
