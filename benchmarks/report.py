"""The harness's outputs besides the table: ratios between engines, the raw JSON, PNG plots.

* :func:`ratios` -- for each workload, durable's headline figure over each peer's, from
  the same invocation (and W2's variants over W2, durable's own clients compared).
* :func:`write_json` -- every engine's raw figures, with the command and the machine.
* :func:`write_plots` -- ``table.png`` (the headline figure of each workload, engines side
  by side, log scale) and ``w1_latency.png`` (W1's start -> result times per engine).
  Needs matplotlib (the ``plots`` extra); without it the plots are skipped with a note.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

# The figure a workload is judged by: (key in its figures, "time" = lower is better, or "rate").
HEADLINE: dict[str, tuple[str, str, str]] = {
    "W1": ("p50_s", "time", "W1 p50 (s)"),
    "W2": ("steps_per_s", "rate", "W2 steps/s"),
    "W2T": ("steps_per_s", "rate", "W2, thread per client: steps/s"),
    "W2A": ("steps_per_s", "rate", "W2, asyncio clients: steps/s"),
    "W3": ("seconds", "time", "W3 fan-out 100 (s)"),
    "W4": ("overhead_s", "time", "W4 timer overhead (s)"),
    "W5": ("p50_s", "time", "W5 signal round trip (s)"),
    "W7": ("wakes_per_s", "rate", "W7 wakes/s"),
    "CEIL": ("steps_per_s", "rate", "limit.py ceiling: steps/s"),
}
VARIANTS = {"W2T": "W2", "W2A": "W2"}


def headline(workload: str, fig: dict[str, Any] | None) -> float | None:
    if not fig or workload not in HEADLINE:
        return None
    value = fig.get(HEADLINE[workload][0])
    return float(value) if isinstance(value, (int, float)) else None


def ratios(
    figures: dict[str, dict[str, dict[str, Any]]], workloads: list[str], cores: int | None = None
) -> list[str]:
    """Lines of text: durable/peer for each workload both measured, durable's W2 variants
    over W2, and issue 18's goals (W2 / ceiling, W1 queued/eager, W2 always/everysec) when
    measured, with W2's CPU bound on ``cores`` (default: this machine's). A ratio is of the
    headline figure; "x faster" reads it either way."""
    lines = []
    ours = figures.get("durable", {})
    for peer, theirs in figures.items():
        if peer == "durable" or peer in GOALS:
            continue
        for w in workloads:
            if w == "CEIL":  # Redis's ceiling on this box, not a figure of the engine
                continue
            a, b = headline(w, ours.get(w)), headline(w, theirs.get(w))
            if a is None or b is None or a <= 0 or b <= 0:
                continue
            key, kind, _ = HEADLINE[w]
            faster = b / a if kind == "time" else a / b
            lines.append(f"{w} {key}: durable/{peer} = {a / b:.3g} (durable {faster:.3g}x faster)")
    for variant, base in VARIANTS.items():
        for engine, figs in figures.items():
            line = _ratio(figs.get(variant), figs.get(base), "steps_per_s")
            if line:
                goal = " (goal >= 0.80)" if variant in ("W2T", "W2A") else ""
                lines.append(f"{variant}/{base} steps/s ({engine}) = {line}{goal}")
    for engine, figs in figures.items():
        line = _ratio(figs.get("W2"), figs.get("CEIL"), "steps_per_s", percent=True)
        if line:
            lines.append(f"W2 / limit.py ceiling as written ({engine}) = {line} (goal >= 80 %)")
        ceiling = figs.get("CEIL") or {}
        if ceiling.get("inbox_steps_per_s"):
            # The ceiling of the step the engine had when issue 18 was filed (3 commands).
            then = {
                "steps_per_s": ceiling["inbox_steps_per_s"],
                "turns_steps_per_s": ceiling.get("turns_inbox_steps_per_s", []),
            }
            line = _ratio(figs.get("W2"), then, "steps_per_s", percent=True)
            if line:
                lines.append(
                    f"W2 / limit.py ceiling through the inbox, the step when issue 18 was filed ({engine}) = {line}"
                )
        bound = cpu_bound(figs.get("W2"), figs.get("CEIL"), cores or os.cpu_count() or 1)
        if bound:
            lines.append(f"W2 CPU bound ({engine}): {bound}")
    for label, (workload, key, text) in GOALS.items():
        base, other = ours.get(workload), figures.get(label, {}).get(workload)
        line = _ratio(base, other, key) if label == "durable+eager" else _ratio(other, base, key)
        if line:
            lines.append(f"{text} = {line}")
    return lines


def cpu_bound(w2: dict[str, Any] | None, ceiling: dict[str, Any] | None, cores: int) -> str:
    """Why W2 falls short of the ceiling, as text (``""`` without W2's CPU figures).

    The ceiling is Redis running the step's commands for one client that only packs them
    (which of the two bounds it is measured: ``redis_core``, ``client_core``). W2's client,
    workers and Redis share the machine's cores, so W2 can reach at most ``cores`` / (their
    CPU per step): how far W2 is from that bound is scheduling and waiting; how far the bound
    is from the ceiling is the workers' (Python's) own CPU per step."""
    parts = ("client", "workers", "redis")
    if not w2 or not all(isinstance(w2.get(f"cpu_{p}_s"), (int, float)) for p in parts):
        return ""
    if not w2["cpu_redis_s"]:  # not measured (a cluster's nodes): the bound would be wrong
        return ""
    steps = w2.get("steps_per_s", 0) * w2.get("seconds", 0)
    if not steps:
        return ""
    spent = [float(w2[f"cpu_{p}_s"]) * 1000 / steps for p in parts]
    bound = cores * 1000 / sum(spent)
    text = (
        f"{sum(spent):.2f} ms CPU per step (client {spent[0]:.2f} + workers {spent[1]:.2f} + Redis "
        f"{spent[2]:.2f}) allow at most {bound:,.0f} steps/s on {cores} cores; W2 reached "
        f"{100 * w2['steps_per_s'] / bound:.0f} % of that"
    )
    ceiling_rate = headline("CEIL", ceiling)
    if ceiling_rate:
        text += f", and the bound is {100 * bound / ceiling_rate:.0f} % of the ceiling"
        if ceiling and isinstance(ceiling.get("redis_core"), (int, float)):
            text += (
                f" (whose Redis was busy {100 * ceiling['redis_core']:.0f} % of a core, "
                f"its one client {100 * ceiling['client_core']:.0f} %)"
            )
    return text


# Rows of a durable engine in another mode (harness --compare): (workload, key, what the ratio is).
GOALS: dict[str, tuple[str, str, str]] = {
    "durable+eager": ("W1", "p50_s", "W1 p50 queued/eager (goal <= 1.5)"),
    "durable+always": ("W2", "steps_per_s", "W2 steps/s appendfsync always/everysec (goal >= 0.70)"),
    # Issue 17's costs, as throughput kept: a cost <= 10 % (25 %) is on/off >= 0.90 (0.75).
    "durable+metrics": ("W2", "steps_per_s", "W2 steps/s metrics on/off (goal >= 0.90: cost <= 10 %)"),
    "durable+tracing": ("W2", "steps_per_s", "W2 steps/s tracing on/off (goal >= 0.75: cost <= 25 %)"),
}


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str, *, percent: bool = False) -> str:
    """``a[key] / b[key]`` as text, with the spread of the per-turn ratios when both ran in
    turns (``turns_<key>``, in the order run), or ``""`` when either is missing."""
    if not a or not b or not isinstance(a.get(key), (int, float)) or not b.get(key):
        return ""
    fmt = (lambda r: f"{100 * r:.0f} %") if percent else (lambda r: f"{r:.2f}")
    text = fmt(a[key] / b[key])
    ta, tb = a.get(f"turns_{key}", []), b.get(f"turns_{key}", [])
    if len(ta) == len(tb) > 1:
        per = sorted(x / y for x, y in zip(ta, tb, strict=True) if y)
        text += f" (per turn {fmt(per[0])}–{fmt(per[-1])}, n={len(per)})"
    return text


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")


def write_plots(
    folder: Path, figures: dict[str, dict[str, dict[str, Any]]], workloads: list[str]
) -> list[Path]:
    """The two PNGs (see the module docstring); the paths written."""
    try:
        # Lazy: matplotlib is an optional extra and slow to import.
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    engines = list(figures)
    shown = [w for w in workloads if any(headline(w, figures[e].get(w)) for e in engines)]
    written = []
    if shown:
        cols = min(4, len(shown))
        rows = math.ceil(len(shown) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
        for ax, w in zip(axes.flat, shown, strict=False):
            values = [headline(w, figures[e].get(w)) or 0.0 for e in engines]
            bars = ax.bar(engines, values, color=["C0", "C1", "C2", "C3"][: len(engines)])
            ax.set_yscale("log")
            ax.set_title(
                HEADLINE[w][2] + (" (lower is better)" if HEADLINE[w][1] == "time" else ""), fontsize=8
            )
            ax.bar_label(bars, labels=[f"{v:.3g}" if v else "n/a" for v in values], fontsize=7)
            ax.tick_params(labelsize=7)
        for ax in list(axes.flat)[len(shown) :]:
            ax.axis("off")
        fig.tight_layout()
        written.append(folder / "table.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    samples = {e: figures[e].get("W1", {}).get("samples_s") for e in engines}
    samples = {e: s for e, s in samples.items() if s}
    if samples:
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        for engine, times in samples.items():
            ordered = sorted(t * 1000 for t in times)
            ax.step(
                ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], where="post", label=engine
            )
        ax.set_xscale("log")
        ax.set_xlabel("W1 start -> result (ms, log scale)")
        ax.set_ylabel("fraction of runs")
        ax.set_title("W1 latency distribution (10 sequential activities)")
        ax.legend()
        fig.tight_layout()
        written.append(folder / "w1_latency.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written
