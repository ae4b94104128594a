"""Schedules at scale: N schedules firing together, what they cost the scheduler and Redis.

Creates ``--schedules`` schedules (default 1,000) every ``--every`` seconds (default 5 s; all
aligned, so they fire in the same instant like 1,000 ``every 1m`` schedules do at :00), runs
``--schedulers`` scheduler loops (the worker's ``SchedulePass``, threads of this process)
for ``--seconds``, and prints:

* scheduler CPU: thread CPU seconds per fired time (claim + start + settle), and the share of
  one core that 1,000 schedules every minute would take;
* Redis memory per schedule (``used_memory`` before and after creating them; then after the
  run, with the recent-actions lists filled; the started runs are counted apart);
* lateness of each start after its scheduled time, p50/p99/max (from the started actions).

No worker runs the started workflows (they stay pending): only the schedules are measured.
Runs on a fresh embedded Redis in a temporary dir::

    python benchmarks/schedules_bench.py                      # 1,000 x every 5 s for 60 s
    python benchmarks/schedules_bench.py --schedules 200 --seconds 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from durable import Schedule, ScheduleHandle
from durable.schedule_pass import SchedulePass
from durable.store.embedded import EmbeddedRedis
from durable.store.redis_store import RedisStore


def _loop(sched: SchedulePass, stop: threading.Event, cpu: list[float]) -> None:
    """What workers/scheduler.py does: a pass, then sleep until the soonest next time (<= 1 s)."""
    t0 = time.thread_time()
    while not stop.is_set():
        soonest = sched.tick()
        wait = 1.0 if soonest is None else min(1.0, max(0.0, soonest / 1000 - time.time()))
        stop.wait(wait)
    cpu.append(time.thread_time() - t0)


def _pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))]) if ordered else float("nan")


def run(schedules: int, every: float, seconds: float, schedulers: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis")
        url = server.ensure()
        try:
            store = RedisStore(url, flush=True)
            before = int(store.redis.info("memory")["used_memory"])
            ids = [f"s{i:05d}" for i in range(schedules)]
            for sid in ids:
                ScheduleHandle.create(
                    sid,
                    Schedule(workflow="BenchNoop", args=(sid,), every=every, overlap="allow_all"),
                    store=store,
                )
            created = int(store.redis.info("memory")["used_memory"])
            passes = [SchedulePass(RedisStore(url)) for _ in range(schedulers)]
            stop = threading.Event()
            cpu: list[float] = []
            threads = [threading.Thread(target=_loop, args=(p, stop, cpu)) for p in passes]
            for t in threads:
                t.start()
            time.sleep(seconds)
            stop.set()
            for t in threads:
                t.join()
            fired = sum(p.started for p in passes)
            late: list[int] = []
            fired_times = 0
            for sid in ids:
                desc = ScheduleHandle(sid, store=store).describe(runs=False)
                fired_times += desc.fired
                late += [a["late_ms"] for a in desc.recent_actions if a["action"] == "started"]
            after = int(store.redis.info("memory")["used_memory"])
            sample = ids[: min(50, len(ids))]
            schedule_bytes = [
                sum(
                    int(store.redis.memory_usage(k) or 0)
                    for k in store.keys.schedule_keys(store.keys.partition(sid), sid)[:6]
                    if store.redis.exists(k)
                )
                for sid in sample
            ]
            cpu_per_fire = sum(cpu) / max(1, fired)
            store.close()
            return {
                "schedules": schedules,
                "every_s": every,
                "seconds": seconds,
                "schedulers": schedulers,
                "runs_started": fired,
                "times_fired": fired_times,
                "scheduler_cpu_s": round(sum(cpu), 3),
                "cpu_ms_per_fire": round(cpu_per_fire * 1000, 3),
                "cpu_share_1000_per_minute": round(cpu_per_fire * 1000 / 60, 4),
                "redis_bytes_per_schedule_created": (created - before) // max(1, schedules),
                "redis_bytes_per_schedule_keys_after": int(statistics.mean(schedule_bytes))
                if schedule_bytes
                else 0,
                "redis_bytes_per_started_run": (after - created) // max(1, fired),
                "late_ms_p50": _pct(late, 0.50),
                "late_ms_p99": _pct(late, 0.99),
                "late_ms_max": max(late) if late else None,
                "late_samples": len(late),
            }
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--every", type=float, default=5.0, help="seconds between a schedule's times")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--schedulers", type=int, default=1)
    args = parser.parse_args()
    print(json.dumps(run(args.schedules, args.every, args.seconds, args.schedulers), indent=2))


if __name__ == "__main__":
    main()
