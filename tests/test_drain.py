"""A draining worker (``kill -USR1``, or a reload that deployed a new build) starts no new run,
finishes the runs pinned to its build, says how many are left, and stops once none is open:
how the last process of an old build outlives a deploy without stranding its runs."""

from __future__ import annotations

import json
import logging
import re
import signal
import textwrap
import time
from pathlib import Path

import pytest
from apps.basic import Waiter
from click.testing import CliRunner
from procs import children, durable_cli, spawn_worker, stop, supervised_app
from server_procs import ServerProc
from waiting import wait_for

from durable import WorkflowStub
from durable.store.keys import GROUP
from durable.store.redis_store import RedisStore
from durable.store.workers import WorkerInfo
from workers.cli import cli
from workers.membership import Membership
from workers.scheduler import Scheduler
from workers.worker import Worker, WorkerThread


def _entry(store: RedisStore, worker: Worker) -> WorkerInfo | None:
    return next((w for w in store.live_workers() if w.name == worker.consumer), None)


def test_a_draining_worker_finishes_its_pinned_runs_starts_no_new_one_then_stops(
    redis_url: str, store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    old = Worker(store, build_id="v1", grace=5, block_ms=100)
    thread = WorkerThread(old)
    thread.__enter__()
    try:
        wait_for(lambda: store.current_build(["default"]) == ["v1"])
        pinned = WorkflowStub.make(Waiter, store=store).start(0.01)
        wait_for(lambda: pinned.snapshot()["build_id"] == "v1" and pinned.status() == "suspended")
        caplog.set_level(logging.INFO, logger="durable.worker")
        old.drain()
        entry = wait_for(lambda: (e := _entry(store, old)) is not None and e.draining and e)
        assert entry.pinned_left == 1
        assert "draining: starting no new run; 1 open run(s) pinned to build v1" in caplog.text

        # A new run is not its to start, and the views say why.
        fresh = WorkflowStub.make(Waiter, store=store).start(0.01)
        time.sleep(1.5)
        assert fresh.status() == "pending" and fresh.snapshot()["build_id"] is None
        out = durable_cli(redis_url, "status", fresh.id).stdout
        assert "no live worker serves queue 'default'" in out and "is draining" in out, out
        report = json.loads(durable_cli(redis_url, "workers", "--json").stdout)
        (row,) = report["workers"]
        assert row["draining_since"] and row["pinned_left"] == 1
        assert report["queues"]["default"]["new_runs_to"] == []

        # A worker of the new build takes the queue over at its next heartbeat (the draining
        # one does not keep it) and starts the new run; the old one still decides its own.
        with WorkerThread(Worker(store, build_id="v2", grace=5, block_ms=100)):
            wait_for(lambda: fresh.snapshot()["build_id"] == "v2", timeout=15)
            assert store.current_build(["default"]) == ["v2"]
            assert thread.thread.is_alive()
            pinned.signal("go", "old")
            assert pinned.result(timeout=15) == "old"
            assert pinned.snapshot()["build_id"] == "v1"
            # No pinned run left: it stops by itself at its next heartbeat.
            thread.thread.join(timeout=15)
            assert not thread.thread.is_alive(), "the drained worker did not stop"
            assert _entry(store, old) is None
            fresh.signal("go", "new")
            assert fresh.result(timeout=15) == "new"
        assert "drained: no open run is pinned to build v1 on its queues; stopping" in caplog.text
        assert (
            "build v1's workers are draining (they finish the runs pinned to it); new runs now go to build v2"
            in caplog.text
        )
        assert "has no live worker left" not in caplog.text
    finally:
        thread.__exit__(None, None, None)


def test_a_draining_worker_leaves_shared_activity_tasks_to_the_workers_that_go_on(store: RedisStore) -> None:
    """Activity tasks are not pinned to a build: a draining worker of an old build would run new
    runs' activities on its old code. It reads them only on the queues no other worker serves
    (there, the drained runs' own would otherwise wait for ever)."""
    now = store.server_time_ms()
    store.register_worker(WorkerInfo(name="other-a", build="v2", queues=("a",), started=now, seen=now))
    store.register_worker(
        WorkerInfo(name="other-b", build="v1", queues=("b",), started=now, seen=now, draining=now)
    )
    membership = Membership(
        store,
        name="me",
        build="v1",
        compatible=(),
        queues=["a", "b"],
        workflows=[],
        activities=[],
        promote=False,
    )
    membership.join()
    assert membership.activity_queues() == ["a", "b"]
    membership.drain()
    membership.heartbeat()
    assert membership.activity_queues() == ["b"]  # b's other worker drains too
    assert membership.left_alone({"a": ["sa0", "sa1"], "b": ["sb0"]}) == ["sa0", "sa1"]


def test_what_a_draining_worker_leaves_to_others_it_does_not_reclaim_either(store: RedisStore) -> None:
    """A task a dead worker held in such a stream is the others' to take over."""
    stream = store.keys.activity_tasks(0, "left-to-others")
    store.ensure_groups([stream])
    store.redis.xadd(stream, {"body": b"x"})
    store.redis.xreadgroup(GROUP, "dead-worker", {stream: ">"}, count=1)
    time.sleep(0.05)
    got: list[str] = []
    left = {stream}
    scheduler = Scheduler(
        store,
        streams=[stream],
        consumer="me",
        reclaimed=lambda s, _entry, _fields: got.append(s),
        claim_idle_ms=10,
        left_alone=lambda: left,
    )
    scheduler._reclaim()
    assert got == []
    left.clear()
    scheduler._reclaim()
    assert got == [stream]


def test_an_unversioned_worker_pins_nothing_so_a_drain_stops_it(store: RedisStore) -> None:
    worker = Worker(store, grace=5, block_ms=100)
    thread = WorkerThread(worker)
    thread.__enter__()
    try:
        stub = WorkflowStub.make(Waiter, store=store).start(0.01)
        wait_for(lambda: stub.status() == "suspended")
        worker.drain()
        thread.thread.join(timeout=15)
        assert not thread.thread.is_alive()
        # Its run was never its alone: the next worker finishes it.
        with WorkerThread(Worker(store, grace=5, block_ms=100)):
            stub.signal("go", "ok")
            assert stub.result(timeout=15) == "ok"
    finally:
        thread.__exit__(None, None, None)


def test_sigusr1_drains_a_worker_process(redis_url: str, store: RedisStore) -> None:
    proc = spawn_worker(redis_url, extra=("--build-id", "v1"))
    try:
        wait_for(lambda: store.current_build(["default"]) == ["v1"], timeout=30)
        stub = WorkflowStub.make(Waiter, store=store).start(0.01)
        wait_for(lambda: stub.snapshot()["build_id"] == "v1" and stub.status() == "suspended", timeout=30)
        proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: any(w.draining and w.pinned_left == 1 for w in store.live_workers()), timeout=15)
        out = durable_cli(redis_url, "workers").stdout
        assert re.search(r"draining for \d+ s: 1 open run pinned to its build left", out), out
        assert proc.poll() is None
        stub.signal("go", "done")
        assert stub.result(timeout=30) == "done"
        assert proc.wait(timeout=20) == 0
        assert proc.stderr is not None
        log = proc.stderr.read().decode()
        assert "drained: no open run is pinned to build v1" in log, log
    finally:
        stop(proc)


def test_durable_drain_asks_the_workers_of_a_build_from_anywhere(redis_url: str, store: RedisStore) -> None:
    """`durable drain --build-id B` (no signal, no shell on the worker's machine): the workers of
    B drain, the others go on; a name no live worker has is an error naming the live ones."""
    old = spawn_worker(redis_url, extra=("--build-id", "v1"))
    other = None
    try:
        wait_for(lambda: store.current_build(["default"]) == ["v1"], timeout=30)
        (v1,) = store.live_workers()
        stub = WorkflowStub.make(Waiter, store=store).start(0.01)
        wait_for(lambda: stub.snapshot()["build_id"] == "v1" and stub.status() == "suspended", timeout=30)
        other = spawn_worker(redis_url)  # unversioned: it serves the queue's new runs too
        wait_for(lambda: len(store.live_workers()) == 2, timeout=30)

        bad = durable_cli(redis_url, "drain", "nope")
        assert bad.returncode == 1 and "no live worker named 'nope'" in bad.stderr and v1.name in bad.stderr
        bad = durable_cli(redis_url, "drain", "--build-id", "v9")
        assert bad.returncode == 1 and "no live worker of build 'v9' (live builds: v1)" in bad.stderr
        assert durable_cli(redis_url, "drain").returncode != 0

        out = durable_cli(redis_url, "drain", "--build-id", "v1")
        assert out.returncode == 0, out.stderr
        # It waits for the worker to say so (its next heartbeat), and says what it has left.
        assert out.stdout.strip() == (
            f"worker {v1.name}: draining (build v1): 1 open run pinned to its build left; it stops once none is"
        )
        assert any(w.draining and w.pinned_left == 1 for w in store.live_workers())
        assert "warning" not in out.stderr  # the unversioned worker serves the queue
        assert old.poll() is None
        stub.signal("go", "done")
        assert stub.result(timeout=30) == "done"
        assert old.wait(timeout=20) == 0
        assert other.poll() is None
        (plain,) = store.live_workers()
        assert plain.build == ""
        # The last worker of the queue: said, and it stops (unversioned: nothing is pinned to it).
        out = durable_cli(redis_url, "drain", plain.name)
        assert (
            out.stdout.strip()
            == f"worker {plain.name}: drained (no run pinned to its build was open): stopping"
        )
        assert "warning: no other live worker serves queue default: its new runs wait for one" in out.stderr
        assert other.wait(timeout=20) == 0
    finally:
        stop(old)
        if other is not None:
            stop(other)


def test_durable_drain_says_when_a_worker_has_not_confirmed(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker stalled (or of an older release) does not read the ask: said, not taken for done."""
    from workers.cli import fleet  # noqa: PLC0415

    now = store.server_time_ms()
    store.register_worker(WorkerInfo(name="silent", build="v1", queues=("default",), started=now, seen=now))
    monkeypatch.setattr(fleet, "DRAIN_CONFIRM_S", 0.3)
    store.ask_drain(["silent"])
    (line,) = fleet._drain_confirmations(store, ["silent"])
    assert line.startswith("worker silent: asked to drain, but it has not said so within 0 s")
    out = CliRunner().invoke(cli, ["drain", "silent"])  # a deploy script sees it: exit 1
    assert out.exit_code == 1 and "it has not said so" in out.output, out.output
    assert "error: 1 of 1 worker(s) did not confirm the drain" in out.output, out.output


def test_the_api_drains_a_worker_by_name(redis_url: str, store: RedisStore, tmp_path: Path) -> None:
    proc = spawn_worker(redis_url, extra=("--build-id", "v1"))
    server = ServerProc(redis_url, tmp_path / "server.log")
    try:
        (worker,) = wait_for(lambda: store.live_workers(), timeout=30)
        with server.client(**{"X-Durable-Request": "1"}) as api:
            missing = api.post("/api/v1/workers/nope/drain")
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
            assert worker.name in missing.json()["error"]["message"]
            asked = api.post(f"/api/v1/workers/{worker.name}/drain")
            assert asked.status_code == 200, asked.text
            assert asked.json() == {"name": worker.name, "build_id": "v1", "drain_asked": True}
            # Nothing is pinned to it: it stops at its next heartbeat, and leaves the list.
            assert proc.wait(timeout=20) == 0
            assert api.get("/api/v1/workers").json()["workers"] == []
    finally:
        server.stop()
        stop(proc)


APP = textwrap.dedent(
    """
    from durable import Workflow, await_signal

    class Deployed(Workflow):
        def handle(self, wait: bool) -> str:
            if wait:
                await_signal("go")
            return "v1"
    """
)


@pytest.mark.slow
def test_a_reload_to_a_new_build_keeps_the_old_builds_last_process_until_its_runs_finish(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    """`durable worker --processes 2 --build-id auto`, an edit, `kill -HUP`: new runs start on
    the new build; the run pinned to the old build finishes on the old code, on the old build's
    last process, which then stops by itself. Before, that run waited for a worker of a build
    no process served any more. Then `kill -USR1` of the supervisor drains it all."""
    (tmp_path / "deploy_app.py").write_text(APP)
    with supervised_app(redis_url, tmp_path, "deploy_app", "--build-id", "auto") as (proc, deploy_app, log):
        pinned = WorkflowStub.make(deploy_app.Deployed, store=store).start(True)
        wait_for(lambda: pinned.status() == "suspended", timeout=30)
        old_build = pinned.snapshot()["build_id"]
        assert old_build
        old = wait_for(lambda: (c := children(proc.pid)) and len(c) == 2 and c)

        (tmp_path / "deploy_app.py").write_text(APP.replace('"v1"', '"v2"'))
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: b"reload done: 2 worker processes replaced" in log.read_bytes(), timeout=60)
        assert b"drains: it finishes the runs pinned to" in log.read_bytes()
        # The first old process stopped; the last one drains beside the two new ones.
        wait_for(lambda: len(c := children(proc.pid)) == 3 and len(c & old) == 1, timeout=30)
        report = wait_for(
            lambda: (
                (r := json.loads(durable_cli(redis_url, "workers", "--json").stdout))
                and any(w["draining_since"] for w in r["workers"])
                and r
            ),
            timeout=15,
        )
        (draining,) = [w for w in report["workers"] if w["draining_since"]]
        assert draining["build_id"] == old_build and draining["pinned_left"] == 1

        fresh = WorkflowStub.make(deploy_app.Deployed, store=store).start(False)
        assert fresh.result(timeout=30) == "v2"
        assert fresh.snapshot()["build_id"] not in (None, old_build)
        pinned.signal("go", None)
        assert pinned.result(timeout=30) == "v1"  # the old code, on the old build's process
        wait_for(lambda: len(c := children(proc.pid)) == 2 and c.isdisjoint(old), timeout=30)
        # The process is gone before the supervisor has reaped it and said so (a loaded CI run).
        wait_for(
            lambda: b"drained (no run pinned to that build is open) and exited" in log.read_bytes(),
            timeout=10,
        )
        text = log.read_bytes().decode()
        assert f"drained: no open run is pinned to build {old_build}" in text
        assert f"of build {old_build} drained (no run pinned to that build is open) and exited" in text

        # SIGUSR1 to the supervisor drains every process: it exits once none has a pinned run.
        last = WorkflowStub.make(deploy_app.Deployed, store=store).start(True)
        wait_for(lambda: last.status() == "suspended", timeout=30)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(3)  # a heartbeat (2 s) has counted the open run
        assert proc.poll() is None and len(children(proc.pid)) == 2
        last.signal("go", None)
        assert last.result(timeout=30) == "v2"
        assert proc.wait(timeout=20) == 0


def test_a_supervised_process_that_drained_is_not_restarted(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    """`durable drain` of the processes of `durable worker --processes 2`: each exits once drained
    and its supervisor does not start it again (it would undo the drain), until a reload; once
    all have, the supervisor exits 0."""
    (tmp_path / "plain_app.py").write_text(APP.replace("Deployed", "PlainDeployed"))
    with supervised_app(redis_url, tmp_path, "plain_app") as (proc, _, log):
        first, second = wait_for(lambda: len(live := store.live_workers()) == 2 and live, timeout=30)
        assert durable_cli(redis_url, "drain", first.name).returncode == 0
        wait_for(
            lambda: b"drained (`durable drain`, or SIGUSR1 to it): not restarted" in log.read_bytes(),
            timeout=15,
        )
        time.sleep(1.5)  # (a restart would come after 1 s)
        assert [w.name for w in store.live_workers()] == [second.name] and len(children(proc.pid)) == 1
        assert proc.poll() is None
        # A reload runs two processes of the code on disk again, the drained slot's too.
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: b"reload done: 2 worker processes replaced" in log.read_bytes(), timeout=60)
        names = wait_for(
            lambda: len(live := store.live_workers()) == 2 and [w.name for w in live], timeout=30
        )
        assert second.name not in names
        assert durable_cli(redis_url, "drain", *names).returncode == 0
        assert proc.wait(timeout=20) == 0
        assert b"every worker process drained; exiting" in log.read_bytes()
