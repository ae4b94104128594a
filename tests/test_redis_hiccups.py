"""Redis hiccups (a stall, BUSY, LOADING, OOM, EXECABORT) are waited out, not fatal.

The classification and the backoff/incident helpers are checked directly; a real
``durable worker`` process rides out a Lua script busy past ``lua-time-limit``
(BUSY) and finishes its run. Stalls (SIGSTOP of Redis) and ``maxmemory`` are in
the fault suite (``tests/faults``: ``redis_stall``, ``redis_oom``).

LOADING is not produced end to end: Redis 6.2 answers LOADING only while it loads
its dataset at startup (``DEBUG RELOAD`` blocks every client instead of answering),
and the embedded server cannot be started slow enough to load for long; its reply
is classified like the others here, and redis-py itself retries it first.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis
from apps.basic import Sequence, SlowSteps, Waiter
from outages import in_thread
from procs import ROOT, TESTS, spawn_worker, stop
from redis import exceptions as rexc
from server_procs import ServerProc, free_port
from waiting import wait_for

from durable import WorkflowStub
from durable.store.connect import is_missing_group, is_transient, unavailable_kind
from durable.store.embedded import EmbeddedRedis, find_redis_server
from durable.store.outage import Backoff, Incident, retry_transient
from durable.store.redis_store import RedisStore
from durable.store.wire import Wire
from durable.testing import TestEnvironment
from workers.worker import Worker, WorkerThread

SCRIPT_OOM = (
    "Error running script (call to f_1): @user_script:1: @user_script: 1: "
    "-OOM command not allowed when used memory > 'maxmemory'."
)


FAILOVER_UNBLOCK = (
    "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)"
)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (rexc.ResponseError("BUSY Redis is busy running a script. You can only call SCRIPT KILL"), "BUSY"),
        (rexc.ResponseError("Command # 1 (EVALSHA x) of pipeline caused error: BUSY Redis is busy"), "BUSY"),
        (rexc.BusyLoadingError("Redis is loading the dataset in memory"), "LOADING"),
        (rexc.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), "OOM"),
        (rexc.ResponseError(SCRIPT_OOM), "OOM"),
        (rexc.ExecAbortError("Transaction discarded because of previous errors."), "EXECABORT"),
        (rexc.MasterDownError("Link with MASTER is down"), "MASTERDOWN"),
        (rexc.TimeoutError("Timeout reading from socket"), "timeout"),
        (TimeoutError("timed out"), "timeout"),
        (rexc.ConnectionError("Connection closed by server."), "connection lost"),
        (ConnectionResetError(104, "reset"), "connection lost"),
        (rexc.MovedError("3999 127.0.0.1:6381"), "cluster reconfiguring"),
        (rexc.ClusterDownError("The cluster is down"), "CLUSTERDOWN"),
        (rexc.ResponseError(FAILOVER_UNBLOCK), "failover"),
    ],
)
def test_transient_errors_are_named(exc: BaseException, kind: str) -> None:
    assert unavailable_kind(exc) == kind
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        rexc.ResponseError("BUSYGROUP Consumer Group name already exists"),
        rexc.ResponseError("NOGROUP No such key 'x' or consumer group 'g'"),
        rexc.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        rexc.ResponseError("ERR value mentions OOM but is no refusal"),
        rexc.NoScriptError("No matching script."),
        rexc.AuthenticationError("invalid password"),
        ValueError("a bug"),
    ],
)
def test_other_errors_are_not_transient(exc: BaseException) -> None:
    assert unavailable_kind(exc) is None


def test_a_read_a_failover_cut_short_is_no_missing_stream() -> None:
    """Workers took it for their stream deleted and made their groups again on a replica."""
    assert not is_missing_group(rexc.ResponseError(FAILOVER_UNBLOCK))
    assert is_missing_group(rexc.ResponseError("UNBLOCKED the stream key no longer exists"))


def test_backoff_doubles_to_its_cap_with_jitter() -> None:
    backoff = Backoff(first=0.1, cap=5.0)
    delays = [backoff.next() for _ in range(12)]
    assert 0.05 <= delays[0] <= 0.1
    assert all(d <= 5.0 for d in delays)
    assert delays[-1] >= 2.5
    backoff.reset()
    assert backoff.next() <= 0.1


def test_an_incident_is_logged_once_when_it_starts_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    incident = Incident(logging.getLogger("durable.test"), "test loop")
    caplog.set_level(logging.INFO, logger="durable.test")
    for _ in range(5):
        incident.failed(rexc.ResponseError("BUSY Redis is busy running a script."))
    incident.failed(rexc.TimeoutError("Timeout reading from socket"))
    assert incident.active
    incident.recovered()
    incident.recovered()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len(lines) == 2, lines
    assert (
        lines[0][0] == "WARNING" and "redis unavailable (BUSY" in lines[0][1] and "test loop" in lines[0][1]
    )
    assert (
        lines[1][0] == "INFO"
        and "available again" in lines[1][1]
        and "BUSY, timeout; 6 failed" in lines[1][1]
    )


def test_a_settling_incident_ends_only_after_a_quiet_spell(caplog: pytest.LogCaptureFixture) -> None:
    incident = Incident(logging.getLogger("durable.test"), "test loop", settle=0.2)
    caplog.set_level(logging.INFO, logger="durable.test")
    incident.failed(rexc.OutOfMemoryError("command not allowed"))
    incident.recovered()  # too soon: a write may still be refused
    incident.failed(rexc.OutOfMemoryError("command not allowed"))
    assert incident.active and len(caplog.records) == 1
    time.sleep(0.25)
    incident.recovered()
    assert not incident.active and len(caplog.records) == 2


def test_an_outage_that_settled_unsaid_is_over_for_the_next_failure(caplog: pytest.LogCaptureFixture) -> None:
    """The calls that saw Redis answer again may all have ended before the quiet spell did: the
    next failure, much later, is a new outage (a WARNING, its own duration), not the old one
    still going (whose length would make the waits give up at once)."""
    incident = Incident(logging.getLogger("durable.test"), "test loop", settle=0.2)
    caplog.set_level(logging.INFO, logger="durable.test")
    incident.failed(rexc.ConnectionError("Connection refused"))
    incident.recovered()  # answered again; nobody calls again within the settle time
    time.sleep(0.4)
    assert incident.lasted == 0.0
    # It said so itself, once settled (no later call came to say it).
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]
    assert "redis available again: the test loop carries on" in caplog.records[1].getMessage()
    incident.failed(rexc.ConnectionError("Connection refused"))
    assert incident.lasted < 0.1
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO", "WARNING"]


def test_an_answer_followed_by_a_failure_within_the_settle_time_is_not_the_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    incident = Incident(logging.getLogger("durable.test"), "test loop", settle=0.2)
    caplog.set_level(logging.INFO, logger="durable.test")
    incident.failed(rexc.ConnectionError("Connection refused"))
    incident.recovered()
    incident.failed(rexc.ConnectionError("Connection refused"))  # voids the first answer's timer
    time.sleep(0.4)
    assert incident.active and [r.levelname for r in caplog.records] == ["WARNING"]
    incident.recovered()
    time.sleep(0.4)
    assert not incident.active and [r.levelname for r in caplog.records] == ["WARNING", "INFO"]


def test_retry_transient_retries_refusals_and_raises_the_rest() -> None:
    incident = Incident(logging.getLogger("durable.test"), "test")
    incident.backoff = Backoff(first=0.001, cap=0.01)
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise rexc.OutOfMemoryError("command not allowed")
        return "done"

    assert retry_transient(flaky, incident) == "done" and len(calls) == 4
    with pytest.raises(ValueError):
        retry_transient(lambda: (_ for _ in ()).throw(ValueError("bug")), incident)
    stop = threading.Event()
    stop.set()
    with pytest.raises(rexc.TimeoutError):
        retry_transient(lambda: (_ for _ in ()).throw(rexc.TimeoutError("t")), incident, stop=stop)


def test_a_transaction_refused_at_maxmemory_raises_the_refusal(fresh_redis: EmbeddedRedis) -> None:
    """EXECABORT carries no reason: the raw pipeline raises the OOM that caused it (as redis-py)."""
    client = redis.Redis.from_url(fresh_redis.url)
    try:
        client.set("filler", "x" * 1000)
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", client.info("memory")["used_memory"] + 1)
        with pytest.raises(rexc.OutOfMemoryError) as caught:
            Wire(client, lambda: None).transaction([("SET", "k", "v" * 10_000), ("GET", "filler")])
        assert is_transient(caught.value)
    finally:
        client.config_set("maxmemory", 0)
        client.close()


def _busy_script(url: str) -> threading.Thread:
    """Run a Lua busy loop in Redis (every other client gets BUSY) until SCRIPT KILL."""

    def run() -> None:
        client = redis.Redis.from_url(url, socket_timeout=None)
        try:
            client.eval("while true do end", 0)
        except rexc.ResponseError:
            pass  # killed
        finally:
            client.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.fault
@pytest.mark.slow
def test_a_worker_rides_out_a_busy_script(fresh_redis: EmbeddedRedis, tmp_path: Path) -> None:
    url = fresh_redis.url
    admin = redis.Redis.from_url(url)
    admin.config_set("lua-time-limit", 100)
    store = RedisStore(url)
    log = tmp_path / "slow.log"
    proc = spawn_worker(url)
    lines: list[str] = []
    reader = threading.Thread(target=_collect, args=(proc, lines), daemon=True)
    reader.start()
    try:
        stub = WorkflowStub.make(SlowSteps, store=store).start(str(log), 4, 0.4)
        wait_for(lambda: log.exists() and "start s1" in log.read_text())
        busy = _busy_script(url)
        wait_for(lambda: _is_busy(admin), timeout=5)
        time.sleep(3.0)  # the worker's completions, reads and timers meet BUSY meanwhile
        admin.script_kill()
        busy.join(5)
        assert proc.poll() is None, "the worker should wait out BUSY, not exit"
        assert stub.result(timeout=30) == ["s0", "s1", "s2", "s3", "end"]
        # The loop's incident ends after a quiet spell (its reads may work while writes fail).
        wait_for(lambda: any("worker loop carries on" in line for line in lines), timeout=15)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        reader.join(5)
    finally:
        stop(proc)
        store.close()
        admin.close()
    text = "".join(lines)
    assert "redis unavailable (BUSY" in text, text[-3000:]
    # One WARNING per part of the worker that met it (loop, scheduler, activity threads).
    assert text.count("redis unavailable (") <= 3, text[-3000:]
    effects = (tmp_path / "slow.log.effects" / "applied.log").read_text().split()
    assert len(effects) == len(set(effects)) == 4


def _is_busy(client: redis.Redis) -> bool:
    try:
        client.ping()
    except rexc.ResponseError as exc:
        return unavailable_kind(exc) == "BUSY"
    return False


def _collect(proc: subprocess.Popen, lines: list[str]) -> None:
    """Append the worker's stderr lines to ``lines`` as they come (and keep its pipe drained)."""
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line.decode(errors="replace"))


@pytest.mark.fault
def test_a_worker_started_while_redis_is_stalled_waits_then_serves(fresh_redis: EmbeddedRedis) -> None:
    """Found by the fault suite on a loaded machine: a worker whose start met a stall (its
    store's first read timed out) exited at once; a running one waits. Now both wait."""
    url = f"{fresh_redis.url}?socket_timeout=0.5"
    pid = fresh_redis.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    proc = spawn_worker(url)
    lines: list[str] = []
    reader = threading.Thread(target=_collect, args=(proc, lines), daemon=True)
    reader.start()
    try:
        wait_for(lambda: "redis unavailable (timeout" in "".join(lines), timeout=20)
        assert proc.poll() is None, "the worker should wait for Redis, not exit"
        assert "worker startup (Redis at" in "".join(lines)
        os.kill(pid, signal.SIGCONT)
        store = RedisStore(fresh_redis.url)
        try:
            stub = WorkflowStub.make(Sequence, store=store).start(3)
            assert stub.result(timeout=30) == 3  # 0 + 1 + 2
        finally:
            store.close()
    finally:
        os.kill(pid, signal.SIGCONT)
        stop(proc)
        reader.join(5)


@pytest.mark.fault
def test_the_cli_says_a_stalled_redis_and_durable_result_waits_it_out(fresh_redis: EmbeddedRedis) -> None:
    """Against a stalled Redis, `durable status` printed a bare `error: redis: Timeout reading
    from ...`, and `durable result --timeout 120` gave up after the first socket timeout."""
    url = f"{fresh_redis.url}?socket_timeout=0.5"
    store = RedisStore(fresh_redis.url)
    try:
        with WorkerThread(Worker(store, concurrency=2, grace=5, block_ms=100)):
            stub = WorkflowStub.make(Sequence, store=store).start(2)
            assert stub.result(timeout=30) == 1
    finally:
        store.close()
    pid = fresh_redis.pid
    assert pid is not None
    env = dict(os.environ, DURABLE_REDIS_URL=url, PYTHONPATH=f"{TESTS}{os.pathsep}{ROOT}")
    cli = [sys.executable, "-m", "workers.cli"]
    os.kill(pid, signal.SIGSTOP)
    try:
        status = subprocess.run(
            [*cli, "status", stub.id], env=env, capture_output=True, text=True, timeout=60
        )
        assert status.returncode == 1 and "did not answer in time" in status.stderr, status.stderr
        assert "it may be stalled" in status.stderr and "redis-cli -u" in status.stderr
        result = subprocess.Popen(
            [*cli, "result", stub.id, "--timeout", "60"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        time.sleep(3)  # its first tries meet the stall
    finally:
        os.kill(pid, signal.SIGCONT)
    out, err = result.communicate(timeout=60)
    assert result.returncode == 0 and out.decode().strip() == "1", (out, err)
    assert b"note: Redis does not answer" in err


def _tcp_redis(tmp_path: Path, name: str, *extra: str) -> tuple[subprocess.Popen[bytes], redis.Redis]:
    port = free_port()
    (tmp_path / name).mkdir()
    proc = subprocess.Popen(
        [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", *extra],
        cwd=tmp_path / name,
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    wait_for(lambda: _answers(client), timeout=10)
    return proc, client


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except rexc.ConnectionError:
        return False


@pytest.mark.fault
def test_a_result_waiting_through_a_failover_goes_on_waiting(tmp_path: Path) -> None:
    """Redis answers a blocked read with ``UNBLOCKED ... instance state changed`` when its server
    stops being a master (a cluster's or a Sentinel's failover): result() raised that reply (a
    Redis Cluster's graceful failover failed 4 of 30 waiting calls). It waits on instead."""
    primary, primary_client = _tcp_redis(tmp_path, "primary")
    port = primary_client.connection_pool.connection_kwargs["port"]
    replica, replica_client = _tcp_redis(tmp_path, "replica", "--replicaof", "127.0.0.1", str(port))
    try:
        store = RedisStore(f"redis://127.0.0.1:{port}")
        with TestEnvironment(store=store):
            stub = WorkflowStub.make(Waiter, id="failover-wait", store=store).start(0)
            wait_for(lambda: stub.status() == "suspended", timeout=15)
            waiting, out = in_thread(lambda: stub.result(timeout=60))
            time.sleep(0.5)  # the wait is blocked in its read
            wait_for(lambda: replica_client.info("replication").get("master_link_status") == "up")
            primary_client.execute_command("FAILOVER")  # the primary becomes the replica's replica
            wait_for(lambda: primary_client.info("replication")["role"] == "slave", timeout=15)
            time.sleep(1.0)
            assert waiting.is_alive() and not out, out
            primary_client.execute_command("REPLICAOF", "NO", "ONE")  # and master again
            wait_for(lambda: primary_client.info("replication")["role"] == "master", timeout=15)
            stub.signal("go", "after the failover")
            waiting.join(30)
            assert out == {"value": "after the failover"}, out
    finally:
        for proc in (replica, primary):
            proc.terminate()
            proc.wait(10)


@pytest.mark.fault
def test_the_api_answers_a_busy_redis_with_503_not_500(fresh_redis: EmbeddedRedis, tmp_path: Path) -> None:
    """A run's routes met Redis refusing commands (BUSY here; CLUSTERDOWN on a cluster) as an
    unexpected error: 500 ``internal`` and a traceback per request."""
    admin = redis.Redis.from_url(fresh_redis.url)
    admin.config_set("lua-time-limit", 100)
    store = RedisStore(fresh_redis.url)
    WorkflowStub.make(Waiter, id="busy-api", store=store).start(0)
    server = ServerProc(fresh_redis.url, tmp_path / "server.log")
    try:
        busy = _busy_script(fresh_redis.url)
        wait_for(lambda: _is_busy(admin), timeout=5)
        try:
            for method, path in (
                ("GET", "/api/v1/workflows/busy-api"),
                ("POST", "/api/v1/workflows/busy-api/signal/go"),
            ):
                reply = httpx.request(
                    method,
                    server.url + path,
                    json={"args": ["x"]},
                    headers={"X-Durable-Request": "1"},
                    timeout=30,
                )
                assert reply.status_code == 503, (path, reply.text)
                assert reply.json()["error"]["code"] == "redis_unavailable", reply.text
        finally:
            admin.script_kill()
            busy.join(5)
    finally:
        server.stop()
        store.close()
        admin.close()
    assert "Traceback" not in (tmp_path / "server.log").read_text()
