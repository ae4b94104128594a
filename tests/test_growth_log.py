"""An open run's log (attempts and dropped inputs kept beside its history) stays capped at about
``LOG_MAXLEN`` entries: an activity retrying every 10 ms once wrote 4,580 entries (7 MB) in 60 s
to one run, and ``durable describe --json`` grew to 1.2 MB.

Real Redis (the shared test server). The capped runs use a store whose scripts were loaded with
a cap of 20 (``LOG_MAXLEN`` reaches the scripts when they load), so a few hundred attempts show
the trimming; ``XADD MAXLEN ~`` trims whole stream nodes (100 entries by default), so a log
holds the cap plus less than a node.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from importlib import resources

import pytest
from waiting import wait_for

from durable import RetryPolicy, Workflow, WorkflowStub, activity, await_signal
from durable.store import base
from durable.store.base import LOG_MAXLEN, load_scripts
from durable.store.redis_store import RedisStore
from workers.worker import Worker, WorkerThread

CAP = 20
NODE = 100  # stream-node-max-entries' default: ~ trims a node only once it is wholly past the cap
ATTEMPTS = 300

_attempts: list[int] = []
_lock = threading.Lock()


def growth_log_always_fails() -> None:
    """Fails every attempt, counting them (the worker runs in this process)."""
    with _lock:
        _attempts.append(1)
    raise RuntimeError("failing on purpose")


class GrowthLogRetriesForever(Workflow):
    def handle(self) -> None:
        activity(growth_log_always_fails, retry=RetryPolicy(initial_interval=0.005, backoff_coefficient=1))


class GrowthLogWaits(Workflow):
    def handle(self) -> None:
        await_signal("never")


@pytest.fixture
def capped(redis_url: str, store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[RedisStore]:
    """A store on the shared server whose scripts cap a run's log at :data:`CAP` entries."""
    monkeypatch.setattr(base, "LOG_MAXLEN", CAP)
    small = RedisStore(redis_url)
    try:
        yield small
    finally:
        small.close()


def _log_len(store: RedisStore, stub: WorkflowStub) -> int:
    key = store.keys.log(store.keys.partition(stub.id), stub.describe().run_id)
    return int(store.redis.xlen(key))


def test_every_script_appends_to_a_run_log_through_the_capped_helper() -> None:
    """The constant is defined once (``durable.store.base``) and reaches every script; no script
    appends to a log key with a plain, uncapped XADD."""
    assert LOG_MAXLEN == 1000
    sources = load_scripts()
    assert all(src.startswith(f"local LOG_MAXLEN = {LOG_MAXLEN}\n") for src in sources.values())
    folder = resources.files("durable.store") / "lua"
    uncapped = [
        entry.name
        for entry in folder.iterdir()
        if entry.name.endswith(".lua") and re.search(r"'XADD',\s*log\s*,", entry.read_text())
    ]
    assert uncapped == ["_lib.lua"]  # log_add itself, with MAXLEN ~
    assert "'XADD', log, 'MAXLEN', '~', LOG_MAXLEN" in (folder / "_lib.lua").read_text()


def test_a_retrying_activity_keeps_its_runs_log_capped_and_describe_shows_the_last_attempts(
    capped: RedisStore,
) -> None:
    _attempts.clear()
    worker = Worker(capped, concurrency=2, grace=1, block_ms=100)
    stub = WorkflowStub.make(GrowthLogRetriesForever, id="growth-log-retry", store=capped).start()
    with WorkerThread(worker):
        wait_for(lambda: len(_attempts) >= ATTEMPTS, timeout=15)
    attempts = len(_attempts)
    length = _log_len(capped, stub)
    print(f"{attempts} attempts, log length {length}")  # measured: see the report
    # Old code: one entry per attempt, as many as the attempts.
    assert CAP <= length < CAP + NODE < attempts

    info = stub.describe()
    shown = [a["attempt"] for a in info["attempts"]]
    # The newest attempts, in order, without gaps; the first ones are gone.
    assert shown == list(range(shown[0], shown[0] + len(shown)))
    assert shown[0] > 1 and len(shown) == length
    assert shown[-1] >= attempts - 2  # the last one or two may not be recorded yet
    stub.terminate("test over")


def test_inputs_dropped_by_a_terminate_are_capped_too(capped: RedisStore) -> None:
    """The other writers of the log (dropped inputs: commit, terminate, repair) share the cap."""
    stub = WorkflowStub.make(GrowthLogWaits, id="growth-log-dropped", store=capped).start()
    for i in range(ATTEMPTS):
        stub.signal("noise", i)
    stub.terminate("dropping the inbox")  # no worker: every signal is still in the inbox
    length = _log_len(capped, stub)
    assert CAP <= length < CAP + NODE < ATTEMPTS
    dropped = stub.describe()["dropped"]
    assert len(dropped) == length and all(d["reason"] == "run terminated" for d in dropped)
