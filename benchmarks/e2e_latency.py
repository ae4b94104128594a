"""End-to-end latency of a 10-activity workflow on the embedded Redis (issue: runtime).

Starts a private embedded Redis (AOF everysec) in a temp dir and one worker, then
runs a workflow of 10 sequential no-op activities N times, one after another, and
prints the median and p95 from `start()` to `result()`.

    python benchmarks/e2e_latency.py                 # worker in a separate process
    python benchmarks/e2e_latency.py --inproc        # worker thread in this process
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from bench_apps import TenSteps  # noqa: E402

from durable import WorkflowStub  # noqa: E402
from durable.store.embedded import EmbeddedRedis  # noqa: E402
from durable.store.redis_store import RedisStore  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--inproc", action="store_true", help="run the worker as a thread of this process")
    parser.add_argument("--appendfsync", default="everysec", choices=["everysec", "always"])
    parser.add_argument("--eager", action="store_true", help="worker in eager mode")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="durable-bench-") as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis", appendfsync=args.appendfsync)
        url = server.ensure()
        os.environ["DURABLE_REDIS_URL"] = url
        proc = None
        thread = None
        try:
            store = RedisStore(url)
            if args.inproc:
                from workers.worker import Worker, WorkerThread

                thread = WorkerThread(Worker(store, block_ms=1000, eager=args.eager))
                thread.__enter__()
            else:
                env = dict(os.environ, PYTHONPATH=f"{ROOT / 'benchmarks'}{os.pathsep}{ROOT}")
                proc = subprocess.Popen(
                    [sys.executable, "-m", "workers.cli", "worker", "--app", "bench_apps"]
                    + (["--eager"] if args.eager else []),
                    cwd=ROOT,
                    env=env,
                )
            # Warm up: imports, script loading, consumer groups, the worker's first pass.
            for _ in range(3):
                WorkflowStub.make(TenSteps, store=store).start(10).result(timeout=30)
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                assert WorkflowStub.make(TenSteps, store=store).start(10).result(timeout=30) == 10
                times.append(time.perf_counter() - t0)
            times.sort()
            p95 = times[max(0, int(round(0.95 * len(times))) - 1)]
            mode = "in-process worker thread" if args.inproc else "1 worker process"
            mode += ", eager" if args.eager else ""
            print(f"10-activity workflow, {args.runs} runs, {mode}, appendfsync {args.appendfsync}")
            print(
                f"  median {statistics.median(times) * 1000:.1f} ms   p95 {p95 * 1000:.1f} ms   "
                f"min {times[0] * 1000:.1f} ms"
            )
        finally:
            if thread is not None:
                thread.__exit__(None, None, None)
            if proc is not None:
                proc.terminate()
                proc.wait(20)
            server.stop()


if __name__ == "__main__":
    main()
