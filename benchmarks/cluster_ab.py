"""W2 on one Redis and on a local Redis Cluster, in turns in one invocation (issue 18 item 8).

    python benchmarks/cluster_ab.py --turns 4            # ratio cluster/one node per turn
    python benchmarks/cluster_ab.py --profile            # where one worker's CPU goes

Throughput: both deployments are started side by side (one embedded Redis; a
cluster of ``--masters`` masters), each with ``--processes`` worker processes,
and W2 (``--n`` workflows of 10 activities, all started at once) runs on one,
then the other, ``--turns`` times. Only the ratios of one turn are meaningful on
a shared machine; the median and the spread of those ratios are printed.

Profile: one worker process under cProfile on each deployment in turn (the other
deployment stopped), W2 once; prints the share of the worker's profiled time
spent in the Redis client layers (redis-py, hiredis, durable's wire modules),
which depends much less on the machine's load than throughput does.
"""

from __future__ import annotations

import argparse
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from peers.common import Options, cpu_seconds, exit_on_sigterm, stop_process_group  # noqa: E402
from workloads_durable import ROOT, Engine, _env  # noqa: E402

# Where the client layers live: redis-py, hiredis, durable's own raw pipelines, and the
# socket calls they make (builtins have no file; their names tell them apart).
CLIENT_FILES = ("/redis/", "hiredis", "durable/store/wire.py", "durable/store/cluster_wire.py")
CLIENT_BUILTINS = ("sendall", "recv_into", "pack_command", "'poll'", "hiredis")

# The worker under a CPU-time profiler (thread_time: waiting in select() costs nothing), its
# main thread (the decider's loop) only; the profile is written when the worker exits.
PROFILED_WORKER = """
import cProfile, runpy, sys, time
out = sys.argv.pop(1)
prof = cProfile.Profile(time.thread_time)
try:
    prof.runcall(runpy.run_module, "workers.cli", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
finally:
    prof.dump_stats(out)
"""


def client_share(stats: pstats.Stats) -> float:
    """The share of the profiled CPU time spent in the Redis client layers."""
    rows = stats.stats.items()  # type: ignore[attr-defined]
    total = sum(row[2] for _, row in rows)
    client = sum(
        row[2]
        for (path, _, name), row in rows
        if any(part in path for part in CLIENT_FILES)
        or (path == "~" and any(b in name for b in CLIENT_BUILTINS))
    )
    return client / total


def throughput(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        one = Engine(Options(tmpdir=Path(tmp) / "one", processes=args.processes))
        many = Engine(Options(tmpdir=Path(tmp) / "cluster", processes=args.processes, cluster=args.masters))
        for engine in (one, many):
            engine.options.tmpdir.mkdir()
        with one, many:
            ratios, cpu_ratios = [], []
            for turn in range(args.turns):
                a, cpu_a = measured(one, args.n)
                b, cpu_b = measured(many, args.n)
                ratios.append(b / a)
                cpu_ratios.append(sum(cpu_b) / sum(cpu_a))
                print(
                    f"turn {turn + 1}: one node {a:5.0f} steps/s, cluster {b:5.0f} steps/s, ratio {b / a:.3f}; "
                    f"CPU ms/step client+workers+redis: {cpu_text(cpu_a, args.n)} vs {cpu_text(cpu_b, args.n)}"
                )
    for name, values in (("throughput", ratios), ("CPU per step", cpu_ratios)):
        spread = f"{min(values):.3f}..{max(values):.3f}"
        print(
            f"{name}, cluster/one node: median {statistics.median(values):.3f} (spread {spread}, {args.turns} turns)"
        )


def redis_pids(engine: Engine) -> list[int]:
    server = engine.server
    if hasattr(server, "procs"):
        return [proc.pid for proc in server.procs]
    pid = server.pid
    return [pid] if pid else []


def measured(engine: Engine, n: int) -> tuple[float, tuple[float, float, float]]:
    """W2's steps/s, and the CPU seconds the client, the workers and Redis spent on it."""
    before = sum(cpu_seconds(pid) for pid in redis_pids(engine))
    got = engine.w2(n)
    redis_s = sum(cpu_seconds(pid) for pid in redis_pids(engine)) - before
    return got["steps_per_s"], (got["cpu_client_s"], got["cpu_workers_s"], redis_s)


def cpu_text(cpu: tuple[float, float, float], n: int) -> str:
    return "+".join(f"{1000 * s / (n * 10):.2f}" for s in cpu)


def profile(args: argparse.Namespace) -> None:
    for masters in (0, args.masters):
        with tempfile.TemporaryDirectory() as tmp:
            options = Options(tmpdir=Path(tmp), processes=1, cluster=masters)
            engine = Engine(options)
            engine._restart_workers = lambda cache_size: None  # type: ignore[method-assign]
            with engine:
                out = Path(tmp) / "worker.prof"
                argv = [sys.executable, "-c", PROFILED_WORKER, str(out)]
                argv += ["--redis", engine.url, "worker", "--app", "bench_apps", "--log-level", "WARNING"]
                proc = subprocess.Popen(argv, cwd=ROOT, env=_env(), start_new_session=True)
                try:
                    engine._warm_up()
                    engine.w2(args.n)
                finally:
                    stop_process_group(proc)
                time.sleep(0.2)
                stats = pstats.Stats(str(out))
                name = f"cluster of {masters}" if masters else "one node"
                print(
                    f"{name}: {client_share(stats):.1%} of the worker's main-thread CPU in the Redis client layers"
                )
                if args.verbose:
                    stats.sort_stats("tottime").print_stats(25)
                    stats.print_callers(
                        r"connection.py:\d+\(pack\)|sendall|_socket_can_read|reader.py:\d+\(_send\)"
                    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--n", type=int, default=200, help="workflows per W2 run")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--masters", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    profile(args) if args.profile else throughput(args)


if __name__ == "__main__":
    exit_on_sigterm()
    main()
