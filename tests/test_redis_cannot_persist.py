"""Redis that cannot write to disk (a full disk, a data directory it cannot write) refuses
every write with ``MISCONF``: workers wait it out, and the operator surface says why.

A worker took ``MISCONF`` for a bug: it stopped with ``error: redis: MISCONF ...``, and
``durable status``/``describe`` failed with the same line (a registry read tidies the index, a
write). Here a private Redis (``fresh_redis``) is made unable to save an RDB snapshot -- its
``dir`` is a directory that is then removed, and ``BGSAVE`` fails -- which, with save points and
``stop-writes-on-bgsave-error`` (the default), is what a full disk does. Real processes; each
one a test starts is stopped by pid.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis
from apps.basic import SlowSteps
from procs import durable_cli, spawn_logged_worker, stop
from waiting import wait_for

from durable import Schedule, ScheduleHandle, WorkflowStub, schedule_health
from durable.store.embedded import EmbeddedRedis
from durable.store.memory import REDIS_CANNOT_PERSIST, write_refusal
from durable.store.redis_store import RedisStore

DISK_REASON = "Redis cannot write to disk (its last RDB snapshot failed): it refuses every write (MISCONF)"


def _bgsave_done(client: redis.Redis) -> bool:
    return not int(client.info("persistence")["rdb_bgsave_in_progress"])


def break_persistence(client: redis.Redis, tmp_path: Path) -> None:
    """Make Redis's snapshots fail (its ``dir`` removed under it); it then refuses writes."""
    gone = tmp_path / "gone"
    gone.mkdir()
    try:
        client.config_set("dir", str(gone))
    except redis.ResponseError as exc:  # Redis 7 protects `dir` (enable-protected-configs)
        pytest.skip(f"this redis-server refuses CONFIG SET dir: {exc}")
    gone.rmdir()
    client.config_set("save", "3600 1")
    wait_for(lambda: _bgsave_done(client), timeout=10)
    client.bgsave()
    wait_for(lambda: _bgsave_done(client) and client.info("persistence")["rdb_last_bgsave_status"] == "err")
    with pytest.raises(redis.ResponseError) as refused:
        client.set("probe", 1)
    assert write_refusal(refused.value) == "disk", refused.value


def mend_persistence(client: redis.Redis, data_dir: Path) -> None:
    """The remedy: a data directory Redis can write, then a snapshot that succeeds."""
    client.config_set("dir", str(data_dir))
    client.bgsave()
    wait_for(lambda: _bgsave_done(client) and client.info("persistence")["rdb_last_bgsave_status"] == "ok")
    client.config_set("save", "")


def test_a_worker_waits_while_redis_cannot_persist_and_the_views_say_why(
    fresh_redis: EmbeddedRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schedule_health, "OVERDUE_AFTER_S", 1.0)
    url = fresh_redis.url
    client = redis.Redis.from_url(url)
    store = RedisStore(url)
    effects, worker_log = tmp_path / "steps.log", tmp_path / "worker.log"
    proc = spawn_logged_worker(url, worker_log, "--claim-idle", "3", "--concurrency", "2")
    try:
        wait_for(lambda: store.live_workers(), timeout=30)
        stub = WorkflowStub.make(SlowSteps, id="disk-run", store=store).start(str(effects), 3, 1.0)
        wait_for(lambda: effects.exists() and "start s0" in effects.read_text(), timeout=30)
        ticks = ScheduleHandle.create(
            "disk-ticks",
            Schedule(workflow="SlowSteps", args=(str(tmp_path / "t"), 0, 0), every=1),
            store=store,
        )
        break_persistence(client, tmp_path)
        try:
            state = store.memory_state()
            assert state.kind == REDIS_CANNOT_PERSIST and state.reason is not None
            assert state.reason.startswith(DISK_REASON), state.reason

            status = durable_cli(url, "status", "disk-run")
            assert status.returncode == 0, status.stderr  # it failed with `error: redis: MISCONF ...`
            assert DISK_REASON in status.stdout, status.stdout
            info = json.loads(durable_cli(url, "describe", "disk-run", "--json").stdout)
            assert info["blocked_kind"] == REDIS_CANNOT_PERSIST, info
            assert info["blocked"].startswith(DISK_REASON) and "free disk space" in info["blocked"]
            report = json.loads(durable_cli(url, "workers", "--json").stdout)
            assert report["problem"].startswith(DISK_REASON), report["problem"]
            # The schedule's times cannot be claimed either: it says why.
            overdue = wait_for(lambda: ticks.describe().overdue, timeout=10)
            assert "has not fired: " + DISK_REASON in overdue, overdue

            wait_for(lambda: "Redis cannot write to disk: it refused" in worker_log.read_text(), timeout=10)
            time.sleep(2)  # refused writes for a while: the worker waits, it does not stop
            assert proc.poll() is None, worker_log.read_text()
        finally:
            mend_persistence(client, fresh_redis.data_dir)
        assert store.memory_state().reason is None
        assert stub.result(timeout=60) == ["s0", "s1", "s2", "end"]
    finally:
        stop(proc)
        store.close()
        client.close()
    log = worker_log.read_text()
    # Once per episode, not per refused write (a write of the loop in flight as Redis came back
    # can start a second, 0.2 s episode).
    assert 1 <= log.count("Redis cannot write to disk: it refused") <= 2, log
    assert "Traceback" not in log, log
    # Each step ran once, as attempt 1: the worker did not take its own attempt for abandoned.
    assert effects.read_text().splitlines() == ["start s0 1", "start s1 1", "start s2 1"]
