"""Keys every run shares -- the worker registry, the known queues, a partition's runs index,
origin marker or timers, the namespace's settings -- holding another kind of value (made by
hand, or by another program sharing the database).

Each failed every command that read it with Redis's bare ``WRONGTYPE``, which names no key
(``durable list``, ``durable workers``, the API's 500 ``internal``); the registry's made every
worker log a warning each heartbeat, and the settings' or an origin marker's stopped workers at
their start. Now the commands name the key and say what to do, ``durable workers`` and the
API's health warn of it, workers start and serve beside it, and a schedule whose starts Redis
refuses says so in ``describe`` instead of "active".
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apps.basic import Waiter
from click.testing import CliRunner
from redis.exceptions import ResponseError
from server_procs import ServerProc
from waiting import wait_for

from durable import ConfigurationError, Schedule, ScheduleHandle, WorkflowStub, schedule_pass
from durable.schedule_pass import SchedulePass
from durable.store.redis_store import RedisStore
from durable.testing import TestEnvironment
from workers import broken_streams
from workers.cli import cli

REMEDY = "rename it aside or delete it, and durable makes it anew"


@pytest.fixture
def spoil(store: RedisStore) -> Iterator[list[str]]:
    """Put a string where a key of the namespace was (the key set aside), put back after the test:
    ``spoil.append(key)`` after the test's own ``spoil_key``."""
    spoiled: list[str] = []
    yield spoiled
    for key in spoiled:
        store.redis.delete(key)
        if store.redis.exists(key + ".aside"):
            store.redis.rename(key + ".aside", key)


def spoil_key(store: RedisStore, spoiled: list[str], key: str) -> None:
    if store.redis.exists(key):
        store.redis.rename(key, key + ".aside")
    store.redis.set(key, "not what durable keeps here")
    spoiled.append(key)


def mend(store: RedisStore, spoiled: list[str]) -> None:
    for key in spoiled:
        store.redis.delete(key)
        if store.redis.exists(key + ".aside"):
            store.redis.rename(key + ".aside", key)
    spoiled.clear()


@pytest.mark.parametrize(
    ("which", "kind", "commands"),
    [
        ("worker_index", "set", [["workers"], ["list"]]),
        ("queues", "set", [["workers"], ["start", "Waiter", "1", "--id", "nk-new", "--no-wait"]]),
        ("runs", "zset", [["list"], ["count"], ["list", "--status", "blocked"]]),
        ("meta", "hash", [["list"], ["workers"], ["status", "nk-run"]]),
    ],
)
def test_commands_name_a_namespace_key_of_the_wrong_kind_and_work_once_it_is_mended(
    store: RedisStore, spoil: list[str], which: str, kind: str, commands: list[list[str]]
) -> None:
    stub = WorkflowStub.make(Waiter, id="nk-run", store=store).start(60)
    keys = store.keys
    key = {
        "worker_index": keys.worker_index(),
        "queues": keys.queues(),
        "runs": keys.runs(stub._ref().partition),
        "meta": keys.meta,
    }[which]
    spoil_key(store, spoil, key)
    for command in commands:
        said = CliRunner().invoke(cli, command)
        assert said.exit_code == 1, (command, said.output)
        assert f"{key} is a string, not a {kind}" in said.output, (command, said.output)
        assert "rename" in said.output and "WRONGTYPE" not in said.output, (command, said.output)
    if which == "meta":  # every worker and command opens the store: named there
        with pytest.raises(ConfigurationError, match=f"Redis key {key} is a string, not a hash"):
            RedisStore(store.url)
    mend(store, spoil)
    for command in commands:
        said = CliRunner().invoke(cli, command)
        assert said.exit_code == 0, (command, said.output)
    stub.terminate("test over")


def test_a_worker_starts_and_serves_beside_a_registry_or_an_origin_of_the_wrong_kind(
    store: RedisStore, spoil: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    keys = store.keys
    spoil_key(store, spoil, keys.origin(3))  # stopped the worker at its start
    spoil_key(store, spoil, keys.worker_index())  # a WARNING every heartbeat, naming nothing
    with caplog.at_level("ERROR"), TestEnvironment(store=store) as env:
        stub = env.start(Waiter, 0.01, id="nk-served")
        stub.signal("go", "served")
        assert stub.result(timeout=20) == "served"

        def named() -> list[str]:
            return [
                r.getMessage()
                for r in caplog.records
                if f"{keys.worker_index()} is a string" in r.getMessage()
            ]

        said = wait_for(named, timeout=20)
        assert f"{keys.worker_index()} is a string, not a set" in said[0] and REMEDY in said[0], said
        time.sleep(6)  # two more heartbeats, sweeps: said once a minute, not each time
        assert len(named()) == 1, named()
        store.redis.delete(keys.worker_index())  # mended: the worker is listed again
        spoil.remove(keys.worker_index())
        wait_for(lambda: store.live_workers(), timeout=20)
        shown = CliRunner().invoke(cli, ["workers"])
        assert shown.exit_code == 0, shown.output
        # The origin marker stops nothing now, so no command fails to say it: the view warns.
        assert f"{keys.origin(3)} is a string, not a hash" in " ".join(shown.output.split()), shown.output


def test_the_api_names_the_key_of_the_wrong_kind_and_warns_of_it(
    store: RedisStore, spoil: list[str], tmp_path: Path
) -> None:
    stub = WorkflowStub.make(Waiter, id="nk-api", store=store).start(60)
    runs = store.keys.runs(stub._ref().partition)
    server = ServerProc(store.url, tmp_path / "server.log")
    try:
        with server.client() as http:
            spoil_key(store, spoil, runs)
            listed = http.get("/api/v1/workflows", params={"limit": 3})
            assert listed.status_code == 503, listed.text
            error = listed.json()["error"]
            assert error["code"] == "redis_key_wrong_kind", error
            assert f"{runs} is a string, not a zset" in error["message"] and REMEDY in error["message"], error
            health = http.get("/healthz").json()
            assert any(f"{runs} is a string, not a zset" in w for w in health["warnings"]), health
            mend(store, spoil)
            assert http.get("/api/v1/workflows", params={"limit": 3}).status_code == 200
            record = store.keys.run(stub._ref().partition, stub.run_id)  # a key of the run's own
            store.redis.rename(record, record + ".aside")
            store.redis.sadd(record, "x")
            described = http.get("/api/v1/workflows/nk-api")
            store.redis.delete(record)
            store.redis.rename(record + ".aside", record)
            assert described.status_code == 503, described.text
            assert f"{record} is a set, not a hash" in described.json()["error"]["message"], described.text
            assert not any("is a string" in w for w in http.get("/healthz").json()["warnings"])
    finally:
        server.stop()
    assert "Traceback" not in (tmp_path / "server.log").read_text()
    stub.terminate("test over")


def test_a_schedule_whose_starts_redis_refuses_says_why_in_describe(
    store: RedisStore, spoil: list[str]
) -> None:
    # Its pass failed on every try, for good, while `schedule describe` said "active", no reason.
    handle = ScheduleHandle.create("nk-tick", Schedule(workflow="Waiter", args=[60], every="1s"), store=store)
    for p in range(store.keys.partitions):  # wherever the scheduled run's id falls
        spoil_key(store, spoil, store.keys.timers(p))
    sweep = SchedulePass(store)
    time.sleep(1.1)  # due
    sweep.tick()
    held = handle.describe().held_up
    assert held.startswith("its scheduler's passes fail (last at "), held
    assert f"{store.keys.timers(0)} is a string, not a zset" in held, held
    assert handle.describe().started == 0
    mend(store, spoil)
    time.sleep(schedule_pass.RETRY_MS / 1000 + 0.1)  # the pause after a failed pass
    sweep.tick()
    described = handle.describe()
    # Its note cleared (held up now only by its overlap policy: no worker serves the run).
    assert described.started >= 1 and "passes fail" not in described.held_up, described
    handle.delete()
    for run in described.running:
        WorkflowStub.load(str(run["workflow_id"]), store=store).terminate("test over")


def test_a_run_whose_task_stream_is_of_the_wrong_kind_or_gone_says_so_and_repair_moves_it(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The workers set the stream aside (named in their log), but status said "waits on queue
    # 'default' for a worker (backlog 0)" and `durable workers` died on it; deleted as advised,
    # the task was gone with it and the run waited for ever, status saying the same.
    monkeypatch.setattr(broken_streams, "RECHECK_S", 0.5)
    stub = WorkflowStub.make(Waiter, id="nk-stream", store=store).start(0.01)  # its task queued
    stream = store.keys.workflow_tasks(stub._ref().partition, "default")
    store.redis.rename(stream, stream + ".lost")  # with the task in it
    store.redis.set(stream, "not a stream")

    def status() -> str:
        said = CliRunner().invoke(cli, ["status", "nk-stream"])
        return " ".join(said.output.split())

    with TestEnvironment(store=store):
        wait_for(lambda: store.live_workers(), timeout=20)
        said = status()
        assert f"its workflow task cannot be read: its task stream {stream} is a string, not a stream" in said
        shown = " ".join(CliRunner().invoke(cli, ["workers"]).output.split())
        assert f"task stream {stream} of queue 'default' holds another kind of value" in shown, shown
        store.redis.delete(stream)
        said = wait_for(lambda: "is not in its stream" in status() and status(), timeout=10)
        assert "`durable repair nk-stream` queues it again" in said, said
        repaired = CliRunner().invoke(cli, ["repair", "nk-stream"])
        assert repaired.exit_code == 0, repaired.output
        wait_for(lambda: stub.status() == "suspended", timeout=20)
        stub.signal("go", "moved")
        assert stub.result(timeout=20) == "moved"
    store.redis.delete(stream + ".lost")


def test_the_key_a_pipelined_command_failed_on_is_named(store: RedisStore) -> None:
    store.redis.set("nk-foreign", "x")
    exc = ResponseError("Command # 1 (XLEN nk-foreign) of pipeline caused error: WRONGTYPE Operation ...")
    assert "Redis key nk-foreign is a string, not the kind durable keeps there" in str(
        store.wrong_type_error(exc)
    )
    store.redis.delete("nk-foreign")


def test_a_worker_whose_own_registry_entry_was_made_another_kind_writes_it_again(store: RedisStore) -> None:
    # Its heartbeat (SET ... GET) was refused for good: the live worker was invisible, and every
    # view said "no live worker serves queue 'default': start one" while it ran the runs.
    with TestEnvironment(store=store):
        (worker,) = wait_for(lambda: store.live_workers(), timeout=20)
        entry = store.keys.worker(worker.name)
        store.redis.delete(entry)
        store.redis.hset(entry, "not", "an entry")
        assert store.live_workers() == []
        wait_for(lambda: [w.name for w in store.live_workers()] == [worker.name], timeout=10)


@pytest.mark.parametrize("command", [["status"], ["history"], ["update", "nk-own", "bump", "3"]])
def test_a_command_about_a_workflow_names_its_key_of_the_wrong_kind(
    store: RedisStore, command: list[str]
) -> None:
    stub = WorkflowStub.make(Waiter, id="nk-own", store=store).start(60)
    record = store.keys.run(stub._ref().partition, stub.run_id)
    store.redis.rename(record, record + ".aside")
    store.redis.sadd(record, "x")
    said = CliRunner().invoke(cli, command if len(command) > 1 else [*command, "nk-own"])
    store.redis.delete(record)
    store.redis.rename(record + ".aside", record)
    assert said.exit_code == 1 and f"{record} is a set, not a hash" in " ".join(said.output.split()), (
        said.output
    )
    stub.terminate("test over")


def test_a_timer_its_deleted_timers_key_took_along_is_said_and_repair_arms_it_again(
    store: RedisStore,
) -> None:
    # A timers key overwritten, then deleted as the error said: the run waited for ever, status
    # saying "no live worker's scheduler has fired it", and `durable repair` decided nothing.
    with TestEnvironment(store=store):
        stub = WorkflowStub.make(Waiter, id="nk-timer", store=store).start(3.0)
        wait_for(lambda: stub.history()[-1].type == "TimerStarted", timeout=20)
        store.redis.delete(store.keys.timers(stub._ref().partition))

        def status() -> str:
            return " ".join(CliRunner().invoke(cli, ["status", "nk-timer"]).output.split())

        said = wait_for(lambda: "not in its partition's timers index" in status() and status(), timeout=20)
        assert "`durable repair` arms it again" in said, said
        assert CliRunner().invoke(cli, ["repair", "nk-timer"]).exit_code == 0
        wait_for(lambda: stub.history()[-1].type == "SignalWaitStarted", timeout=20)
        stub.signal("go", "fired")
        assert stub.result(timeout=20) == "fired"
