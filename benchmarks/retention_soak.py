"""Retention soak (issue 14 item 4): runs complete continuously while the scheduler purges them.

Starts a private embedded Redis (AOF everysec) in a temp dir (or uses ``--redis URL``) and one
worker process (``durable worker --app bench_apps --retention R``), then:

1. **sizing**: completes ``--sizing`` 10-activity runs under the default retention (nothing
   purged yet) and prints Redis ``used_memory`` and AOF bytes per closed run, then
   ``durable purge``'s function removes them all and prints what memory came back;
2. **soak**: for ``--minutes`` keeps ``--inflight`` runs going (start a batch, wait for it,
   repeat) with the short retention ``--retention`` and prints a sample every ``--every``
   seconds: elapsed, runs completed, ``used_memory``, closed runs waiting for purge, keys;
   ``--rate`` caps the runs per second (a steady load that leaves the machine some CPU).

    python benchmarks/retention_soak.py --minutes 10 --retention 30s
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from bench_apps import TenSteps  # noqa: E402

from durable import WorkflowStub  # noqa: E402
from durable.retention import parse_duration  # noqa: E402
from durable.store.embedded import EmbeddedRedis  # noqa: E402
from durable.store.redis_store import RedisStore  # noqa: E402
from durable.store.retention import purge_closed_before, set_namespace_retention  # noqa: E402


def run_batch(store: RedisStore, n: int) -> int:
    stubs = [WorkflowStub.make(TenSteps, store=store).start(10) for _ in range(n)]
    for stub in stubs:
        assert stub.result(timeout=120) == 10
    return n


def memory(store: RedisStore) -> tuple[int, int]:
    info = store.redis.info()
    return int(info["used_memory"]), int(info.get("aof_current_size", 0))


def closed_waiting(store: RedisStore) -> int:
    with store.redis.pipeline(transaction=False) as pipe:
        for p in range(store.keys.partitions):
            pipe.zcard(store.keys.closed(p))
        return sum(pipe.execute())


def settle(store: RedisStore) -> tuple[int, int]:
    time.sleep(2.0)  # the worker's last acks, lazy frees of UNLINKed keys
    return memory(store)


def sizing(store: RedisStore, runs: int, inflight: int) -> float:
    run_batch(store, inflight)  # warm up: groups, scripts, the worker's caches
    mem0, aof0 = settle(store)
    done = 0
    while done < runs:
        done += run_batch(store, min(inflight, runs - done))
    mem1, aof1 = settle(store)
    print(f"sizing: {runs} closed 10-activity runs retained")
    print(f"  used_memory +{(mem1 - mem0) / runs:,.0f} B/run   AOF +{(aof1 - aof0) / runs:,.0f} B/run")
    report = purge_closed_before(store, int(time.time() * 1000) + 60_000)
    mem2, _ = settle(store)
    print(
        f"  durable purge: {report.total_runs} runs, {report.instances} instances, {report.events} events; "
        f"used_memory {mem1:,} -> {mem2:,} B ({(mem1 - mem2) / max(1, report.total_runs):,.0f} B/run freed)"
    )
    return (mem1 - mem0) / runs


def soak(store: RedisStore, minutes: float, inflight: int, every: float, rate: float) -> list[dict[str, Any]]:
    samples: list[dict[str, Any]] = []
    completed = [0]
    stop = threading.Event()
    t0 = time.monotonic()

    def sampler() -> None:
        while not stop.is_set():
            mem, aof = memory(store)
            sample = {
                "t": time.monotonic() - t0,
                "runs": completed[0],
                "used_memory": mem,
                "aof": aof,
                "closed": closed_waiting(store),
                "keys": int(store.redis.dbsize()),
            }
            samples.append(sample)
            print(
                f"  {sample['t']:6.0f} s  runs {sample['runs']:7,}  used_memory {mem / 1e6:7.2f} MB  "
                f"closed-waiting {sample['closed']:6,}  keys {sample['keys']:7,}  AOF {aof / 1e6:7.1f} MB",
                flush=True,
            )
            stop.wait(every)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        while time.monotonic() - t0 < minutes * 60:
            completed[0] += run_batch(store, inflight)
            if rate > 0:  # hold the pace: a steady load, and CPU left for the machine's other work
                ahead = completed[0] / rate - (time.monotonic() - t0)
                if ahead > 0:
                    stop.wait(ahead)
    finally:
        stop.set()
        thread.join()
    return samples


def summary(samples: list[dict[str, Any]], retention_s: float, per_run: float) -> None:
    steady = [s for s in samples if s["t"] >= 2 * retention_s + 20]
    if len(steady) < 4:
        print("too short for a steady-state summary")
        return
    third = len(steady) // 3
    first = statistics.mean(s["used_memory"] for s in steady[:third])
    last = statistics.mean(s["used_memory"] for s in steady[-third:])
    span = steady[-1]["t"] - steady[0]["t"]
    runs = steady[-1]["runs"] - steady[0]["runs"]
    mems = [s["used_memory"] for s in steady]
    print(
        f"steady state ({span:.0f} s, {runs:,} runs, {runs / span:.1f} runs/s): used_memory "
        f"min {min(mems) / 1e6:.2f} MB, max {max(mems) / 1e6:.2f} MB; mean of first third "
        f"{first / 1e6:.2f} MB, last third {last / 1e6:.2f} MB ({(last - first) / 1e6:+.2f} MB)"
    )
    total = samples[-1]["runs"]
    print(
        f"  without retention the {total:,} runs would have added ~{total * per_run / 1e6:.0f} MB "
        f"(at {per_run:,.0f} B per closed run)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis", default=None, help="Redis URL (default: a private embedded server)")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--retention", default="30s", help="namespace retention during the soak")
    parser.add_argument("--inflight", type=int, default=20, help="runs started per batch")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--rate", type=float, default=50.0, help="runs per second at most (0: no limit)")
    parser.add_argument("--sizing", type=int, default=300, help="runs of the sizing phase (0: skip)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="durable-soak-") as tmp:
        server = None
        url = args.redis
        if url is None:
            server = EmbeddedRedis(Path(tmp) / "redis")
            url = server.ensure()
        os.environ["DURABLE_REDIS_URL"] = url
        store = RedisStore(url)
        env = dict(os.environ, PYTHONPATH=f"{ROOT / 'benchmarks'}{os.pathsep}{ROOT}")
        worker = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "worker", "--app", "bench_apps", "--log-level", "WARNING"],
            cwd=ROOT,
            env=env,
        )
        try:
            per_run = sizing(store, args.sizing, args.inflight) if args.sizing else 10_000.0
            set_namespace_retention(store, args.retention)
            print(
                f"soak: {args.minutes} min, retention {args.retention}, batches of {args.inflight} runs, "
                f"at most {args.rate} runs/s"
            )
            samples = soak(store, args.minutes, args.inflight, args.every, args.rate)
            summary(samples, parse_duration(args.retention), per_run)
        finally:
            worker.terminate()
            worker.wait(30)
            store.close()
            if server is not None:
                server.stop()


if __name__ == "__main__":
    main()
