"""Where one W2 step's CPU goes: the client, the worker processes and Redis, and what Redis ran.

Runs W2 (``--workflows`` x 10-step workflows, ``--processes`` worker processes on the embedded
Redis) ``--turns`` times after a warm-up, and prints per step, for each turn: CPU of the client,
the workers (and of that, their main threads: the loop that decides and commits; the rest is
their activity threads and housekeeping) and Redis (µs), Redis's reads of client input (round trips, pipelined ones counted
once) and commands (those scripts run are counted too), and for the last turn Redis's busiest
commands (``INFO commandstats``: a script's time includes the commands it ran).

Read it next to ``limit.py``'s ceiling: that ceiling runs the step's one ``commit`` script
per step with a light client, so a W2 whose Redis time per script matches the ceiling's but
whose workers spend more per step than Redis is bound by the workers' CPU on a small machine.

    python benchmarks/step_costs.py [--processes 2] [--workflows 200] [--turns 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from peers.common import STEPS, Options, cpu_seconds, exit_on_sigterm  # noqa: E402
from workloads_durable import Engine  # noqa: E402


def _main_threads_s(pids: list[int]) -> float:
    """CPU seconds so far of the main threads of ``pids``."""
    return sum(cpu_seconds(pid, main_thread=True) for pid in pids)


def _snapshot(redis: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    return dict(redis.info("commandstats")), dict(redis.info("stats"))


def _busiest(before: dict[str, Any], after: dict[str, Any], steps: int, most: int = 12) -> list[str]:
    rows = []
    for name, now in after.items():
        was = before.get(name, {"calls": 0, "usec": 0})
        calls, usec = now["calls"] - was["calls"], now["usec"] - was["usec"]
        if calls:
            rows.append((usec, calls, name.removeprefix("cmdstat_")))
    return [
        f"    {name:16s} {calls / steps:6.2f} calls/step {usec / steps:7.1f} µs/step"
        for usec, calls, name in sorted(rows, reverse=True)[:most]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--workflows", type=int, default=200)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    steps = args.workflows * STEPS
    with (
        tempfile.TemporaryDirectory() as tmp,
        Engine(Options(tmpdir=Path(tmp), processes=args.processes)) as e,
    ):
        e.w2(args.workflows)  # warm: drivers cached, scripts loaded
        redis = e.store.redis
        for turn in range(1, args.turns + 1):
            (cmds0, stats0), main0 = _snapshot(redis), _main_threads_s(e._worker_pids)
            out = e.w2(args.workflows)
            (cmds1, stats1), main1 = _snapshot(redis), _main_threads_s(e._worker_pids)
            us = {k: out[f"cpu_{k}_s"] / steps * 1e6 for k in ("client", "workers", "redis")}
            main_us = (main1 - main0) / steps * 1e6
            reads = stats1["total_reads_processed"] - stats0["total_reads_processed"]
            commands = stats1["total_commands_processed"] - stats0["total_commands_processed"]
            print(
                f"turn {turn}: {out['steps_per_s']:,.0f} steps/s; CPU per step: client {us['client']:.0f} µs, "
                f"workers {us['workers']:.0f} µs (main threads {main_us:.0f}), Redis {us['redis']:.0f} µs; Redis per step: "
                f"{reads / steps:.2f} reads, {commands / steps:.1f} commands"
            )
            if turn == args.turns:
                print("  Redis's busiest commands, last turn:")
                print("\n".join(_busiest(cmds0, cmds1, steps)))


if __name__ == "__main__":
    exit_on_sigterm()
    main()
