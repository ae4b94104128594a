"""Run the same workloads on durable and its peers; print a table (engine x workload).

    python benchmarks/harness.py --engines durable,temporal,dbos --workloads W1,W2,W3,W4,W5
    python benchmarks/harness.py --quick                      # smoke run, < 1 min per engine
    python benchmarks/harness.py --engines durable --workloads W1,W2,W3,W4,W5,W6,W7 \
        --processes 2 --appendfsync everysec --markdown out.md
    python benchmarks/harness.py --engines durable --workloads W2 --cluster   # 3-node Redis Cluster
    python benchmarks/harness.py --engines durable --workloads W2 --metrics   # metrics off vs on
    # issue 18's ratios in one invocation: W2 / limit.py ceiling, W1 queued/eager, W2 always/everysec
    python benchmarks/harness.py --engines durable --workloads W1,W2,W2T,W2A --ceiling --compare eager,always

Workloads (activities are no-ops returning a small value; identical for every engine):

  W1  latency: a workflow of 10 sequential activities, run one after another: p50 / p95
  W2  throughput: N such workflows started at once: workflows/s and activity steps/s
  W2T W2 with a client thread per workflow (start, then wait for its result): 200 waiting clients
  W2A W2 with an asyncio task per workflow (AsyncWorkflowStub, one event loop): 200 tasks
  W3  fan-out: one workflow running 100 activities concurrently: seconds (median)
  W4  timer overhead: a 1 s durable timer: seconds beyond 1.0 (median)
  W5  signal round trip: signal sent -> workflow result available (median)
  W6  long history: one decision at 100 / 1,000 / 10,000 events, cache hit vs no cache
  W7  waiting runs: Redis and worker memory per run suspended on a signal; wake-ups/s
  CEIL limit.py's "as written" ceiling (--ceiling; durable only), on a private embedded Redis

Each engine runs in its own temp dir; every server and worker process the harness
starts is stopped when the engine is done (also on error or Ctrl-C). An engine that
cannot be installed or started is reported as unavailable, with the reason; a
workload an engine does not implement is shown as "n/a". No figure is ever made up.
W2, its variants and the ceiling run in turns (W2, W2T, CEIL, W2, ...) so their ratio is of
the same minutes. --compare eager,always keeps a second (third) durable engine alive beside
the first, in that mode, and runs W1 and the W2 group in turns on all of them.
After the table come the ratios (durable/peer per workload, W2T/W2, W2A/W2, W2 / ceiling,
W1 queued/eager, W2 always/everysec; with the spread of per-turn ratios); the raw figures go to
benchmarks/results/<time>.json (--json), the plots to --plots DIR (benchmarks/report.py).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import ExitStack
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]

import report  # noqa: E402
from peers.common import NotMeasured, Options, exit_on_sigterm, latency_summary  # noqa: E402

MODULES = {
    "durable": "workloads_durable",
    "temporal": "peers.temporal_workloads",
    "dbos": "peers.dbos_workloads",
}
ALL_WORKLOADS = ["W1", "W2", "W2T", "W2A", "W3", "W4", "W5", "W6", "W7", "CEIL"]

# Sizes: (full, quick).
SIZES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "W1": ({"n_runs": 20}, {"n_runs": 5}),
    "W2": ({"n_workflows": 200}, {"n_workflows": 20}),
    "W2T": ({"n_workflows": 200}, {"n_workflows": 20}),
    "W2A": ({"n_workflows": 200}, {"n_workflows": 20}),
    "W3": ({"n_branches": 100, "repeats": 3}, {"n_branches": 100, "repeats": 1}),
    "W4": ({"n_samples": 5, "seconds": 1.0}, {"n_samples": 2, "seconds": 1.0}),
    "W5": ({"n_samples": 10}, {"n_samples": 3}),
    "W6": ({"sizes": [100, 1_000, 10_000]}, {"sizes": [100, 1_000]}),
    "W7": ({"n_runs": 10_000}, {"n_runs": 500}),
    "CEIL": ({"seconds": 1.0}, {"seconds": 0.3}),
}

# Runs per workload (full, quick) where one run is short and a 2-core box is noisy: the
# median run is reported, with the range.
REPEATS: dict[str, tuple[int, int]] = {"W2": (5, 1), "W2T": (5, 1), "W2A": (5, 1), "CEIL": (5, 1)}
# The engine method of a workload, when it is not the workload's name in lower case.
METHODS = {"CEIL": "ceiling"}
# Rounds of W1 when it runs in turns on engines compared (--compare): its samples are pooled.
TURNS: dict[str, tuple[int, int]] = {"W1": (3, 2)}
# --compare MODE: a second durable engine, alive beside the first, with these options.
COMPARE: dict[str, dict[str, Any]] = {
    "eager": {"eager": True},
    "always": {"appendfsync": "always"},
    "metrics": {"metrics": True},
    "tracing": {"tracing": True},
}

TITLES = {
    "W1": "W1 10-step p50 / p95",
    "W2": "W2 throughput",
    "W2T": "W2 with a client thread per workflow",
    "W2A": "W2 with an asyncio task per workflow",
    "W3": "W3 fan-out 100",
    "W4": "W4 timer overhead",
    "W5": "W5 signal round trip",
    "W6": "W6 decision at N events (cached / no cache)",
    "W7": "W7 waiting runs",
    "CEIL": "limit.py ceiling, as written",
}


def fmt_time(seconds: float) -> str:
    if abs(seconds) >= 1:
        return f"{seconds:.2f} s"
    if abs(seconds) >= 0.01:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds * 1000:.2f} ms"


def fmt_count(n: float) -> str:
    return f"{n:,.0f}"


def fmt_bytes(n: float) -> str:
    if abs(n) >= 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n:.0f} B"


def render(workload: str, fig: dict[str, Any]) -> str:
    """One table cell from a workload's figures."""
    if workload == "W1":
        return f"{fmt_time(fig['p50_s'])} / {fmt_time(fig['p95_s'])}"
    if workload in ("W2", "W2T", "W2A", "CEIL"):
        cell = f"{fmt_count(fig['steps_per_s'])} steps/s"
        if "workflows_per_s" in fig:
            cell = f"{fig['workflows_per_s']:,.1f} wf/s, " + cell
        runs = fig.get("runs_steps_per_s", [])
        if len(runs) > 1:
            cell += f" (median of {len(runs)}: {fmt_count(runs[0])}–{fmt_count(runs[-1])})"
        return cell
    if workload == "W3":
        return fmt_time(fig["seconds"])
    if workload == "W4":
        return "+" + fmt_time(fig["overhead_s"])
    if workload == "W5":
        return fmt_time(fig["p50_s"])
    if workload == "W6":
        parts = []
        for size, row in fig["sizes"].items():
            label = f"{size // 1000}k" if size >= 1000 else str(size)
            parts.append(f"{label}: {fmt_time(row['cached_s'])} / {fmt_time(row['uncached_s'])}")
        return "; ".join(parts)
    if workload == "W7":
        return (
            f"Redis {fmt_bytes(fig['redis_bytes_per_run'])}/run, worker {fmt_bytes(fig['worker_bytes_per_run'])}/run, "
            f"{fmt_count(fig['wakes_per_s'])} wakes/s (n={fmt_count(fig['n'])})"
        )
    return repr(fig)


def measure(engine: Any, workload: str, kwargs: dict[str, Any], repeats: int) -> dict[str, Any]:
    """The workload's figures; with repeats, those of the median run by steps/s, plus every
    run's steps/s (sorted) as ``runs_steps_per_s``."""
    fn = getattr(engine, METHODS.get(workload, workload.lower()), None)
    if fn is None:
        raise NotMeasured()
    return merge_runs(workload, [in_turn(engine, fn, kwargs) for _ in range(repeats)])


def in_turn(engine: Any, fn: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """One run of a workload, inside the engine's ``turn()`` when it has one (durable with
    tracing: the client's spans are on during its own turns only)."""
    turn = getattr(engine, "turn", None)
    if turn is None:
        return fn(**kwargs)
    with turn():
        return fn(**kwargs)


def merge_runs(workload: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One figure from a workload's runs: W1's samples pooled, else the median run."""
    if workload == "W1" and len(runs) > 1 and all("samples_s" in r for r in runs):
        return {**latency_summary([t for r in runs for t in r["samples_s"]]), "rounds": len(runs)}
    return median_run(runs)


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    if len(runs) == 1:
        return runs[0]
    key = "steps_per_s" if "steps_per_s" in runs[0] else "p50_s"
    # In the order run: per-turn ratios between variants (the ceiling's inbox step too).
    turns = {f"turns_{k}": [fig[k] for fig in runs] for k in (key, "inbox_steps_per_s") if k in runs[0]}
    runs.sort(key=lambda fig: fig[key])
    return {**runs[len(runs) // 2], f"runs_{key}": [fig[key] for fig in runs], **turns}


Slot = tuple[str, str]  # (engine label, workload)


def measure_interleaved(
    engines: dict[str, Any], group: list[str], sizes: dict[str, dict[str, Any]], repeats: int
) -> dict[Slot, dict[str, Any] | BaseException]:
    """Every (engine, workload) of ``group`` in turns (W2 on A, W2 on B, W2T on A, ..., then
    again): a 2-core box drifts by more within a minute than the variants differ, so their
    runs are interleaved and their ratio is of the same minutes."""
    slots = [(label, w) for w in group for label in engines]
    runs: dict[Slot, list[dict[str, Any]]] = {slot: [] for slot in slots}
    out: dict[Slot, dict[str, Any] | BaseException] = {}
    for _ in range(repeats):
        for slot in slots:
            if slot in out:
                continue
            label, w = slot
            fn = getattr(engines[label], METHODS.get(w, w.lower()), None)
            try:
                if fn is None:
                    raise NotMeasured()
                runs[slot].append(in_turn(engines[label], fn, sizes[w]))
            except Exception as exc:  # noqa: BLE001 - reported by the caller
                out[slot] = exc
    for slot in slots:
        out.setdefault(slot, merge_runs(slot[1], runs[slot]) if runs[slot] else NotMeasured())
    return out


def groups(workloads: list[str], n_engines: int) -> list[list[str]]:
    """The workloads in measuring order, those run in turns grouped: W2, its variants and the
    ceiling together; W1 too when engines are compared. Each other workload alone."""
    together = [w for w in workloads if w.startswith("W2") or w == "CEIL"]
    if n_engines > 1 and "W1" in workloads:
        together = ["W1", *together]
    out: list[list[str]] = []
    for w in workloads:
        if w in together:
            if together not in out:
                out.append(together)
        else:
            out.append([w])
    return out


def open_engines(
    module: Any, variants: dict[str, dict[str, Any]], quick: bool, stack: ExitStack, log: Any
) -> tuple[dict[str, Any], dict[str, str]]:
    """Start one engine per variant (label -> options), each in its own temp dir, stopped
    by ``stack``; returns (label -> engine, label -> why it could not start)."""
    engines: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for label, options_kw in variants.items():
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"bench-{label}-")))
        t0 = time.perf_counter()
        stack.callback(
            lambda lb=label, t=t0: log(f"[{lb}] stopped (engine total {time.perf_counter() - t:.1f} s)")
        )
        try:
            engine = module.Engine(Options(tmpdir=tmp, quick=quick, **options_kw))
            engines[label] = stack.enter_context(engine)
        except Exception as exc:  # noqa: BLE001
            log(f"[{label}] could not start: {type(exc).__name__}: {exc}")
            log(traceback.format_exc())
            failed[label] = f"unavailable: could not start ({type(exc).__name__}: {exc})"
    return engines, failed


def run_engine(
    name: str,
    workloads: list[str],
    options_kw: dict[str, Any],
    quick: bool,
    log: Any,
    compare: dict[str, dict[str, Any]] | None = None,
) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, dict[str, Any]]]]:
    """Run the workloads on one engine, and with ``compare`` (label -> options overriding
    ``options_kw``) on more instances of it alive at once, measured in turns. Returns
    (label -> workload -> cell text: figures or why there are none, label -> workload ->
    raw figures)."""
    variants = {name: options_kw, **{label: {**options_kw, **kw} for label, kw in (compare or {}).items()}}
    cells: dict[str, dict[str, str]] = {label: {} for label in variants}
    figures: dict[str, dict[str, dict[str, Any]]] = {label: {} for label in variants}
    try:
        module = importlib.import_module(MODULES[name])
    except Exception as exc:  # noqa: BLE001 - a missing peer must not stop the others
        reason = f"unavailable: cannot import ({type(exc).__name__}: {exc})"
        return {label: dict.fromkeys(workloads, reason) for label in variants}, figures
    why = module.unavailable()
    if why:
        return {label: dict.fromkeys(workloads, f"unavailable: {why}") for label in variants}, figures
    with ExitStack() as stack:
        engines, failed = open_engines(module, variants, quick, stack, log)
        for label, reason in failed.items():
            cells[label] = dict.fromkeys(workloads, reason)
        q = 1 if quick else 0
        sizes = {w: SIZES[w][q] for w in workloads}
        for group in groups(workloads, len(engines)):
            t0 = time.perf_counter()
            if len(group) > 1 or len(engines) > 1:
                repeats = max(REPEATS.get(w, TURNS.get(w, (1, 1)))[q] for w in group)
                done = measure_interleaved(engines, group, sizes, repeats)
            else:
                (label, engine), (w,) = next(iter(engines.items())), group
                try:
                    done = {(label, w): measure(engine, w, sizes[w], REPEATS.get(w, (1, 1))[q])}
                except Exception as exc:  # noqa: BLE001 - report and go on
                    done = {(label, w): exc}
            for (label, w), fig in done.items():
                cells[label][w] = record(label, w, fig, sizes[w], time.perf_counter() - t0, log)
                if isinstance(fig, dict):
                    figures[label][w] = fig
    return cells, figures


def record(label: str, workload: str, fig: Any, size: dict[str, Any], seconds: float, log: Any) -> str:
    """The table cell for one measurement (figures, n/a or the error), logged."""
    if isinstance(fig, NotMeasured):
        cell = f"n/a ({fig})" if str(fig) else "n/a"
        log(f"[{label}] {workload}: not measured for this engine {cell}")
    elif isinstance(fig, BaseException):
        cell = f"error: {type(fig).__name__}: {fig}"
        log(f"[{label}] {workload} failed after {seconds:.1f} s:")
        log("".join(traceback.format_exception(fig)))
    else:
        cell = render(workload, fig)
        log(f"[{label}] {workload} {size} ({seconds:.1f} s): {cell}")
        log(f"[{label}] {workload} raw: {fig}")
    return cell


def machine() -> str:
    model = platform.processor() or "?"
    if shutil.which("lscpu"):
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    import os

    return f"{os.cpu_count()} cores, {model}, Python {platform.python_version()}, {platform.system()}"


def table(rows: dict[str, dict[str, str]], workloads: list[str]) -> list[list[str]]:
    header = ["engine"] + [TITLES[w] for w in workloads]
    return [header] + [[engine] + [cells.get(w, "") for w in workloads] for engine, cells in rows.items()]


def print_table(grid: list[list[str]]) -> None:
    # Engines as columns read better in a terminal: one line per workload.
    engines = [row[0] for row in grid[1:]]
    width0 = max(len(h) for h in grid[0])
    widths = [max(len(cell) for cell in row) for row in grid[1:]]
    print(" " * width0 + "  " + "  ".join(e.ljust(w) for e, w in zip(engines, widths, strict=True)))
    for i, title in enumerate(grid[0][1:], 1):
        print(
            title.ljust(width0)
            + "  "
            + "  ".join(row[i].ljust(w) for row, w in zip(grid[1:], widths, strict=True))
        )


def markdown(grid: list[list[str]], command: str) -> str:
    engines = [row[0] for row in grid[1:]]
    lines = [
        f"Measured {_dt.date.today().isoformat()} on {machine()}.",
        "",
        f"Command: `{command}`",
        "",
        "| workload | " + " | ".join(engines) + " |",
        "|---|" + "---|" * len(engines),
    ]
    for i, title in enumerate(grid[0][1:], 1):
        lines.append(f"| {title} | " + " | ".join(row[i].replace("|", "\\|") for row in grid[1:]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--engines", default="durable,temporal,dbos", help="comma-separated: durable,temporal,dbos"
    )
    parser.add_argument("--workloads", default="W1,W2,W3,W4,W5", help="comma-separated: W1..W7")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run (< 1 min per engine)")
    parser.add_argument("--processes", type=int, default=2, help="durable worker processes (default 2)")
    parser.add_argument("--appendfsync", default="everysec", choices=["everysec", "always", "no"])
    parser.add_argument("--eager", action="store_true", help="durable workers in eager mode (--eager)")
    parser.add_argument(
        "--cluster",
        nargs="?",
        type=int,
        const=3,
        default=0,
        metavar="N",
        help="durable on a local Redis Cluster of N masters (default 3) instead of one Redis",
    )
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="the same as --compare metrics: durable with Prometheus metrics on (workers get "
        "--metrics-port), row durable+metrics, measured in turns with durable",
    )
    parser.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown")
    parser.add_argument(
        "--json",
        metavar="FILE",
        help="the raw figures of this invocation (default: benchmarks/results/<time>.json; '-' for none)",
    )
    parser.add_argument(
        "--plots", metavar="DIR", help="write table.png and w1_latency.png there (needs the plots extra)"
    )
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="also measure limit.py's 'as written' ceiling (on a private embedded Redis with the same "
        "appendfsync), in turns with W2, and print W2 / ceiling (adds W2 if missing)",
    )
    parser.add_argument(
        "--compare",
        default="",
        metavar="MODES",
        help="comma-separated, any of: eager, always, metrics, tracing. Also run durable in that "
        "mode (row durable+eager: workers --eager; durable+always: appendfsync always; "
        "durable+metrics: --metrics-port; durable+tracing: OpenTelemetry spans at default "
        "sampling, dropped by the exporter), alive beside the first, W1 and the W2 group "
        "measured in turns on all; prints W1 queued/eager p50, W2 always/everysec and W2 "
        "metrics/tracing on/off",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines, only the table")
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="the same as --compare tracing: durable with OpenTelemetry tracing on (row "
        "durable+tracing), measured in turns with durable",
    )
    args = parser.parse_args(argv)

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    compare = [m.strip() for m in args.compare.split(",") if m.strip()]
    compare += [
        m for m, on in (("metrics", args.metrics), ("tracing", args.tracing)) if on and m not in compare
    ]
    bad = [e for e in engines if e not in MODULES] + [w for w in workloads if w not in ALL_WORKLOADS]
    bad += [m for m in compare if m not in COMPARE]
    if bad:
        parser.error(f"unknown engine/workload/--compare mode: {', '.join(bad)}")
    if ("eager" in compare and args.eager) or ("always" in compare and args.appendfsync == "always"):
        parser.error(
            "--compare eager/always compares against the default mode: drop --eager/--appendfsync always"
        )
    if args.ceiling:
        workloads += [w for w in ("W2", "CEIL") if w not in workloads]

    def log(message: str) -> None:
        if not args.quiet:
            print(message, file=sys.stderr, flush=True)

    command = "python benchmarks/harness.py " + " ".join(argv if argv is not None else sys.argv[1:])
    log(f"machine: {machine()}")
    rows: dict[str, dict[str, str]] = {}
    figures: dict[str, dict[str, dict[str, Any]]] = {}
    started = _dt.datetime.now()
    options_kw = {
        "processes": args.processes,
        "appendfsync": args.appendfsync,
        "eager": args.eager,
        "cluster": args.cluster,
    }
    for engine in engines:
        log(f"[{engine}] starting")
        variants = {f"durable+{m}": COMPARE[m] for m in compare} if engine == "durable" else None
        cells, figs = run_engine(engine, workloads, options_kw, args.quick, log, variants)
        rows.update(cells)
        figures.update(figs)
    grid = table(rows, workloads)
    print()
    print_table(grid)
    lines = report.ratios(figures, workloads)
    if lines:
        print("\nratios of the headline figures, this invocation:")
        print("\n".join("  " + line for line in lines))
    if args.markdown:
        extra = "\nRatios (same invocation):\n\n" + "".join(f"* {line}\n" for line in lines) if lines else ""
        Path(args.markdown).write_text(markdown(grid, command) + extra)
        log(f"wrote {args.markdown}")
    if args.json != "-":
        out = Path(args.json or BENCH / "results" / f"{started:%Y%m%d-%H%M%S}.json")
        report.write_json(
            out,
            {
                "command": command,
                "started": started.isoformat(timespec="seconds"),
                "machine": machine(),
                "options": {**options_kw, "quick": args.quick, "compare": compare, "ceiling": args.ceiling},
                "figures": figures,
                "cells": rows,
                "ratios": lines,
            },
        )
        log(f"wrote {out}")
    if args.plots:
        written = report.write_plots(Path(args.plots), figures, workloads)
        log("wrote " + ", ".join(map(str, written)) if written else "no plots: matplotlib is not installed")
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    sys.exit(main())
