"""Replay driver benchmark (plain script, prints its figures).

(a) full replay of a ~10,000-event history (a workflow of 5,000 sequential
    activities, history built with the simulator): decode and replay timed
    separately, median of 5;
(b) one new event on a live (cached) driver: microseconds per decision on a
    long-lived driver, averaged over 2,000 decisions of one completion each.

Run: ``PYTHONPATH=. python benchmarks/replay_bench.py``
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from durable import Workflow, activity, codec  # noqa: E402
from durable import events as ev  # noqa: E402
from durable.replay import Driver  # noqa: E402
from tests.sim import Sim  # noqa: E402

STEPS = 5_000


def bench_step(i: int) -> int:
    return i + 1


class BenchLoop(Workflow):
    def handle(self, n: int) -> int:
        total = 0
        for i in range(n):
            total += activity(bench_step, i)
        return total


def build_history(n: int) -> Sim:
    sim = Sim(BenchLoop, (n,), compare=False)
    sim.decide()
    while sim.closing is None:
        (aid,) = list(sim.pending_activities)
        sim.complete(aid)
        sim.decide()
    sim.close()
    return sim


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    t0 = time.perf_counter()
    sim = build_history(STEPS)
    raws = [e.raw for e in sim.history]
    print(
        f"history: {len(raws)} events ({sum(map(len, raws)) / 1024:.0f} KiB), built in {time.perf_counter() - t0:.2f} s"
    )
    assert codec.loads(sim.closing.result) == sum(range(1, STEPS + 1))  # type: ignore[union-attr]

    decode_times, replay_times = [], []
    for _ in range(5):
        entries: list[ev.Entry] = []
        decode_times.append(
            timed(lambda es=entries: es.extend(ev.decode(r, seq=i) for i, r in enumerate(raws, 1)))
        )
        driver = Driver(run_id=sim.run_id, workflow_id=sim.workflow_id)
        replay_times.append(timed(lambda d=driver, es=entries: d.replay(es)))
        assert driver.status == "completed"
        driver.close()
    dec, rep = statistics.median(decode_times), statistics.median(replay_times)
    print(
        f"(a) full replay of {len(raws)} events: decode {dec * 1000:.1f} ms + replay {rep * 1000:.1f} ms "
        f"= {(dec + rep) * 1000:.1f} ms (median of 5)"
    )

    # (b) a long-lived driver, one completion per decision.
    decisions = 2_000
    live = Sim(BenchLoop, (decisions + 10,), compare=False)
    live.decide()
    driver = live.driver
    assert driver is not None
    seq = live.history[-1].seq
    pending = live.decisions[-1].activities[0]
    ts = live.clock
    apply_s = 0.0
    decode_s = 0.0
    gc.collect()
    for _ in range(decisions):
        ts += 1
        raw = ev.encode(
            ev.ActivityCompleted(id=pending.id, result=codec.dumps(bench_step(codec.loads(pending.args)[0]))),
            ts,
        )
        t0 = time.perf_counter()
        item = ev.decode(raw)
        t1 = time.perf_counter()
        d = driver.decide([item])
        driver.committed()
        t2 = time.perf_counter()
        decode_s += t1 - t0
        apply_s += t2 - t1
        seq += len(d.events)
        (pending,) = d.activities
    live.close()
    print(
        f"(b) one new event on a live driver: {apply_s / decisions * 1e6:.1f} us per decision "
        f"(+ {decode_s / decisions * 1e6:.1f} us to decode the inbox item), mean of {decisions}"
    )


if __name__ == "__main__":
    main()
