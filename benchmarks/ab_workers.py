"""W2 with the workers of two checkouts, in alternating turns: is a change to the worker faster?

Machines (and one machine from one minute to the next) differ by more than most changes make,
so a change is measured against the code before it in one invocation: two engines (each its
own embedded Redis and ``--processes`` worker processes), ``A`` running the workers of
``--base`` (a checkout of the older commit, e.g. ``git worktree add /tmp/base HEAD~1``) and
``B`` those of this checkout, W2 (200 x 10 steps) on each in turn, the order swapped every
turn. The client is this checkout's for both. Prints each turn, then B/A medians: steps/s,
the workers' CPU per step, and how busy the 2 cores were (client + workers + Redis CPU over
the turn's wall time). An A/A run (``--base`` this checkout) shows the noise: on the 2-core
machine of 2026-12-06, medians of 0.96-1.00 with turns from 0.86 to 1.17.

    python benchmarks/ab_workers.py --base /tmp/base [--turns 12] [--processes 2]
        [--appendfsync everysec|always]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

import workloads_durable  # noqa: E402
from peers.common import STEPS, Options, exit_on_sigterm  # noqa: E402

WORKFLOWS = 200


def _engine(stack: ExitStack, root: Path, args: argparse.Namespace) -> Any:
    # start_workers() reads the module's ROOT when the engine starts its workers: that
    # checkout's code runs them (cwd and PYTHONPATH).
    workloads_durable.ROOT = root
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
    options = Options(tmpdir=tmp, processes=args.processes, appendfsync=args.appendfsync)
    return stack.enter_context(workloads_durable.Engine(options))


def _figures(result: dict[str, Any]) -> tuple[float, float, float]:
    steps = WORKFLOWS * STEPS
    cpu = result["cpu_client_s"] + result["cpu_workers_s"] + result["cpu_redis_s"]
    return result["steps_per_s"], result["cpu_workers_s"] / steps * 1e6, cpu / result["seconds"] / 2


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", type=Path, required=True, help="checkout whose workers are A")
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--appendfsync", choices=["everysec", "always"], default="everysec")
    args = parser.parse_args()
    exit_on_sigterm()
    here = workloads_durable.ROOT
    figures: dict[str, list[tuple[float, float, float]]] = {"A": [], "B": []}
    with ExitStack() as stack:
        engines = {"A": _engine(stack, args.base.resolve(), args), "B": _engine(stack, here, args)}
        for turn in range(args.turns):
            for name in ("A", "B") if turn % 2 == 0 else ("B", "A"):
                got = _figures(engines[name].w2(WORKFLOWS))
                figures[name].append(got)
                print(
                    f"turn {turn + 1} {name}: {got[0]:6,.0f} steps/s, workers {got[1]:4.0f} µs/step, cores {got[2]:.2f}"
                )
    a, b = figures["A"], figures["B"]
    ratios = [y[0] / x[0] for x, y in zip(a, b, strict=True)]
    print(
        f"steps/s B/A median {statistics.median(ratios):.3f} (turns {min(ratios):.2f}-{max(ratios):.2f}); "
        f"A {statistics.median(x[0] for x in a):,.0f}, B {statistics.median(y[0] for y in b):,.0f}"
    )
    print(
        f"workers' CPU per step B/A {statistics.median(y[1] for y in b) / statistics.median(x[1] for x in a):.3f}; "
        f"cores busy A {statistics.median(x[2] for x in a):.2f}, B {statistics.median(y[2] for y in b):.2f}"
    )


if __name__ == "__main__":
    main()
