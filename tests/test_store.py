"""The Redis side: atomic commits, conflicts, one slot per script, parked tasks, AOF restarts."""

from __future__ import annotations

import re
import threading
import time

import pytest
import redis
from apps.basic import Everything, Sequence, Waiter
from waiting import wait_for

from durable import Workflow, WorkflowStub, await_signal
from durable.errors import EventConflict
from durable.replay import Driver
from durable.store.redis_store import RedisStore
from workers.decider import Decider
from workers.worker import Worker, WorkerThread


def test_two_deciders_race_and_the_stale_commit_conflicts(store: RedisStore) -> None:
    stub = WorkflowStub.make(Sequence, id="race").start(3)
    ref = store.ref("race")
    decider = Decider(store)
    decisions = []
    for _ in range(2):
        record, inbox, rows = store.load_for_decision(ref.partition, ref.run_id, 0)
        driver = Driver(run_id=ref.run_id, workflow_id="race")
        driver.replay(store.decode_history(ref, rows))
        decisions.append((record, driver, driver.decide([])))
    record, driver, decision = decisions[0]
    store.commit(ref, decider.commit_plan(ref, record, driver, decision, None))
    record, driver, decision = decisions[1]
    with pytest.raises(EventConflict, match="seq"):
        store.commit(ref, decider.commit_plan(ref, record, driver, decision, None))
    history = stub.history()
    assert [e.seq for e in history] == [1, 2]
    assert [e.type for e in history] == ["WorkflowStarted", "ActivityScheduled"]
    for _, d, _ in decisions:
        d.close()


class Gathers(Workflow):
    def handle(self) -> list[str]:
        got: list[str] = []
        while (item := await_signal("item")) != "stop":
            got.append(item)
        return got


def test_a_run_another_worker_decided_meanwhile_is_loaded_whole_not_blocked_as_corrupt(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker A's cached driver of a run is stale (B decided it since): A read the history apart
    from the record it loaded, and a commit of B's in between made the history one event longer
    than the record said: the run was blocked as history_corrupt (a fault-suite run, seed 15)."""
    stub = WorkflowStub.make(Gathers, id="stale").start()
    ref = store.ref("stale")
    a, b = Decider(store), Decider(store)

    def decide(decider: Decider, signal: str | None = None) -> None:
        if signal is not None:
            stub.signal("item", signal)
        wq = store.redis.hget(store.keys.run(ref.partition, ref.run_id), "wq").decode()
        ((entry_id, fields),) = store.redis.xrevrange(wq, count=1)
        decider.handle(ref.partition, wq, entry_id.decode(), fields)

    decide(a)  # A caches the run
    decide(b, "x")  # B decides it on: A's driver is stale
    loaded = store.load_each

    def b_commits_after_the_load(runs):  # noqa: ANN001, ANN202 - the store's own types
        got = loaded(runs)
        monkeypatch.setattr(store, "load_each", loaded)
        decide(b, "z")
        return got

    monkeypatch.setattr(store, "load_each", b_commits_after_the_load)
    decide(a, "y")
    assert not store.redis.hget(store.keys.run(ref.partition, ref.run_id), "blocked")
    decide(a, "stop")
    assert stub.result(timeout=5) == ["x", "y", "z"]
    for decider in (a, b):
        decider.cache.clear()


def test_every_script_touches_one_hash_tag(store: RedisStore, redis_url: str) -> None:
    seen: list[str] = []
    monitor_client = redis.Redis.from_url(redis_url)
    stop = threading.Event()

    def watch() -> None:
        with monitor_client.monitor() as m:
            for command in m.listen():
                seen.append(f"{command.get('client_type', '')} {command['command']}")
                if stop.is_set():
                    return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    time.sleep(0.2)
    w = Worker(store, concurrency=2, grace=5, block_ms=100)
    with WorkerThread(w):
        stub = WorkflowStub.make(Everything).start(1)
        wait_for(lambda: stub.query("progress")["stage"] == "signal")
        stub.signal("approve", "x")
        wait_for(lambda: stub.query("progress")["stage"] == "bumps")
        stub.signal("bump", 2)
        stub.result(timeout=10)
        waiter = WorkflowStub.make(Waiter).start(60)
        wait_for(lambda: waiter.status() == "suspended")
        waiter.terminate("test")
    stop.set()
    store.redis.ping()  # one more command so the monitor loop sees stop
    thread.join(timeout=5)
    scripts = 0
    tags: set[str] = set()
    checked = 0
    for line in seen:
        if "EVALSHA" in line.split(" ", 2)[1:2] or line.split(" ", 1)[-1].startswith('"EVALSHA"'):
            if tags:
                assert len(tags) == 1, f"a script touched several partitions: {tags}"
                checked += 1
            tags = set()
            scripts += 1
        elif line.startswith("lua"):
            tags |= set(re.findall(r"durable:\{(\d+)\}", line))
    assert scripts > 20 and checked > 20


def test_unknown_workflow_type_is_parked_and_run_blocked(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make("NoSuchWorkflow", id="ghost-type").start()
    wait_for(lambda: store.dead_letters())
    letter = store.dead_letters()[0]
    assert "NoSuchWorkflow" in letter["reason"] and letter["kind"] == "workflow"
    snap = stub.snapshot()
    assert snap["blocked"] and "NoSuchWorkflow" in snap["blocked"]
    assert [r["run_id"] for r in store.list_runs(status="blocked")] == [stub.run_id]


def test_undecodable_tasks_are_parked_not_dropped(worker, store: RedisStore) -> None:
    p = 0
    store.redis.xadd(store.keys.activity_tasks(p, "default"), {"body": b"\xc1 not msgpack"})
    store.redis.xadd(store.keys.workflow_tasks(p, "default"), {"nothing": b"here"})
    letters = wait_for(lambda: len(store.dead_letters()) >= 2 and store.dead_letters())
    reasons = sorted(letter["reason"] for letter in letters)
    assert any("undecodable activity task" in r for r in reasons)
    assert any("no run id" in r for r in reasons)
    # The worker keeps going after parking.
    assert WorkflowStub.make(Sequence).start(3).result(timeout=10) == 3


def test_poison_inbox_item_goes_to_dead_letters_and_run_continues(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(Waiter).start(0.3)
    ref = store.ref(stub.id)
    store.redis.rpush(store.keys.inbox(ref.partition, ref.run_id), b"\x93garbage")
    stub.signal("go", "ok")
    assert stub.result(timeout=10) == "ok"
    letters = store.dead_letters()
    assert letters and letters[0]["kind"] == "inbox" and "not valid msgpack" in letters[0]["reason"]


def test_corrupt_history_blocks_the_run_with_the_reason(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(Waiter).start(60)
    wait_for(lambda: stub.status() == "suspended")
    ref = store.ref(stub.id)
    record = store.run_record(ref)
    store.redis.xadd(
        store.keys.history(ref.partition, ref.run_id), {"e": b"\x81\xa3bad\x01"}, id=f"0-{record['seq'] + 1}"
    )
    store.redis.hset(store.keys.run(ref.partition, ref.run_id), "seq", record["seq"] + 1)
    worker.decider.cache.clear()
    stub.signal("go", "x")
    blocked = wait_for(lambda: stub.snapshot()["blocked"])
    assert "HistoryCorrupt" in blocked and f"seq {record['seq'] + 1}" in blocked


def test_partition_count_cannot_change(store: RedisStore, redis_url: str) -> None:
    from durable import ConfigurationError

    with pytest.raises(ConfigurationError, match="partitions"):
        RedisStore(redis_url, partitions_=store.keys.partitions + 1)


@pytest.mark.slow
def test_runs_survive_a_redis_restart_with_aof(fresh_redis, monkeypatch) -> None:
    url = fresh_redis.url
    monkeypatch.setenv("DURABLE_REDIS_URL", url)
    s = RedisStore(url)
    w = Worker(s, concurrency=4, grace=5, block_ms=100)
    with WorkerThread(w):
        stubs = [WorkflowStub.make(Waiter, store=s).start(1.5) for _ in range(5)]
        waiting = [WorkflowStub.make(Waiter, store=s).start(0.05) for _ in range(5)]
        wait_for(lambda: all(x.status() == "suspended" for x in stubs + waiting))
        time.sleep(0.2)
        fresh_redis.kill()
        time.sleep(0.3)
        fresh_redis.ensure()
        for x in stubs + waiting:
            x.signal("go", x.id)
        for x in stubs + waiting:
            assert x.result(timeout=20) == x.id
            seqs = [e.seq for e in x.history()]
            assert seqs == list(range(1, len(seqs) + 1))


def test_the_hot_path_reloads_its_scripts_after_script_flush(store: RedisStore) -> None:
    """load/commit/complete use raw pipelines (durable/store/wire.py): a Redis that lost the
    scripts (restart without them, SCRIPT FLUSH) answers NOSCRIPT, and the refused commands
    are sent again once the scripts are loaded; nothing else in the batch runs twice."""
    worker = Worker(store, concurrency=2, grace=5, block_ms=100)
    with WorkerThread(worker):
        assert WorkflowStub.make(Sequence).start(3).result(timeout=15) == 3
        store.redis.script_flush()
        stubs = [WorkflowStub.make(Sequence).start(4) for _ in range(3)]
        assert [s.result(timeout=15) for s in stubs] == [6, 6, 6]
    for stub in stubs:
        types = [e.type for e in stub.history()]
        assert types.count("ActivityScheduled") == types.count("ActivityCompleted") == 4
