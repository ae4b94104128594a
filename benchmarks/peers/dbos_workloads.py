"""DBOS's side of the benchmark workloads (see ``common.py`` for the shared surface).

The engine: the ``dbos`` library in this process with a SQLite system database
in the engine's temp dir (DBOS is a library: its "worker" is the launched
process itself). Steps are no-op ``@DBOS.step`` functions.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from .common import STEPS, NotMeasured, Options, latency_summary

NAME = "dbos"


def unavailable() -> str | None:
    try:
        import dbos  # noqa: F401
    except ImportError as exc:
        return f"dbos is not installed ({exc}); pip install -e '.[bench]'"
    return None


class Engine:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.launched = False

    def __enter__(self) -> Engine:
        from dbos import DBOS

        from . import dbos_apps  # registers the workflows before launch

        db = self.options.tmpdir / "dbos.sqlite"
        DBOS(
            config={"name": "durable-bench", "system_database_url": f"sqlite:///{db}", "log_level": "WARNING"}
        )
        try:
            DBOS.launch()
            self.launched = True
            DBOS.register_queue(dbos_apps.FANOUT_QUEUE)
            self.w1(2)  # warm up
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        from dbos import DBOS

        try:
            DBOS.destroy(destroy_registry=False)
        except Exception:  # noqa: BLE001 - nothing was launched
            if self.launched:
                raise

    # ----------------------------------------------------------- workloads
    def w1(self, n_runs: int) -> dict[str, Any]:
        from dbos import DBOS

        from .dbos_apps import ten_steps

        times = []
        for _ in range(n_runs):
            t0 = time.perf_counter()
            assert DBOS.start_workflow(ten_steps, STEPS).get_result() == STEPS
            times.append(time.perf_counter() - t0)
        return latency_summary(times)

    def w2(self, n_workflows: int) -> dict[str, Any]:
        from dbos import DBOS

        from .dbos_apps import ten_steps

        t0 = time.perf_counter()
        handles = [DBOS.start_workflow(ten_steps, STEPS) for _ in range(n_workflows)]
        started = time.perf_counter() - t0
        assert all(h.get_result() == STEPS for h in handles)
        elapsed = time.perf_counter() - t0
        return {
            "seconds": elapsed,
            "workflows_per_s": n_workflows / elapsed,
            "steps_per_s": n_workflows * STEPS / elapsed,
            "start_s": started,
        }

    def w3(self, n_branches: int, repeats: int) -> dict[str, Any]:
        from dbos import DBOS

        from .dbos_apps import fan_out

        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            assert DBOS.start_workflow(fan_out, n_branches).get_result() == n_branches
            times.append(time.perf_counter() - t0)
        return {"seconds": statistics.median(times), "min_s": min(times), "n": repeats}

    def w4(self, n_samples: int, seconds: float) -> dict[str, Any]:
        from dbos import DBOS

        from .dbos_apps import sleeper

        extra = []
        for _ in range(n_samples):
            t0 = time.perf_counter()
            DBOS.start_workflow(sleeper, seconds).get_result()
            extra.append(time.perf_counter() - t0 - seconds)
        return {"overhead_s": statistics.median(extra), "max_s": max(extra), "n": n_samples}

    def w5(self, n_samples: int) -> dict[str, Any]:
        from dbos import DBOS

        from .dbos_apps import wait_signal

        times = []
        for i in range(n_samples):
            handle = DBOS.start_workflow(wait_signal)
            # DBOS records recv() only when it returns, so there is nothing to poll for:
            # give the workflow thread time to enter recv() (not timed).
            time.sleep(0.3)
            t0 = time.perf_counter()
            DBOS.send(handle.workflow_id, i, topic="go")
            assert handle.get_result() == i
            times.append(time.perf_counter() - t0)
        return {"p50_s": statistics.median(times), "min_s": min(times), "n": n_samples}

    def w6(self, sizes: list[int]) -> dict[str, Any]:
        raise NotMeasured("not implemented for DBOS")

    def w7(self, n_runs: int) -> dict[str, Any]:
        raise NotMeasured("not implemented for DBOS")
