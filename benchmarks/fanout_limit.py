"""The largest ``all()`` fan-out that works, and the longest Redis script it runs (SLOWLOG).

A decision's commit is one Lua script: it appends the decision's events and enqueues its
activity tasks atomically, and Redis runs nothing else meanwhile. A 100,000-branch
``all()`` once made one 29 s script that blocked every client. ``max_pending_activities``
(default 2,000, :mod:`durable.limits`) bounds what one decision can schedule; this
benchmark checks that a fan-out at the cap keeps every script far below ~100 ms.

For each size it starts one ``FanOut(n)`` run (``n`` no-op activities in one ``all()``) on
a private embedded Redis with one in-process worker, waits for it, and reads SLOWLOG
(every command slower than 1 ms): the longest entry, and which script it was. A size above
the cap is expected to end ``terminated`` with a reason naming the limit. ``--cap`` raises
the limit to explore beyond the default (how script time grows with the fan-out).

    python benchmarks/fanout_limit.py [--sizes 500,1000,2000,2001] [--cap 2000] [--timeout 300]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]

from bench_apps import FanOut  # noqa: E402

from durable import Limits, WorkflowFailed  # noqa: E402
from durable.limits import set_limits  # noqa: E402
from durable.store.embedded import EmbeddedRedis  # noqa: E402
from durable.store.redis_store import RedisStore  # noqa: E402
from durable.testing import TestEnvironment  # noqa: E402

BUDGET_MS = 100.0


def _script_names(store: RedisStore) -> dict[str, str]:
    return {script.sha: name for name, script in store._scripts.items()}


def _slowest(store: RedisStore) -> tuple[float, str]:
    """(ms, command) of the slowest SLOWLOG entry since the last reset."""
    names = _script_names(store)
    best: tuple[float, str] = (0.0, "-")
    for entry in store.redis.slowlog_get(1024):
        ms = entry["duration"] / 1000
        args = [a.decode() if isinstance(a, bytes) else str(a) for a in entry["command"].split()[:2]]
        what = args[0] if args else "?"
        if what.upper() == "EVALSHA" and len(args) > 1:
            what = f"{names.get(args[1], args[1][:8])}.lua"
        if ms > best[0]:
            best = (ms, what)
    return best


def _one(env: TestEnvironment, store: RedisStore, n: int, timeout: float) -> dict[str, Any]:
    store.redis.slowlog_reset()
    started = time.perf_counter()
    stub = env.start(FanOut, n)
    outcome = "completed"
    try:
        stub.result(timeout=timeout)
    except WorkflowFailed as exc:
        outcome = f"{exc.status}: {str(exc)[:110]}"
    seconds = time.perf_counter() - started
    ms, what = _slowest(store)
    return {"n": n, "outcome": outcome, "seconds": seconds, "slowest_ms": ms, "slowest": what}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="500,1000,2000,2001")
    parser.add_argument("--cap", type=int, default=Limits().max_pending_activities)
    parser.add_argument("--timeout", type=float, default=300.0)
    opts = parser.parse_args()
    sizes = [int(s) for s in opts.sizes.split(",") if s]
    set_limits(Limits(max_pending_activities=opts.cap))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis")
        server.ensure()
        try:
            store = RedisStore(server.url)
            store.redis.config_set("slowlog-log-slower-than", 1000)
            store.redis.config_set("slowlog-max-len", 1024)
            with TestEnvironment(store=store, flush=True) as env:
                for n in sizes:
                    row = _one(env, store, n, opts.timeout)
                    rows.append(row)
                    print(
                        f"fan-out {n:>6}: {row['outcome'][:60]:<60} {row['seconds']:7.2f} s   "
                        f"longest script {row['slowest_ms']:7.1f} ms ({row['slowest']})",
                        flush=True,
                    )
        finally:
            server.stop()
    worked = [r for r in rows if r["outcome"] == "completed"]
    largest = max((r["n"] for r in worked), default=0)
    longest = max((r["slowest_ms"] for r in rows), default=0.0)
    print(f"\nmax_pending_activities = {opts.cap}")
    print(f"largest fan-out that completed: {largest}")
    print(f"longest script seen (SLOWLOG): {longest:.1f} ms (budget {BUDGET_MS:.0f} ms)")


if __name__ == "__main__":
    main()
