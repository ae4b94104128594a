"""Redis at ``maxmemory`` (noeviction): the operator surface says so, and workers keep their work.

Each test fills a private Redis (``fresh_redis``) until it answers ``OOM`` to writes, then
checks what ``durable workers``, ``describe`` and ``list``, the server's ``/healthz``, runs list
and runs page say (real processes), and that a live worker whose lease and heartbeat writes
were refused does not take its own running attempt for abandoned. Every process a test
starts is stopped by pid.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from apps.basic import PaysOnBilling, SlowSteps
from procs import durable_cli, spawn_logged_worker, stop
from server_procs import ServerProc
from waiting import wait_for

from durable import Schedule, ScheduleHandle, WorkflowStub
from durable.errors import RedisUnavailable
from durable.store import memory
from durable.store.embedded import EmbeddedRedis
from durable.store.memory import is_oom
from durable.store.redis_store import RedisStore

FILLER = "oomtest:filler:"
OOM_REASON = "Redis is out of memory (used "


def fill_until_oom(client: redis.Redis) -> int:
    """Lower ``maxmemory`` to a little above what is used (unless done already), then write
    until Redis refuses even a tiny write (big values first, then smaller ones: a refused big
    one leaves room for small ones); returns how many filler keys went in."""
    if not int(client.info("memory")["maxmemory"]):
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 16 * 1024 * 1024)
    written = len(list(client.scan_iter(f"{FILLER}*", count=1000)))
    for size in (64 * 1024, 4 * 1024, 256, 16):
        for _ in range(10_000):
            try:
                client.set(f"{FILLER}{written}", b"x" * size)
            except redis.ResponseError as exc:
                assert is_oom(exc), exc
                break
            written += 1
        else:
            raise AssertionError("Redis never refused a write")
    return written


def free(client: redis.Redis) -> None:
    """Lift the limit and drop the filler: writes are accepted again."""
    client.config_set("maxmemory", 0)
    for key in client.scan_iter(f"{FILLER}*", count=1000):
        client.delete(key)


@contextmanager
def kept_full(client: redis.Redis) -> Iterator[None]:
    """Fill Redis until OOM and keep it there: then ``maxmemory`` 1 MiB below what is used. At
    the limit itself Redis frees a few KB now and then (idle clients' buffers shrink, leases
    expire) and a worker's tiny heartbeat could slip through; a real workload takes them at once."""
    fill_until_oom(client)
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 1024 * 1024)
    try:
        yield
    finally:
        free(client)


@pytest.fixture
def full_client(fresh_redis: EmbeddedRedis) -> Iterator[redis.Redis]:
    """A client of the private server; its memory limit is lifted again after the test."""
    client = redis.Redis.from_url(fresh_redis.url)
    try:
        yield client
    finally:
        free(client)
        client.close()


def test_memory_state_says_when_writes_are_refused(
    fresh_redis: EmbeddedRedis, full_client: redis.Redis
) -> None:
    store = RedisStore(fresh_redis.url)
    try:
        before = store.memory_state()
        assert not before.refused and before.reason is None
        fill_until_oom(full_client)
        full = store.memory_state()
        assert full.refused and full.maxmemory > 0 and full.policy == "noeviction"
        assert full.reason is not None and full.reason.startswith(OOM_REASON)
        assert "of maxmemory" in full.reason and "writes are refused" in full.reason
        assert "durable purge" in full.reason
        free(full_client)
        assert store.memory_state().reason is None
    finally:
        store.close()


def test_a_start_refused_for_memory_says_so_and_writes_nothing(
    fresh_redis: EmbeddedRedis, full_client: redis.Redis
) -> None:
    """The client's error names the cause and the remedy (it said "refuses commands for now: see
    `durable workers`"); the start script's first write was refused, so nothing of it is kept."""
    store = RedisStore(fresh_redis.url, client_ride_s=0.5)
    try:
        with kept_full(full_client):
            with pytest.raises(RedisUnavailable) as refused:
                WorkflowStub.make(SlowSteps, id="oom-start", store=store).start("/nowhere", 1, 0.01)
            assert str(refused.value).startswith(
                f"Redis is out of memory at {fresh_redis.url}: it refuses writes"
            )
            assert "durable purge" in str(refused.value) and refused.value.kind == "OOM"
            assert "may have landed" not in str(refused.value)  # a refused first write wrote nothing
        assert store.instance_statuses(["oom-start"]) == [None]
        assert not list(full_client.scan_iter("*oom-start*"))
    finally:
        store.close()


def test_a_decision_refused_at_maxmemory_goes_through_once_memory_is_freed(
    fresh_redis: EmbeddedRedis, full_client: redis.Redis, tmp_path: Path
) -> None:
    """A worker reads a run's task (a read is allowed at maxmemory), its commit is refused: once
    Redis takes writes again the worker decides the task again itself, at once. It waited for a
    reclaim after --claim-idle (30 s by default), the run shown as pending with no reason."""
    url = fresh_redis.url
    store = RedisStore(url)
    worker_log = tmp_path / "worker.log"
    proc = spawn_logged_worker(url, worker_log, "--claim-idle", "120")
    try:
        # Serving, not only registered: stopped between the two, its join's lease write was the
        # one refused, and its loop (whose refusal this test reads) ran only after the episode.
        wait_for(lambda: "serving queues" in worker_log.read_text(), timeout=30)
        os.kill(proc.pid, signal.SIGSTOP)  # the task waits in its queue, unread
        try:
            stub = WorkflowStub.make(SlowSteps, id="oom-decide", store=store).start("/nowhere", 0, 0.0)
            with kept_full(full_client):
                os.kill(proc.pid, signal.SIGCONT)
                wait_for(lambda: "Redis is out of memory: it refused" in worker_log.read_text(), timeout=20)
                assert stub.status() == "pending"
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert stub.result(timeout=20) == ["end"]
    finally:
        stop(proc)
        store.close()
    assert "reclaimed" not in worker_log.read_text()


def test_workers_and_describe_say_redis_is_out_of_memory_and_the_worker_keeps_its_attempt(
    fresh_redis: EmbeddedRedis, full_client: redis.Redis, tmp_path: Path
) -> None:
    url = fresh_redis.url
    store = RedisStore(url)
    effects = tmp_path / "steps.log"
    worker_log = tmp_path / "worker.log"
    # Eager: the worker runs the activity under a lease it renews every --claim-idle / 3 s; at
    # maxmemory the renewals are refused for several times --claim-idle.
    proc = spawn_logged_worker(url, worker_log, "--eager", "--claim-idle", "3", "--concurrency", "2")
    try:
        wait_for(lambda: store.live_workers(), timeout=30)
        # One 16 s step: it runs through the whole episode (registry lapse ~10 s, then the checks).
        stub = WorkflowStub.make(SlowSteps, id="oom-run", store=store).start(str(effects), 1, 16.0)
        wait_for(lambda: effects.exists() and "start s0" in effects.read_text(), timeout=30)
        with kept_full(full_client):
            # The workers' registry heartbeats are refused: their entries lapse (TTL 10 s).
            wait_for(lambda: not store.live_workers(), timeout=20, interval=0.2)

            workers = durable_cli(url, "workers")
            assert workers.returncode == 0, workers.stderr
            assert OOM_REASON in workers.stdout and "writes are refused" in workers.stdout
            report = json.loads(durable_cli(url, "workers", "--json").stdout)
            assert report["problem"].startswith(OOM_REASON)
            assert report["redis_memory"]["refused"] is True

            described = durable_cli(url, "describe", "oom-run")
            assert described.returncode == 0, described.stderr
            assert OOM_REASON in described.stdout
            info = json.loads(durable_cli(url, "describe", "oom-run", "--json").stdout)
            blocked = info["blocked"]
            message = blocked["message"] if isinstance(blocked, dict) else str(blocked)
            assert message.startswith(OOM_REASON), info
            assert "heartbeats cannot be written" in message  # the registry's "no live worker" explained
            assert "Redis is out of memory: it refused" in worker_log.read_text()
            assert proc.poll() is None, worker_log.read_text()
        free(full_client)

        assert stub.result(timeout=60) == ["s0", "end"]
    finally:
        stop(proc)
        store.close()
    log = worker_log.read_text()
    assert log.count("Redis is out of memory: it refused") == 1, log
    assert "maxmemory" in log and "durable purge" in log
    # The activity's task was never taken for abandoned. (A workflow task whose commit the full
    # Redis refused may be reclaimed once --claim-idle passed: it decides again, nothing runs twice.)
    assert not [line for line in log.splitlines() if "stopped responding" in line and ":aq:" in line], log
    assert "timed out (lease)" not in log, log
    # The step ran once, as attempt 1: the worker never took its own attempt for abandoned.
    assert effects.read_text().splitlines() == ["start s0 1"]


def test_healthz_list_and_runs_page_say_redis_is_out_of_memory(
    fresh_redis: EmbeddedRedis, full_client: redis.Redis, tmp_path: Path
) -> None:
    """``/healthz`` answers 503, and the runs lists say why no run moves: ``durable list`` under
    its table (``--json`` on stderr, its stdout still the array), the API's page in ``problem``
    (as ``/api/v1/workers`` does), the UI's runs page in its banner."""
    url = fresh_redis.url
    store = RedisStore(url)
    # No worker: the run stays open, shown blocked for "no live worker" (the registry's view).
    WorkflowStub.make(SlowSteps, id="oom-listed", store=store).start("unused", 1, 0.1)
    server = ServerProc(url, tmp_path / "server.log")
    try:
        with server.client() as http:
            assert http.get("/healthz").status_code == 200
            assert http.get("/api/v1/workflows").json()["problem"] is None
            assert OOM_REASON not in durable_cli(url, "list").stdout
            fill_until_oom(full_client)
            answer = http.get("/healthz")
            assert answer.status_code == 503, answer.text
            error = answer.json()["error"]
            assert error["code"] == "redis_out_of_memory"
            assert error["message"].startswith(OOM_REASON) and "maxmemory" in error["message"]

            page = http.get("/api/v1/workflows")
            assert page.status_code == 200, page.text
            assert [r["workflow_id"] for r in page.json()["workflows"]] == ["oom-listed"]
            assert page.json()["problem"].startswith(OOM_REASON), page.json()
            assert "of maxmemory" in page.json()["problem"] and "durable purge" in page.json()["problem"]
            blocked = http.get("/api/v1/workflows", params={"status": "blocked"}).json()
            assert blocked["problem"].startswith(OOM_REASON), blocked
            html = http.get("/").text
            assert 'id="problem"' in html and "blocked-banner" in html

            listed = durable_cli(url, "list")
            assert listed.returncode == 0, listed.stderr
            assert "oom-listed" in listed.stdout and OOM_REASON in listed.stdout, listed.stdout
            assert "durable purge" in listed.stdout and "heartbeats cannot be written" in listed.stdout
            as_json = durable_cli(url, "list", "--json")
            assert [r["workflow_id"] for r in json.loads(as_json.stdout)] == ["oom-listed"]
            assert as_json.stderr.startswith("warning: " + OOM_REASON), as_json.stderr

            free(full_client)
            assert http.get("/healthz").json() == {"status": "ok", "warnings": []}
            assert http.get("/api/v1/workflows").json()["problem"] is None
    finally:
        server.stop()
        store.close()


def test_attempts_refused_at_maxmemory_are_one_warning_and_run_once_memory_is_freed(
    fresh_redis: EmbeddedRedis, full_client: redis.Redis, tmp_path: Path
) -> None:
    """Each activity task whose attempt Redis refused to begin was an ERROR with a 25-line
    traceback (19 of them in a tester's minute); the worker's other parts said one WARNING."""
    url = fresh_redis.url
    store = RedisStore(url)
    deciding, running = tmp_path / "decide.log", tmp_path / "billing.log"
    decider = spawn_logged_worker(url, deciding, "--queue", "default")
    biller = spawn_logged_worker(url, running, "--queue", "billing", "--concurrency", "4")
    try:
        wait_for(lambda: "serving queues" in running.read_text(), timeout=30)
        os.kill(biller.pid, signal.SIGSTOP)  # its activity tasks wait unread
        try:
            stubs = [WorkflowStub.make(PaysOnBilling, store=store).start(n) for n in range(6)]
            wait_for(lambda: all(s.status() == "running" for s in stubs), timeout=30)
            with kept_full(full_client):
                os.kill(biller.pid, signal.SIGCONT)
                wait_for(
                    lambda: "activity thread pool (beginning attempts)" in running.read_text(), timeout=20
                )
                assert all(s.status() == "running" for s in stubs)
        finally:
            os.kill(biller.pid, signal.SIGCONT)
        assert [s.result(timeout=60) for s in stubs] == [n + 1 for n in range(6)]
    finally:
        stop(biller)
        stop(decider)
        store.close()
    log = running.read_text()
    assert log.count("the activity thread pool (beginning attempts) retries") == 1, log
    assert "Traceback" not in log and "could not be recorded" not in log, log


def test_schedule_list_and_describe_answer_at_maxmemory(
    fresh_redis: EmbeddedRedis, full_client: redis.Redis
) -> None:
    """They read a schedule in a MULTI, whose EXEC Redis refuses at maxmemory: both failed, so
    the reason they give for a schedule that does not fire (Redis refusing writes) never showed."""
    url = fresh_redis.url
    store = RedisStore(url)
    try:
        ScheduleHandle.create("oom-s", Schedule(workflow="Tick", every="1h"), store=store)
        with kept_full(full_client):
            listed = durable_cli(url, "schedule", "list")
            assert listed.returncode == 0 and "oom-s" in listed.stdout, listed.stderr
            described = durable_cli(url, "schedule", "describe", "oom-s")
            assert described.returncode == 0, described.stderr
    finally:
        store.close()


def test_an_oom_episode_ends_only_once_writes_go_unrefused_for_a_while(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # At its maxmemory Redis takes some writes between refusals (those that free memory, a small
    # one as memory dips): each one said "Redis accepts writes again" and the next refusal began
    # a new episode with a new ERROR, while Redis was still full.
    monkeypatch.setattr(memory, "SETTLE_S", 0.3)
    log = logging.getLogger("test.oom")
    episode = memory.OomEpisode(log, "worker w-1")
    refused = redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'.")
    with caplog.at_level(logging.INFO, logger="test.oom"):
        for _ in range(3):
            assert episode.failed(refused)
            episode.wrote()  # a write that went through between two refusals
            assert episode.active
        time.sleep(0.4)
        episode.wrote()
    assert not episode.active
    lines = [r.getMessage() for r in caplog.records]
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.INFO], lines
    assert (
        lines[1].startswith("Redis accepts writes again: worker w-1 was refused for")
        and "(3 refused writes)" in lines[1]
    )
