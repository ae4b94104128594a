"""Start policies, signal-with-start, workflow timeouts and all_settled, on a real Redis.

Runs are decided by an in-process worker (``durable_env``); the last test drives the CLI
against a real ``durable worker`` process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from apps.starts import Broken, Collect, Elder, Fanout, Guardian, Nap, Quick, Relay

from durable import (
    ConfigurationError,
    WorkflowAlreadyStarted,
    WorkflowFailed,
    WorkflowStub,
    WorkflowTimeout,
)
from durable.store import keys as K
from durable.store import runs as runs_module
from durable.store.redis_store import RedisStore
from durable.store.starts import Closing
from durable.testing import TestEnvironment, replay_history
from tests.procs import ROOT, TESTS, workers
from tests.waiting import wait_for


def _runs_of(store: RedisStore, workflow_id: str) -> list[str]:
    """Run ids of ``workflow_id`` in the runs index (every run ever started under it)."""
    p = store.keys.partition(workflow_id)
    out = []
    for rid in store.redis.zrange(store.keys.runs(p), 0, -1):
        record = store.redis.hget(store.keys.run(p, rid.decode()), "workflow_id")
        if record is not None and record.decode() == workflow_id:
            out.append(rid.decode())
    return out


def _stub(env: TestEnvironment, cls: type, wid: str, **policy: object) -> WorkflowStub:
    return WorkflowStub.make(cls, id=wid, store=env.store, **policy)  # type: ignore[arg-type]


# ------------------------------------------------------------------ id reuse policies


def test_id_reuse_policies_on_a_closed_id(durable_env: TestEnvironment) -> None:
    done = _stub(durable_env, Quick, "reuse-done").start()
    assert done.result(timeout=10) == "done"
    failed = _stub(durable_env, Broken, "reuse-failed").start()
    with pytest.raises(WorkflowFailed):
        failed.result(timeout=10)

    # allow_duplicate (the default): a closed id starts again.
    again = _stub(durable_env, Quick, "reuse-done").start("again")
    assert again.result(timeout=10) == "again"
    assert len(_runs_of(durable_env.store, "reuse-done")) == 2

    # reject_duplicate: never, and nothing is written.
    for wid in ("reuse-done", "reuse-failed"):
        before = _runs_of(durable_env.store, wid)
        with pytest.raises(WorkflowAlreadyStarted, match="reject_duplicate"):
            _stub(durable_env, Quick, wid, id_reuse_policy="reject_duplicate").start()
        assert _runs_of(durable_env.store, wid) == before

    # allow_duplicate_failed_only: not after a completed run, yes after a failed one.
    with pytest.raises(WorkflowAlreadyStarted, match="did not complete"):
        _stub(durable_env, Quick, "reuse-done", id_reuse_policy="allow_duplicate_failed_only").start()
    retry = _stub(durable_env, Quick, "reuse-failed", id_reuse_policy="allow_duplicate_failed_only")
    assert retry.start("fixed").result(timeout=10) == "fixed"


# --------------------------------------------------------------- id conflict policies


def test_id_conflict_policies_on_an_open_id(durable_env: TestEnvironment) -> None:
    first = _stub(durable_env, Nap, "conflict").start(60)
    first_run = first.run_id

    with pytest.raises(WorkflowAlreadyStarted, match="open run"):
        _stub(durable_env, Nap, "conflict").start(60)
    with pytest.raises(WorkflowAlreadyStarted):
        _stub(durable_env, Nap, "conflict", id_conflict_policy="fail").start(60)

    existing = _stub(durable_env, Nap, "conflict", id_conflict_policy="use_existing").start(60)
    assert existing.run_id == first_run
    assert _runs_of(durable_env.store, "conflict") == [first_run]

    replacing = _stub(durable_env, Quick, "conflict", id_conflict_policy="terminate_existing")
    replacing.start("replaced")
    assert replacing.run_id != first_run
    assert replacing.result(timeout=10) == "replaced"
    closing = durable_env.store.last_entry(durable_env.store.ref("conflict", first_run))
    assert closing is not None and closing.type == "WorkflowTerminated"
    assert "terminate_existing" in closing.event.reason  # type: ignore[attr-defined]
    assert (
        durable_env.store.run_record(durable_env.store.ref("conflict", first_run))["status"] == "terminated"
    )


def test_bad_policy_names_list_the_valid_ones_and_write_nothing(durable_env: TestEnvironment) -> None:
    store = durable_env.store
    with pytest.raises(
        ConfigurationError, match="allow_duplicate, allow_duplicate_failed_only, reject_duplicate"
    ):
        _stub(durable_env, Quick, "bad", id_reuse_policy="allow_dupes")
    with pytest.raises(ConfigurationError, match="fail, use_existing, terminate_existing"):
        _stub(durable_env, Quick, "bad", id_conflict_policy="replace")
    with pytest.raises(ConfigurationError, match="run_timeout"):
        _stub(durable_env, Quick, "bad", run_timeout="soon")
    with pytest.raises(ConfigurationError, match="use_existing or terminate_existing"):
        _stub(durable_env, Collect, "bad", id_conflict_policy="fail").signal_with_start("add", 1)
    assert store.redis.keys("*wf:bad*") == [] and _runs_of(store, "bad") == []


# ------------------------------------------------------------------- signal-with-start


def test_signal_with_start_starts_then_signals_then_reuses(durable_env: TestEnvironment) -> None:
    stub = _stub(durable_env, Collect, "sws").signal_with_start("add", "a", start_args=[2])
    run_id = stub.run_id
    history = [e.type for e in stub.history()]
    assert history[0] == "WorkflowStarted"
    again = _stub(durable_env, Collect, "sws").signal_with_start("add", "b", start_args=[99])
    assert again.run_id == run_id  # the open run got it; its start args were not used
    assert stub.result(timeout=10) == ["a", "b"]
    assert _runs_of(durable_env.store, "sws") == [run_id]
    # Closed now: the next signal-with-start starts a new run (allow_duplicate).
    third = _stub(durable_env, Collect, "sws").signal_with_start("add", "c")
    assert third.run_id != run_id and third.result(timeout=10) == ["c"]
    # reject_duplicate applies to signal-with-start too, and writes nothing.
    with pytest.raises(WorkflowAlreadyStarted):
        _stub(durable_env, Collect, "sws", id_reuse_policy="reject_duplicate").signal_with_start("add", "d")


def test_signal_with_start_is_atomic_between_racing_clients(store: RedisStore) -> None:
    """Two clients (own connections) race signal-with-start on 30 fresh ids: one run each,
    both signals in its inbox. No worker: what is checked is what the script wrote."""
    clients = [RedisStore(store.url), RedisStore(store.url)]
    try:
        ids = [f"race-{i}" for i in range(30)]
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def race(client: RedisStore, tag: str) -> None:
            try:
                for wid in ids:
                    barrier.wait(timeout=10)
                    WorkflowStub.make(Collect, id=wid, store=client).signal_with_start(
                        "add", tag, start_args=[2]
                    )
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=race, args=(c, t)) for c, t in zip(clients, "xy", strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors
        for wid in ids:
            runs = _runs_of(store, wid)
            assert len(runs) == 1, wid
            p = store.keys.partition(wid)
            assert store.redis.llen(store.keys.inbox(p, runs[0])) == 2, wid
    finally:
        for client in clients:
            client.close()


# --------------------------------------------------------------------------- timeouts


def test_run_timeout_fails_the_run_with_a_workflow_timeout(durable_env: TestEnvironment) -> None:
    stub = _stub(durable_env, Nap, "napper", run_timeout=1).start(60)
    with pytest.raises(WorkflowFailed) as info:
        stub.result(timeout=15)
    assert info.value.status == "failed" and stub.status() == "failed"
    assert isinstance(info.value.cause, WorkflowTimeout) and info.value.cause.timeout == "run"
    types = [e.type for e in stub.history()]
    assert types[-2:] == ["WorkflowTimeoutFired", "WorkflowFailed"]
    # The closed run's timeout members are gone from the timers set.
    p = durable_env.store.keys.partition("napper")
    members = [m.decode() for m in durable_env.store.redis.zrange(durable_env.store.keys.timers(p), 0, -1)]
    assert K.deadline_member(stub.run_id or "", "run") not in members


def test_execution_timeout_spans_continue_as_new(durable_env: TestEnvironment) -> None:
    # Each run sleeps 0.3 s: the 1 s run timeout never fires, the 2 s execution timeout does.
    stub = _stub(durable_env, Relay, "relay", execution_timeout=2, run_timeout=1).start(1, 0.3)
    first = stub.history()[0].data["options"]
    with pytest.raises(WorkflowFailed) as info:
        stub.result(timeout=20)
    cause = info.value.cause
    assert isinstance(cause, WorkflowTimeout) and cause.timeout == "execution"
    runs = _runs_of(durable_env.store, "relay")
    assert len(runs) >= 3
    last = WorkflowStub.load("relay", store=durable_env.store)
    options = last.history()[0].data["options"]
    assert options["execution_deadline"] == first["execution_deadline"]  # the original deadline
    assert options["run_timeout_ms"] == 1000 and last.history()[0].data["args"][0] == len(runs)


@pytest.mark.parametrize(
    "policy, child_status",
    [("terminate", "terminated"), ("request_cancel", "cancelled"), ("abandon", "open")],
)
def test_a_child_of_a_timed_out_parent_follows_its_policy(
    durable_env: TestEnvironment, policy: str, child_status: str
) -> None:
    parent = _stub(durable_env, Guardian, f"guard-{policy}", run_timeout=1).start(policy, f"ward-{policy}")
    with pytest.raises(WorkflowFailed) as info:
        parent.result(timeout=15)
    assert isinstance(info.value.cause, WorkflowTimeout)
    child = WorkflowStub.load(f"ward-{policy}", store=durable_env.store)
    if policy == "abandon":
        assert child.status() in ("pending", "running", "suspended")
        child.terminate("test cleanup")
    else:
        wait_for(lambda: child.status() == child_status)


@pytest.mark.parametrize(
    ("policy", "child_status"),
    [("terminate", "terminated"), ("request_cancel", "cancelled"), ("abandon", None)],
)
def test_a_child_of_a_terminated_parent_follows_its_policy(
    durable_env: TestEnvironment, policy: str, child_status: str | None
) -> None:
    """`terminate` of the parent, like a parent closing itself: abandon leaves the child running."""
    parent = _stub(durable_env, Guardian, f"term-guard-{policy}").start(policy, f"term-ward-{policy}")
    store = durable_env.store
    wait_for(lambda: f"term-ward-{policy}" in [r["workflow_id"] for r in store.list_runs(status="suspended")])
    child = WorkflowStub.load(f"term-ward-{policy}", store=store)
    parent.terminate("test")
    if child_status is None:
        assert child.status() in ("pending", "running", "suspended")
        child.terminate("test cleanup")
    else:
        wait_for(lambda: child.status() == child_status)


def _open(store: RedisStore, workflow_id: str) -> bool:
    return store.instance_statuses([workflow_id])[0] in ("pending", "running", "suspended")


def test_a_grandchild_of_a_timed_out_grandparent_is_closed_too(durable_env: TestEnvironment) -> None:
    """The close policy a worker carries out (a message in the outbox) reaches every generation:
    the terminated child's own children follow their policy, as when a client terminates it."""
    store = durable_env.store
    _stub(durable_env, Elder, "elder", run_timeout=2).start("elder-kid", "elder-grandkid")
    wait_for(lambda: _open(store, "elder-grandkid"), timeout=20)
    wait_for(lambda: WorkflowStub.load("elder", store=store).status() == "failed", timeout=20)
    wait_for(lambda: store.instance_statuses(["elder-kid", "elder-grandkid"]) == ["terminated"] * 2)
    reasons = {}
    for wid in ("elder-kid", "elder-grandkid"):
        closing = store.last_entry(store.ref(wid))
        reasons[wid] = closing.event.reason  # type: ignore[union-attr]
    assert reasons == {"elder-kid": "parent closed (policy terminate)", "elder-grandkid": "parent terminated"}


@pytest.mark.parametrize(
    ("policy", "child_status"), [("terminate", "terminated"), ("request_cancel", "cancelled")]
)
def test_a_child_of_a_replaced_run_follows_its_policy(
    durable_env: TestEnvironment, policy: str, child_status: str
) -> None:
    """``terminate_existing`` closes the run it replaces as ``terminate`` would, children included."""
    store = durable_env.store
    _stub(durable_env, Guardian, f"swap-{policy}").start(policy, f"swap-kid-{policy}")
    wait_for(lambda: _open(store, f"swap-kid-{policy}"), timeout=20)
    parent = WorkflowStub.load(f"swap-{policy}", store=store)
    wait_for(lambda: any(p.get("kind") == "child" for p in parent.snapshot()["pending"]), timeout=20)
    _stub(durable_env, Quick, f"swap-{policy}", id_conflict_policy="terminate_existing").start()
    wait_for(lambda: store.instance_statuses([f"swap-kid-{policy}"]) == [child_status], timeout=20)


# ------------------------------------------------------------------------- all_settled


def test_all_settled_collects_every_outcome_without_cancelling_siblings(durable_env: TestEnvironment) -> None:
    stub = _stub(durable_env, Fanout, "fanout").start()
    assert stub.result(timeout=15) == [[True, 4, None], [False, None, "ActivityFailed"], [True, 16, None]]
    assert not [e for e in stub.history() if e.type in ("ActivityCancelled", "TimerCancelled")]
    # Replayed from its history, the code decides the same.
    replay_history(durable_env.store.history(durable_env.store.ref("fanout")), Fanout)


# ---------------------------------------------------------------- CLI, real processes


def _cli(redis_url: str, *args: str) -> subprocess.CompletedProcess:
    env = {"DURABLE_REDIS_URL": redis_url, "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}"}
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_signal_with_start_policies_and_run_timeout(redis_url: str) -> None:
    with workers(redis_url, app="apps.starts"):
        out = _cli(
            redis_url, "start", "Collect", "2", "--id", "cli-sws", "--signal", "add", "--signal-arg", '"a"'
        )
        assert out.returncode == 0, out.stderr
        assert "signal: add -> started run" in out.stdout
        out = _cli(redis_url, "start", "Collect", "--id", "cli-sws", "--signal", "add", "--signal-arg", '"b"')
        assert "signal: add -> existing run" in out.stdout, out.stderr
        assert _cli(redis_url, "result", "cli-sws", "--timeout", "20").stdout.strip() == '["a", "b"]'

        bad = _cli(redis_url, "start", "Quick", "--id", "cli-bad", "--id-reuse-policy", "sometimes")
        assert bad.returncode != 0 and "allow_duplicate_failed_only" in bad.stderr
        rejected = _cli(
            redis_url, "start", "Collect", "--id", "cli-sws", "--id-reuse-policy", "reject_duplicate"
        )
        assert rejected.returncode == 1 and "reject_duplicate" in rejected.stderr

        out = _cli(
            redis_url,
            "start",
            "Nap",
            "60",
            "--id",
            "cli-nap",
            "--run-timeout",
            "1s",
            "--execution-timeout",
            "1h",
        )
        assert out.returncode == 0, out.stderr
        waited = _cli(redis_url, "result", "cli-nap", "--timeout", "20")
        assert (
            waited.returncode == 1 and "WorkflowTimeout" in waited.stderr and "run timeout" in waited.stderr
        )


def test_a_terminate_made_from_a_stale_snapshot_reads_it_again(
    durable_env: TestEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The children a terminate closes are those of the snapshot the script finds: messages made
    from an older one (a child started meanwhile) are refused, and the store reads it again."""
    store = durable_env.store
    parent = _stub(durable_env, Guardian, "stale-guard").start("terminate", "stale-ward")
    wait_for(lambda: any(p.get("kind") == "child" for p in parent.snapshot()["pending"]), timeout=20)
    real, reads = runs_module.closing, []

    def before_the_child(*args: object) -> Closing:
        reads.append(args)
        fresh = real(*args)  # type: ignore[arg-type]
        return (
            fresh
            if len(reads) > 1
            else Closing(fresh.to_parent, [], fresh.reason, "sha1 of a stale snapshot")
        )

    monkeypatch.setattr(runs_module, "closing", before_the_child)
    parent.terminate("test")
    assert [args[3] for args in reads].count(parent.run_id) == 2  # (then the child's, closing it)
    wait_for(lambda: store.instance_statuses(["stale-ward"]) == ["terminated"], timeout=20)


def test_a_terminate_with_no_worker_running_closes_the_children_at_once(durable_store: RedisStore) -> None:
    """The messages wait for a worker; the terminating client does not: ``terminate`` children
    are closed by the call itself (``request_cancel`` ones are asked by the messages only)."""
    with TestEnvironment(store=durable_store):
        parent = WorkflowStub.make(Guardian, id="lone-guard", store=durable_store).start(
            "terminate", "lone-ward"
        )
        wait_for(lambda: any(p.get("kind") == "child" for p in parent.snapshot()["pending"]), timeout=20)
    parent.terminate("no worker about")  # the environment's worker has stopped
    assert durable_store.instance_statuses(["lone-guard", "lone-ward"]) == ["terminated", "terminated"]
    closing = durable_store.last_entry(durable_store.ref("lone-ward"))
    assert closing is not None and closing.event.reason == "parent terminated"  # type: ignore[attr-defined]


def test_a_replacing_start_with_no_worker_running_closes_the_children_at_once(
    durable_store: RedisStore,
) -> None:
    """As ``terminate``: a ``terminate_existing`` start closes the replaced run's ``terminate``
    children itself, not only by the messages a worker would carry out."""
    with TestEnvironment(store=durable_store):
        parent = WorkflowStub.make(Guardian, id="lone-swap", store=durable_store).start(
            "terminate", "lone-swap-ward"
        )
        wait_for(lambda: any(p.get("kind") == "child" for p in parent.snapshot()["pending"]), timeout=20)
    WorkflowStub.make(
        Quick, id="lone-swap", store=durable_store, id_conflict_policy="terminate_existing"
    ).start()
    assert durable_store.instance_statuses(["lone-swap-ward"]) == ["terminated"]
    closing = durable_store.last_entry(durable_store.ref("lone-swap-ward"))
    assert closing is not None
    assert closing.event.reason == "parent replaced (id_conflict_policy terminate_existing)"  # type: ignore[attr-defined]
