"""Where a W2 turn goes: while the client starts its runs, and after.

W2 starts N workflows from one client thread, one ``start()`` after another, then waits for
their results. ``limit.py``'s ceiling is a steady state: runs that exist already, stepping in
lock step. This script splits each W2 turn at the moment the client's last ``start()``
returned and reads, from the runs' own histories (``WorkflowStub.history()``: the
``ts`` of each ``ActivityCompleted``), how many steps completed in each part:

  starting  from the first start() to the last one returning (the client busy starting runs;
            the workers decide first decisions and the steps of runs started already)
  after     from then to the last result

and prints the steps/s of each part beside the ceiling measured in turns with it (same
minutes, same ``appendfsync``), so "W2 / ceiling" can be read as the sum of its parts, and the
client's CPU per ``start()`` and per ``result()`` (this process's, so the waiter thread's too).
The events' timestamps are the deciding worker's clock (ms) and the split is this process's:
on one machine, the same clock.

    python benchmarks/w2_phases.py [--workflows 200] [--turns 5] [--processes 2] [--no-ceiling]
                                   [--appendfsync everysec|always]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from peers.common import STEPS, Options, exit_on_sigterm  # noqa: E402
from workloads_durable import Engine  # noqa: E402


def turn(engine: Engine, n_workflows: int) -> dict[str, float]:
    """One W2 turn (as ``Engine.w2``), split at the last start (module docstring)."""
    from bench_apps import TenSteps

    from durable import WorkflowStub

    began, cpu0 = time.time(), time.process_time()
    stubs = [WorkflowStub.make(TenSteps, store=engine.store).start(STEPS) for _ in range(n_workflows)]
    started, cpu1 = time.time(), time.process_time()
    for stub in stubs:
        assert stub.result(timeout=300) == STEPS
    ended, cpu2 = time.time(), time.process_time()
    done = [e.ts / 1000 for s in stubs for e in s.history() if e.type == "ActivityCompleted"]
    assert len(done) == n_workflows * STEPS, f"{len(done)} steps completed, not {n_workflows * STEPS}"
    while_starting = sum(1 for t in done if t < started)
    return {
        "steps_per_s": len(done) / (ended - began),
        "starting_s": started - began,
        "after_s": ended - started,
        "starting_steps_per_s": while_starting / (started - began),
        "after_steps_per_s": (len(done) - while_starting) / (ended - started),
        "share_starting": (started - began) / (ended - began),
        "client_us_per_start": (cpu1 - cpu0) / n_workflows * 1e6,
        "client_us_per_result": (cpu2 - cpu1) / n_workflows * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workflows", type=int, default=200)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=2.0, help="of each ceiling turn")
    parser.add_argument("--no-ceiling", action="store_true")
    parser.add_argument("--appendfsync", choices=["everysec", "always"], default="everysec")
    args = parser.parse_args()
    turns: list[dict[str, Any]] = []
    ceilings: list[float] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        Engine(Options(tmpdir=Path(tmp), processes=args.processes, appendfsync=args.appendfsync)) as engine,
    ):
        engine.w2(args.workflows)  # warm: drivers cached, scripts loaded
        for i in range(1, args.turns + 1):
            t = turn(engine, args.workflows)
            turns.append(t)
            line = (
                f"turn {i}: W2 {t['steps_per_s']:,.0f} steps/s; starting {t['starting_s'] * 1000:.0f} ms "
                f"({t['share_starting']:.0%} of the turn) at {t['starting_steps_per_s']:,.0f} steps/s, "
                f"after {t['after_s'] * 1000:.0f} ms at {t['after_steps_per_s']:,.0f} steps/s"
            )
            if not args.no_ceiling:
                ceilings.append(engine.ceiling(args.seconds)["steps_per_s"])
                line += f"; ceiling {ceilings[-1]:,.0f}"
            print(line, flush=True)
    med = {k: statistics.median(t[k] for t in turns) for k in turns[0]}
    print(
        f"median of {len(turns)}: W2 {med['steps_per_s']:,.0f} steps/s; starting {med['starting_s'] * 1000:.0f} ms "
        f"({med['share_starting']:.0%}) at {med['starting_steps_per_s']:,.0f} steps/s; after the starts "
        f"{med['after_steps_per_s']:,.0f} steps/s; the client's CPU per start() {med['client_us_per_start']:.0f} µs, "
        f"per result() {med['client_us_per_result']:.0f} µs"
    )
    if ceilings:
        per_turn = [
            (t["steps_per_s"] / c, t["starting_steps_per_s"] / c, t["after_steps_per_s"] / c)
            for t, c in zip(turns, ceilings, strict=True)
        ]
        w2, starting, after = (statistics.median(r[i] for r in per_turn) for i in range(3))
        print(
            f"against the ceiling ({statistics.median(ceilings):,.0f} steps/s, median): W2 {w2:.0%}; "
            f"while starting {starting:.0%}; after the starts {after:.0%} (medians of per-turn ratios)"
        )


if __name__ == "__main__":
    exit_on_sigterm()
    main()
