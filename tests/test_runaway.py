"""Runaway workflow code (issue 13 item 9): a decision that does not return within
``--decision-timeout`` blocks its run (``decision exceeded ... at file:line``) and its worker
process is replaced, so the other runs continue; SIGTERM ends a worker whatever its workflows do."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import greenlet
import pytest
from apps import runaway
from apps.runaway import LongActivityStep, Sleepy, Spin, StepThenSpin, ThreeSteps
from click.testing import CliRunner
from procs import ROOT, TESTS
from waiting import wait_for

from durable import WorkflowBlocked, WorkflowStub
from durable.store.redis_store import RedisStore
from workers.cli import cli
from workers.decider import Task
from workers.watchdog import RESTARTS_ENV, RUNAWAY_EXIT, STOP_TIMEOUT_EXIT, DecisionWatchdog, Stuck
from workers.worker import Worker, WorkerThread


def _line_of(cls: type, marker: str) -> int:
    lines, first = inspect.getsourcelines(cls)
    return first + next(i for i, text in enumerate(lines) if marker in text)


SPIN_AT = f"runaway.py:{_line_of(Spin, 'the runaway line')} in handle"
STEP_SPIN_AT = f"runaway.py:{_line_of(StepThenSpin, 'the runaway line after a step')} in handle"
SLEEP_AT = f"runaway.py:{_line_of(Sleepy, 'the sleeping line')} in handle"


def _cli(*args: str) -> str:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False).output


@contextmanager
def _worker(
    redis_url: str, log: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen]:
    """`durable worker --app apps.runaway ARGS`, its stderr (and its children's) in ``log``."""
    env = dict(
        os.environ, DURABLE_REDIS_URL=redis_url, PYTHONPATH=f"{TESTS}{os.pathsep}{ROOT}", **(env or {})
    )
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "worker", "--app", "apps.runaway", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def _blocked_reason(stub: WorkflowStub, timeout: float) -> str:
    blocked = wait_for(stub.blocked, timeout=timeout)
    assert blocked.kind == "runaway_decision"
    return blocked.message


@pytest.mark.slow
def test_runaway_runs_are_blocked_and_the_others_complete(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    with _worker(redis_url, log, "--processes", "2", "--concurrency", "2"):
        # Both processes up before the runaways: with one, the first exit would leave no live
        # worker (rightly reported as such) until the supervisor's restart joins.
        wait_for(lambda: len(store.live_workers()) == 2, timeout=30)
        saga = WorkflowStub.make(ThreeSteps).start()
        assert saga.result(timeout=30) == ["reserve", "charge", "ship"]
        started = time.monotonic()
        spin = WorkflowStub.make(Spin).start()
        sleepy = WorkflowStub.make(Sleepy).start(20.0)
        saga = WorkflowStub.make(ThreeSteps).start()
        reason = _blocked_reason(spin, timeout=15)
        assert reason.startswith(f"decision exceeded 2 s at tests/apps/{SPIN_AT}")
        assert _blocked_reason(sleepy, timeout=15).startswith(
            f"decision exceeded 2 s at tests/apps/{SLEEP_AT}"
        )
        assert saga.result(timeout=30) == ["reserve", "charge", "ship"]
        assert time.monotonic() - started < 20  # not the 20 s of the sleep
        # Every way of looking at the run says why it does not move.
        with pytest.raises(WorkflowBlocked, match="decision exceeded"):
            spin.result(timeout=5)
        assert _cli("status", spin.id).strip() == f"pending (blocked: {reason})"
        described = json.loads(_cli("describe", spin.id, "--json"))
        assert described["blocked_kind"] == "runaway_decision" and SPIN_AT in described["blocked"]
        # Terminate closes the runaway run; the restarted workers never pick it up again.
        assert "terminated" in _cli("terminate", spin.id, "--reason", "runaway")
        assert spin.status() == "terminated"
        after = WorkflowStub.make(ThreeSteps).start()
        assert after.result(timeout=30) == ["reserve", "charge", "ship"]
    text = log.read_text()
    assert f"run {spin.run_id}: decision exceeded 2 s" in text and SPIN_AT in text
    assert text.count("exits (70): run") == 2  # one worker process per runaway run, no more
    assert "gave up a runaway decision" in text  # the supervisor restarted it


@pytest.mark.slow
def test_sigterm_ends_a_worker_stuck_in_a_busy_loop(redis_url: str, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    with _worker(redis_url, log, "--decision-timeout", "0", "--grace", "1") as proc:
        assert WorkflowStub.make(ThreeSteps).start().result(timeout=30) == ["reserve", "charge", "ship"]
        WorkflowStub.make(Spin).start()
        time.sleep(1.0)  # the worker is deciding it, forever
        assert proc.poll() is None
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == STOP_TIMEOUT_EXIT
        assert time.monotonic() - stopped < 1 + 5 + 2  # grace + the stop margin + a bit
    text = log.read_text()
    assert (
        f"still stopping 6 s after the stop signal (grace + 5 s), its main thread at tests/apps/{SPIN_AT}"
        in text
    )


def test_single_process_worker_restarts_in_place_after_a_runaway_decision(
    redis_url: str, tmp_path: Path
) -> None:
    """It exited (70) and stayed down, every other run of its queues waiting, when no supervisor
    ran it (the guide's `durable worker --app shop`)."""
    log = tmp_path / "worker.log"
    with _worker(redis_url, log, "--decision-timeout", "0.5") as proc:
        wait_for(lambda: "serving queues" in log.read_text(), timeout=20)
        spin = WorkflowStub.make(Spin).start()
        assert _blocked_reason(spin, timeout=20).startswith("decision exceeded 0.5 s at tests/apps/")
        wait_for(lambda: "restarts in place (1 in the last minute)" in log.read_text(), timeout=20)
        # The same process (the same pid), serving again.
        assert WorkflowStub.make(ThreeSteps).start().result(timeout=30) == ["reserve", "charge", "ship"]
        assert proc.poll() is None
    assert log.read_text().count("serving queues") == 2


def test_a_worker_told_to_stop_while_it_gives_up_a_runaway_decision_exits(
    redis_url: str, tmp_path: Path
) -> None:
    """SIGTERM while the worker finished its activities before restarting in place: it restarted
    all the same, and served on (the re-check pass, F6: systemd would SIGKILL it later)."""
    log = tmp_path / "worker.log"
    with _worker(redis_url, log, "--decision-timeout", "0.5") as proc:
        wait_for(lambda: "serving queues" in log.read_text(), timeout=20)
        slow = WorkflowStub.make(LongActivityStep).start(10.0)  # the stop waits for it: the window
        running = lambda: [p for p in slow.describe().pending if "running on" in str(p.get("state"))]  # noqa: E731
        wait_for(running, timeout=10)  # its activity runs (attempts lists finished ones)
        WorkflowStub.make(Spin).start()
        wait_for(lambda: "decision exceeded 0.5 s" in log.read_text(), timeout=20)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == RUNAWAY_EXIT
    text = log.read_text()
    assert "received SIGTERM" in text and "restarts in place" not in text
    # Its activity finished before it exited (the run's next step waits for a worker).
    assert [a["outcome"] for a in slow.describe().attempts] == ["completed"]


def test_a_worker_restarting_in_place_too_often_exits(redis_url: str, tmp_path: Path) -> None:
    """Five restarts in place within a minute: it exits (70) rather than loop."""
    log, recent = tmp_path / "worker.log", ",".join(str(time.time() - 1) for _ in range(5))
    with _worker(redis_url, log, "--decision-timeout", "0.5", env={RESTARTS_ENV: recent}) as proc:
        spin = WorkflowStub.make(Spin).start()
        assert proc.wait(20) == RUNAWAY_EXIT
        assert _blocked_reason(spin, timeout=1).startswith("decision exceeded 0.5 s at tests/apps/")
    text = log.read_text()
    assert "(5 restarts in place within a minute)" in text and "Run workers under a supervisor" in text


@pytest.mark.parametrize("eager", [False, True])
def test_a_worker_thread_blocks_the_run_without_exiting(store: RedisStore, eager: bool) -> None:
    runaway.SPINNING["on"] = True
    worker = Worker(store, concurrency=2, grace=5, block_ms=100, decision_timeout=0.5, eager=eager)
    try:
        with WorkerThread(worker):
            # Eager: the loop runs in the decision applying the activity's result (no workflow task).
            spin = WorkflowStub.make(StepThenSpin if eager else Spin).start()
            assert _blocked_reason(spin, timeout=10).startswith("decision exceeded 0.5 s at ")
            assert (STEP_SPIN_AT if eager else SPIN_AT) in spin.describe().blocked.message
            parked = [d for d in store.dead_letters() if d["run"] == spin.run_id]
            assert [bool(d["entry"]) for d in parked] == [not eager]  # eager: no workflow task to park
            # The thread is a test's: it cannot exit, so the code is stopped (it spun on, a core
            # busy for the rest of the test session, and the environment's close waited 15 s).
            saga = WorkflowStub.make(ThreeSteps).start()
            assert saga.result(timeout=20) == ["reserve", "charge", "ship"]  # the spin still on
            cpu = time.process_time()
            time.sleep(1.0)
            assert time.process_time() - cpu < 0.5, "the workflow code still spins"
            assert spin.status() in ("pending", "running") and spin.blocked() is not None  # nothing committed
            # The code fixed, a repair decides it again.
            runaway.SPINNING["on"] = False
            store.repair(spin.id)
            assert spin.result(timeout=20) == "released"
    finally:
        runaway.SPINNING["on"] = True


def _watch(timeout: float) -> tuple[DecisionWatchdog, list[Stuck]]:
    found: list[Stuck] = []
    watchdog = DecisionWatchdog(timeout, found.append)
    watchdog.start()
    return watchdog, found


TASK = Task(0, "stream", "1-0", {b"run": b"r1"})


def test_the_watchdog_ignores_waits_on_redis_and_code_that_yields(redis_client) -> None:
    watchdog, found = _watch(0.3)
    try:
        with watchdog.deciding(TASK):
            redis_client.blpop(["h1-nothing"], timeout=1)  # the decider waiting on Redis
        hub = greenlet.getcurrent()
        yielding = greenlet.greenlet(lambda: [(time.sleep(0.1), hub.switch()) for _ in range(8)])
        with watchdog.deciding(TASK):
            for _ in range(8):  # workflow code that hands control back every 0.1 s
                yielding.switch()
        assert found == []
        with watchdog.deciding(TASK):
            time.sleep(0.8)
        assert [s.task for s in found] == [TASK] and found[0].where.endswith(
            "in test_the_watchdog_ignores_waits_on_redis_and_code_that_yields"
        )
        assert found[0].reason.startswith("decision exceeded 0.3 s at tests/test_runaway.py:")
    finally:
        watchdog.stop()


def _status_saying(workflow_id: str, words: str) -> str:
    """``durable status`` of a run once it says ``words``."""
    return wait_for(lambda: (said := _cli("status", workflow_id)) and words in said and said, timeout=20)


@pytest.mark.slow
def test_a_stalled_decision_with_no_deadline_is_named_by_status_and_workers(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    """With --decision-timeout off nothing blocks a decision that never returns, and its worker
    decides nothing else: the views say which worker, which run, and the code's line, rather
    than "delivered ... and is not decided yet" / "waits on queue ... for a worker"."""
    log = tmp_path / "worker.log"
    with _worker(redis_url, log, "--decision-timeout", "0", "--grace", "1") as proc:
        wait_for(lambda: len(store.live_workers()) == 1, timeout=30)
        spin = WorkflowStub.make(Spin).start()
        said = _status_saying(spin.id, "has been deciding")
        assert f"has been deciding run {spin.run_id} for " in said, said
        assert f" s at tests/apps/{SPIN_AT} (--decision-timeout off) without yielding" in said
        assert f"`durable terminate {spin.id}`" in said and "it decides nothing else" in said
        # A run started meanwhile waits for that worker: its status says what holds it.
        other = WorkflowStub.make(ThreeSteps).start()
        said = _status_saying(other.id, "has been deciding")
        assert f"has been deciding run {spin.run_id} " in said and "durable terminate" not in said
        report = json.loads(_cli("workers", "--json"))
        (worker,) = report["workers"]
        assert worker["deciding_run"] == spin.run_id and SPIN_AT in worker["deciding_note"]
        assert "stalled: worker" in _cli("workers")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == STOP_TIMEOUT_EXIT
    text = log.read_text()
    assert f"run {spin.run_id}: its decision has run workflow code for " in text and SPIN_AT in text


FROZEN_DECISION = """
import sys, threading, time
from workers.decider import Task
from workers.watchdog import DecisionWatchdog

stuck = []
watchdog = DecisionWatchdog(2.0, stuck.append)
watchdog.start()
with watchdog.deciding(Task(0, "s", "1-0", {b"run": b"r-frozen"})):
    print("deciding", flush=True)
    time.sleep(1.5)  # within the deadline, but the process is stopped meanwhile
time.sleep(0.6)
print("stuck" if stuck else "ok", flush=True)
"""


def test_a_worker_stopped_mid_decision_does_not_block_the_run_as_a_runaway(tmp_path: Path) -> None:
    """SIGSTOP (or a paused VM) during a decision: once continued, the watchdog counted the
    stopped time against the workflow code and blocked a healthy run (found by the fault suite)."""
    script = tmp_path / "frozen.py"
    script.write_text(FROZEN_DECISION)
    env = dict(os.environ, PYTHONPATH=f"{TESTS}{os.pathsep}{ROOT}")
    proc = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "deciding"
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(3.0)
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.stdout.readline().strip() == "ok"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
