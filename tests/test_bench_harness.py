"""The benchmark harness's own logic, cheaply (one slow test starts an engine, to stop it).

* ``limit.py`` drives the real Lua scripts with plans it builds itself: when the commit
  script's plan grows a field, the ceiling fails (it did once, unnoticed); a few passes
  against the test Redis catch that.
* The ratios of issue 18 (W2A/W2, W2 / ceiling, W1 queued/eager, W2 always/everysec) and
  the grouping of workloads measured in turns.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from waiting import wait_for

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import harness  # noqa: E402
import limit  # noqa: E402
import report  # noqa: E402
from limit import Limit  # noqa: E402

from durable.store.redis_store import RedisStore  # noqa: E402


def test_limit_passes_run_on_the_real_scripts(redis_url: str) -> None:
    bench = Limit(RedisStore(redis_url, prefix="limit-test"), 4)
    bench.take_connection()
    try:
        before = limit.cpu(bench.store)
        steps, elapsed = bench.as_written(0.05)
        assert steps >= 4
        load = limit.busy(before, limit.cpu(bench.store), elapsed)
        assert load["redis_core"] > 0 and load["client_core"] > 0
        inbox = Limit(RedisStore(redis_url, prefix="limit-test-inbox"), 4)
        inbox.conn = bench.conn
        steps, _ = inbox.through_inbox(0.05)
        inbox.store.close()
        assert steps >= 4
        eager = Limit(RedisStore(redis_url, prefix="limit-test-eager"), 4)
        eager.conn = bench.conn
        steps, _ = eager.eager(0.05)
        eager.store.close()
        assert steps >= 4
    finally:
        bench.close()


def test_workloads_in_turns_are_grouped() -> None:
    assert harness.groups(["W1", "W2", "W3", "W2A", "CEIL"], 1) == [["W1"], ["W2", "W2A", "CEIL"], ["W3"]]
    assert harness.groups(["W1", "W2", "W3"], 2) == [["W1", "W2"], ["W3"]]


def test_merged_runs_keep_the_turn_order_and_pool_w1_samples() -> None:
    fig = harness.merge_runs("W2", [{"steps_per_s": 3.0}, {"steps_per_s": 1.0}, {"steps_per_s": 2.0}])
    assert fig["steps_per_s"] == 2.0
    assert fig["turns_steps_per_s"] == [3.0, 1.0, 2.0]
    w1 = harness.merge_runs("W1", [{"samples_s": [0.1, 0.3]}, {"samples_s": [0.2]}])
    assert w1["p50_s"] == 0.2 and w1["n"] == 3 and w1["rounds"] == 2


def test_issue_18_ratios() -> None:
    def w2(*turns: float) -> dict[str, object]:
        return {"steps_per_s": sorted(turns)[len(turns) // 2], "turns_steps_per_s": list(turns)}

    figures = {
        "durable": {"W1": {"p50_s": 0.008}, "W2": w2(100, 80), "W2A": w2(90, 80), "CEIL": w2(200, 100)},
        "durable+eager": {"W1": {"p50_s": 0.004}, "W2": w2(150, 150)},
        "durable+always": {"W2": w2(70, 40)},
    }
    lines = report.ratios(figures, ["W1", "W2", "W2A", "CEIL"])
    assert "W2A/W2 steps/s (durable) = 0.90 (per turn 0.90–1.00, n=2) (goal >= 0.80)" in lines
    assert (
        "W2 / limit.py ceiling as written (durable) = 50 % (per turn 50 %–80 %, n=2) (goal >= 80 %)" in lines
    )
    assert "W1 p50 queued/eager (goal <= 1.5) = 2.00" in lines
    # The ceiling's turns also ran the step through the inbox: merged, and its ratio printed.
    ceiling = harness.merge_runs(
        "CEIL",
        [
            {"steps_per_s": 200.0, "inbox_steps_per_s": 100.0},
            {"steps_per_s": 100.0, "inbox_steps_per_s": 40.0},
        ],
    )
    assert ceiling["turns_inbox_steps_per_s"] == [100.0, 40.0]
    figures["durable"]["CEIL"] = ceiling
    lines = report.ratios(figures, ["W2", "CEIL"])
    assert (
        "W2 / limit.py ceiling through the inbox, the step when issue 18 was filed (durable) = 100 % "
        "(per turn 100 %–200 %, n=2)"
    ) in lines
    assert "W2 steps/s appendfsync always/everysec (goal >= 0.70) = 0.70 (per turn 0.50–0.70, n=2)" in lines
    assert not [line for line in lines if "durable/durable+" in line]


def test_w2_cpu_bound_explains_the_ceiling_ratio() -> None:
    # 1,000 steps in 1 s using 0.1 + 0.5 + 0.4 s of CPU: 1 ms per step, so 2 cores allow
    # 2,000 steps/s (W2 reached 50 % of it), which is 50 % of a 4,000 steps/s ceiling.
    w2 = {
        "steps_per_s": 1000.0,
        "seconds": 1.0,
        "cpu_client_s": 0.1,
        "cpu_workers_s": 0.5,
        "cpu_redis_s": 0.4,
    }
    lines = report.ratios({"durable": {"W2": w2, "CEIL": {"steps_per_s": 4000.0}}}, ["W2", "CEIL"], cores=2)
    assert (
        "W2 CPU bound (durable): 1.00 ms CPU per step (client 0.10 + workers 0.50 + Redis 0.40) allow at "
        "most 2,000 steps/s on 2 cores; W2 reached 50 % of that, and the bound is 50 % of the ceiling"
    ) in lines
    # What bounds the ceiling itself: how busy its Redis and its one client were.
    ceiling = {"steps_per_s": 4000.0, "redis_core": 0.71, "client_core": 0.33}
    lines = report.ratios({"durable": {"W2": w2, "CEIL": ceiling}}, ["W2", "CEIL"], cores=2)
    assert any(
        line.endswith("50 % of the ceiling (whose Redis was busy 71 % of a core, its one client 33 %)")
        for line in lines
    )
    assert not [
        line for line in report.ratios({"durable": {"W2": {"steps_per_s": 1.0}}}, ["W2"]) if "bound" in line
    ]


def test_search_bench_times_searches_that_find_what_it_inserted() -> None:
    """It drives the start and terminate scripts itself: when their arguments change, it must
    fail (check_counts), not time empty results as it once did."""
    out = subprocess.run(
        [sys.executable, str(BENCH / "search_bench.py"), "--runs", "300", "--batch", "100", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    counts = json.loads(out.stdout)["count"]
    assert counts["status = 'closed' (all runs)"]["rows"] == 300
    assert counts["amount > 990 (numeric range)"]["rows"] > 0


def _engine_pids(marker: str) -> set[int]:
    """Live processes whose command line names ``marker`` (zombies are gone)."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (cmdline.parent / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue  # gone meanwhile
        if marker in text and state not in ("Z", "X"):
            found.add(int(cmdline.parent.name))
    return found


@pytest.mark.slow
def test_a_benchmark_stopped_by_sigterm_stops_what_it_started() -> None:
    """Its engine (an embedded Redis and a worker supervisor, each in a session of its own) is
    stopped on SIGTERM as on Ctrl-C; Python's default SIGTERM ended the script and left them
    running."""
    # Short: under a longer folder (pytest's, with xdist's popen-gwN) the embedded Redis puts its
    # unix socket elsewhere (sun_path's 108 bytes), and its command line no longer names it.
    folder = tempfile.mkdtemp(prefix="bench-", dir="/tmp")
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / "step_costs.py"), "--processes", "1", "--turns", "1000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, TMPDIR=folder),  # the engine's folder, named in its command lines
        start_new_session=True,
    )
    engine: set[int] = set()
    try:
        # The embedded Redis and the worker supervisor, both started in the benchmark's folder.
        engine = wait_for(lambda: (lambda pids: pids if len(pids) >= 2 else None)(_engine_pids(folder)), 60)
        time.sleep(1)  # into the turns
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) != 0
        wait_for(lambda: not _engine_pids(folder), timeout=30)
    finally:
        for pid in _engine_pids(folder) | (engine if proc.poll() is None else set()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
