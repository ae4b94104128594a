"""Fault-injection scenarios (CI size): real worker processes, real Redis, injected crashes.

Each test runs one scenario of ``faults_harness`` and asserts its invariants:
every run closed exactly once with its expected result, contiguous seqs, each
command scheduled once and completed at most once, each idempotency-keyed effect
applied exactly once, no task of a live run left pending, every dead letter
explained. For a long run: ``python tests/faults/faults_harness.py --soak --minutes 10``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from faults_harness import SCENARIOS, Outcome, run_scenario

from durable.store.embedded import EmbeddedRedis

pytestmark = [pytest.mark.fault, pytest.mark.slow, pytest.mark.timeout(180)]


def _server(path: Path, appendfsync: str) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(path, appendfsync=appendfsync)
    server.ensure()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_always(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A private embedded Redis with ``appendfsync always`` (killed and restarted by the test)."""
    yield from _server(tmp_path / "redis-always", "always")


@pytest.fixture
def redis_everysec(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A private embedded Redis with ``appendfsync everysec``."""
    yield from _server(tmp_path / "redis-everysec", "everysec")


def assert_clean(out: Outcome) -> None:
    assert not out.violations, "\n".join(out.violations[:30])
    assert not out.duplicated, f"runs or effects duplicated: {out.duplicated}"
    assert not out.lost, f"acknowledged runs that never finished: {out.lost}"
    assert out.completed + len(out.lost_in_window) == out.workflows


def test_worker_sigkills_at_every_fault_point(redis_url: str, tmp_path: Path) -> None:
    out = run_scenario("worker_kills", url=redis_url, workdir=tmp_path, seed=11)
    assert_clean(out)
    assert out.completed == out.workflows
    kills = sum(n for kind, n in out.faults.items() if kind.startswith("worker_sigkill@"))
    assert kills >= 3, f"too few kills to mean anything: {dict(out.faults)}"


def test_eager_lease_follows_claim_idle(redis_url: str, tmp_path: Path) -> None:
    """An eager worker dies right after running an activity it leased; another worker should
    finish the run about --claim-idle later, not after the fixed 60 s lease."""
    from faults_app import ChaosChild
    from faults_harness import WorkerProc

    from durable import WorkflowStub

    doomed = WorkerProc(redis_url, tmp_path, 1, {"activity.after_effect": 1.0}, 1, 1.0, eager=True)
    stub = WorkflowStub.make(ChaosChild).start(str(tmp_path / "run"), 3)
    assert doomed.proc.wait(30) == -9, "the eager worker should SIGKILL itself after the activity"
    doomed.stop()
    assert doomed.kills() == {"activity.after_effect": 1}
    rescuer = WorkerProc(redis_url, tmp_path, 2, {}, 2, 1.0)
    try:
        assert stub.result(timeout=15) == 7
    finally:
        rescuer.stop()


def test_duplicated_deliveries_and_stalled_workers(redis_url: str, tmp_path: Path) -> None:
    out = run_scenario("duplicates_and_stalls", url=redis_url, workdir=tmp_path, seed=12)
    assert_clean(out)
    assert out.completed == out.workflows
    assert sum(n for kind, n in out.faults.items() if kind.startswith("duplicate_")) >= 5
    assert out.faults["worker_stalls(SIGSTOP)"] >= 1


def test_redis_sigkill_appendfsync_always_loses_nothing(redis_always: EmbeddedRedis, tmp_path: Path) -> None:
    out = run_scenario(
        "redis_kill_always", url=redis_always.url, server=redis_always, workdir=tmp_path / "work", seed=13
    )
    assert_clean(out)
    assert out.completed == out.workflows
    assert out.faults["redis_kills(always)"] == SCENARIOS["redis_kill_always"].redis_kills


def test_redis_sigkill_appendfsync_everysec_no_corruption(
    redis_everysec: EmbeddedRedis, tmp_path: Path
) -> None:
    """everysec may lose up to ~1 s (2 s with a slow disk) of acknowledged writes: only runs
    whose start and signal were acknowledged before that window must finish; none may be corrupt."""
    out = run_scenario(
        "redis_kill_everysec",
        url=redis_everysec.url,
        server=redis_everysec,
        workdir=tmp_path / "work",
        seed=14,
    )
    assert_clean(out)


def test_everything_at_once(redis_always: EmbeddedRedis, tmp_path: Path) -> None:
    out = run_scenario(
        "everything", url=redis_always.url, server=redis_always, workdir=tmp_path / "work", seed=15
    )
    assert_clean(out)
    assert out.completed == out.workflows


def test_redis_stalled_past_the_socket_timeout_ends_no_worker(
    redis_always: EmbeddedRedis, tmp_path: Path
) -> None:
    """Redis SIGSTOPped for longer than the clients' socket timeout: every worker call times
    out meanwhile; the workers wait it out (no restart) and every run finishes."""
    out = run_scenario(
        "redis_stall", url=redis_always.url, server=redis_always, workdir=tmp_path / "work", seed=40
    )
    assert_clean(out)
    assert out.completed == out.workflows
    assert out.faults["redis_stalls(SIGSTOP)"] == 1
    assert out.faults["worker_restarts"] == 0, f"a worker ended during the stall: {dict(out.faults)}"


def test_redis_at_maxmemory_ends_no_worker(redis_always: EmbeddedRedis, tmp_path: Path) -> None:
    """A period at maxmemory (noeviction): writes are refused with OOM, transactions with
    EXECABORT; the workers retry (no restart) and every run finishes once the limit is lifted."""
    out = run_scenario(
        "redis_oom", url=redis_always.url, server=redis_always, workdir=tmp_path / "work", seed=17
    )
    assert_clean(out)
    assert out.completed == out.workflows
    assert out.faults["redis_at_maxmemory"] == 1
    assert out.faults["worker_restarts"] == 0, f"a worker ended at maxmemory: {dict(out.faults)}"
