"""Activity heartbeats: what ``heartbeat()`` costs the activity's code, and how many Redis writes
a loop of them makes (plain script, prints its figures).

One thread activity calls ``self.context.heartbeat(i)`` for each of N items in a tight loop, on
an in-process worker over an embedded Redis; three turns. Heartbeats are throttled (one write per
interval, ``workers.heartbeats``): the figure to compare is microseconds per call and the Redis
script calls the loop made, against N (one write per call before the throttle).

Run: ``PYTHONPATH=. python benchmarks/heartbeat_bench.py [N]``
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from durable import Activity, Workflow, activity  # noqa: E402
from durable.testing import TestEnvironment  # noqa: E402


class BenchBeats(Activity):
    heartbeat_timeout = 5

    def handle(self, n: int) -> float:
        began = time.perf_counter()
        for i in range(n):
            self.context.heartbeat(i)
        return time.perf_counter() - began


class BenchBeatsFlow(Workflow):
    def handle(self, n: int) -> float:
        return float(activity(BenchBeats, n))


def _scripts(env: TestEnvironment) -> int:
    return int(env.store.redis.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def main(n: int) -> None:
    with TestEnvironment() as env:
        for turn in range(3):
            before = _scripts(env)
            took = env.start(BenchBeatsFlow, n).result(timeout=300)
            calls = _scripts(env) - before
            print(
                f"turn {turn + 1}: {n:,} heartbeats in {took:.3f} s, {took / n * 1e6:.1f} us each; "
                f"Redis script calls during the run: {calls:,} (the run's own steps included)"
            )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5_000)
