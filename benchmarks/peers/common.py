"""Helpers shared by every engine's workloads: options, statistics, ports, processes.

Every workloads module (``workloads_durable``, ``peers.temporal_workloads``,
``peers.dbos_workloads``) exposes the same surface:

* ``NAME`` and ``unavailable() -> str | None`` (why the engine cannot run here);
* ``Engine(options)``: a context manager that starts what the engine needs
  (servers, workers) and stops all of it on exit, even on error;
* on the engine, the workloads with identical signatures, each returning a
  dict of figures (seconds, rates, bytes):
  ``w1(n_runs)``, ``w2(n_workflows)``, ``w3(n_branches, repeats)``,
  ``w4(n_samples, seconds)``, ``w5(n_samples)``, ``w6(sizes)``, ``w7(n_runs)``.
  A workload an engine does not implement raises :class:`NotMeasured`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

STEPS = 10  # activities per workflow in W1/W2


class NotMeasured(Exception):
    """This engine has no implementation of the workload (never a faked figure)."""


@dataclass
class Options:
    tmpdir: Path
    processes: int = 2
    appendfsync: str = "everysec"
    quick: bool = False
    verbose: bool = False
    eager: bool = False
    cluster: int = 0  # durable only: > 0 runs on a local Redis Cluster of that many masters
    metrics: bool = False  # durable only: workers record and serve Prometheus metrics
    tracing: bool = False  # durable only: OpenTelemetry spans in the client and the workers


def exit_on_sigterm() -> None:
    """Make SIGTERM exit like Ctrl-C does, through every ``with``: the engines' servers and
    workers are stopped instead of left running (Python's default SIGTERM ends at once)."""

    def stop(signum: int, _frame: object) -> None:
        # Once: a second SIGTERM (``timeout`` passes its own on to the child, so ``pkill -f``
        # of the command line sends two) would interrupt the clean-up this one starts,
        # leaving the engine's Redis running.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, int(round(q / 100 * len(ordered))))
    return ordered[min(rank, len(ordered)) - 1]


def latency_summary(times: Sequence[float]) -> dict[str, float]:
    return {
        "p50_s": statistics.median(times),
        "p95_s": percentile(times, 95),
        "min_s": min(times),
        "n": len(times),
        "samples_s": list(times),  # the distribution, for the plots
    }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode} before listening on {port}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} within {timeout:.0f} s")


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.001, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what or predicate}")
        time.sleep(interval)


def stop_process_group(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM a process started with ``start_new_session=True`` and its group; SIGKILL if it lingers."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    # Children that outlived their parent (same session/group): kill them too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int, *, main_thread: bool = False) -> float:
    """User + system CPU seconds of a process so far (0 when it is gone); with ``main_thread``,
    of its main thread only (whose thread id is the process's)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat" if main_thread else f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
