"""Updates that do not come back at once: `durable update` tells the update's id and why it
waits (no live worker, a blocked run), keeps it delivered across a timeout or Ctrl-C, and the
same id waits again; arguments that do not fit the handler are rejected; a reused id is the
first update's (see docs/updates.md)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from apps.updates import UpdCart
from click.testing import CliRunner, Result

from durable import (
    DurableError,
    UpdateRejected,
    Workflow,
    WorkflowBlocked,
    WorkflowStub,
    await_signal,
    codec,
    update,
)
from durable import events as ev
from durable.replay import Driver, replay_history
from durable.store.redis_store import RedisStore
from durable.testing import TestEnvironment
from tests.procs import ROOT, TESTS, workers
from tests.sim import Sim
from workers.cli import cli


class UpdArgs(Workflow):
    """Waits for 'stop'; ``add`` takes exactly one argument."""

    def __init__(self) -> None:
        self.total = 0

    def handle(self) -> int:
        await_signal("stop")
        return self.total

    @update
    def add(self, n: int) -> int:
        self.total += n
        return self.total


ID_LINE = re.compile(r"update id: (cli-\S+)  \(wait again with --update-id \1\)")


def _cli(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _cli_process(redis_url: str, *args: str) -> subprocess.Popen[str]:
    """`durable ARGS...` in a process of its own (to interrupt it, or to let it wait while this
    process runs a worker)."""
    env = dict(os.environ, DURABLE_REDIS_URL=redis_url, PYTHONPATH=f"{TESTS}{os.pathsep}{ROOT}")
    return subprocess.Popen(
        [sys.executable, "-m", "workers.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _until(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return found


def _update_ids(store: RedisStore, stub: WorkflowStub) -> list[str]:
    ref = stub._ref()
    return [k.decode() for k in store.redis.hkeys(store.keys.updates(ref.partition, ref.run_id))]


def _blocked_by_the_worker(stub: WorkflowStub) -> None:
    """Wait until a worker recorded the run as blocked (not only found no worker for it)."""
    _until(lambda: (b := stub.blocked()) is not None and b.kind == "unknown_type")


# ------------------------------------------------------------------ no live worker


@pytest.mark.slow
def test_without_a_worker_the_id_and_a_warning_come_and_the_id_waits_again(
    redis_url: str, store: RedisStore
) -> None:
    stub = WorkflowStub.make(UpdCart, id="cart-1").start()
    began = time.monotonic()
    out = _cli("update", "cart-1", "add", '"nowork"', "--timeout", "4")
    assert out.exit_code == 1 and time.monotonic() - began < 10
    lines = out.stderr.splitlines()
    uid = ID_LINE.fullmatch(lines[0]).group(1)
    assert lines[1].startswith(
        "warning: no live worker can run update 'add' now: no live worker serves queue"
    )
    assert f"""`durable update cart-1 add '"nowork"' --update-id {uid}` keeps waiting""" in lines[-1]
    assert "had no outcome within the timeout" in lines[-1]
    assert "no live worker can run it now" in lines[-1] and "call update()" not in lines[-1]
    assert _update_ids(store, stub) == [uid]  # delivered, and stays so
    with workers(redis_url, app="apps.updates"):
        again = _cli("update", "cart-1", "add", '"nowork"', "--update-id", uid, "--json", "--timeout", "30")
        assert again.exit_code == 0, again.output
        assert json.loads(again.stdout) == 1
        stub.signal("checkout")
        assert stub.result(timeout=20)["items"] == ["nowork"]  # it ran once
    assert [e.type for e in stub.history()].count("UpdateAccepted") == 1


@pytest.mark.slow
def test_ctrl_c_prints_the_id_again_with_how_to_keep_waiting(redis_url: str, store: RedisStore) -> None:
    stub = WorkflowStub.make(UpdCart, id="cart-2").start()
    proc = _cli_process(redis_url, "update", "cart-2", "add", '"late"')
    try:
        shown = ID_LINE.fullmatch(proc.stderr.readline().rstrip("\n"))
        assert proc.stderr.readline().startswith("warning: no live worker")
        proc.send_signal(signal.SIGINT)  # while it waits: the update is delivered
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    [uid] = _update_ids(store, stub)
    assert shown and shown.group(1) == uid
    assert (
        f"""update id: {uid} stays delivered: `durable update cart-2 add '"late"' --update-id {uid}`""" in err
    )
    assert err.rstrip().endswith("error: interrupted")


def test_a_prompt_outcome_prints_only_itself(worker: Any) -> None:
    WorkflowStub.make(UpdCart, id="cart-3").start()
    out = _cli("update", "cart-3", "add", '"tea"', "--json")
    assert out.exit_code == 0 and out.stderr == "" and json.loads(out.stdout) == 1


# ------------------------------------------------------------------ blocked runs


def test_an_update_to_a_blocked_run_is_refused_at_once(worker: Any, store: RedisStore) -> None:
    stub = WorkflowStub.make("NoSuchType", id="ghostrun").start()
    _blocked_by_the_worker(stub)
    began = time.monotonic()
    with pytest.raises(WorkflowBlocked) as info:
        stub.update("x", timeout=30)
    message = str(info.value)
    assert info.value.kind == "unknown_type" and "was not delivered" in message
    assert message.count("durable repair ghostrun") == 1
    out = _cli("update", "ghostrun", "x")
    assert out.exit_code == 1 and "is blocked (unknown_type)" in out.output
    assert out.output.count("durable repair ghostrun") == 1
    assert time.monotonic() - began < 5
    assert _update_ids(store, stub) == []  # nothing delivered: nothing runs after a repair


@pytest.mark.slow
def test_a_run_blocked_while_the_cli_waits_says_so_once(redis_url: str, store: RedisStore) -> None:
    stub = WorkflowStub.make("NoSuchType", id="ghost-2").start()
    proc = _cli_process(redis_url, "update", "ghost-2", "x", "--timeout", "60")
    try:
        assert ID_LINE.fullmatch(proc.stderr.readline().rstrip("\n"))
        # Read here: communicate() below reads the pipe, not what readline() buffered.
        warning = proc.stderr.readline()
        with TestEnvironment(store=store):  # a worker without the type: it blocks the run
            _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err
    [uid] = _update_ids(store, stub)
    assert warning.startswith("warning: no live worker can run update 'x' now")
    [error] = [line for line in err.splitlines() if line.startswith("error:")]
    assert "is blocked (unknown_type)" in error and error.count("durable repair ghost-2") == 1
    assert (
        f"stays delivered and runs once the run is repaired: `durable update ghost-2 x --update-id {uid}`"
        in error
    )


# ------------------------------------------------------------------ arguments


def test_arguments_that_do_not_fit_the_handler_are_rejected_before_writing(worker: Any) -> None:
    stub = WorkflowStub.make(UpdCart).start()
    assert stub.update("add", "a") == 1
    seq = len(stub.history())
    for args in ((), ("b", "c")):
        with pytest.raises(UpdateRejected, match=r"@update 'add' takes \(sku: str\)") as info:
            stub.update("add", *args)
        assert isinstance(info.value.cause, DurableError)
    assert len(stub.history()) == seq
    out = _cli("update", stub.id, "reserve", "--app", "apps.updates")
    assert out.exit_code == 1 and "takes (sku: str, wait: float = 0.2)" in out.output
    # The run by its id (the message named the type 'UpdCart' as if it were the workflow).
    assert f"update 'reserve' of workflow '{stub.id}' (UpdCart) was rejected" in out.output, out.output


def test_a_worker_rejects_arguments_that_do_not_fit_and_the_run_goes_on(worker: Any) -> None:
    stub = WorkflowStub.make(UpdCart).start()
    untyped = WorkflowStub.load(stub.id)  # as a process without the class sends it
    untyped._type = "NotRegisteredHere"
    with pytest.raises(UpdateRejected, match=r"rejected: DurableError: @update 'fail' takes \(why: str\)"):
        untyped.update("fail", timeout=10)
    with pytest.raises(UpdateRejected, match="too many positional arguments"):
        untyped.update("add", "a", "b", timeout=10)
    assert stub.update("add", "a") == 1
    stub.signal("checkout")
    assert stub.result(timeout=10)["items"] == ["a"]
    entries = stub.store.history(stub._ref())
    assert [e.type for e in entries].count("UpdateRejected") == 2
    assert replay_history(entries).status == "completed"


def test_the_rejection_is_recorded_and_replay_does_not_decide_it_again() -> None:
    sim = Sim(UpdArgs)
    try:
        sim.decide()
        for uid, args in (("u1", ()), ("u2", (1, 2)), ("u3", (3,))):
            sim.push(ev.UpdateRequested(id=uid, name="add", args=codec.dumps(args)))
        sim.decide()
        assert sim.types()[-4:] == ["UpdateRejected", "UpdateRejected", "UpdateAccepted", "UpdateCompleted"]
        rejected = sim.events("UpdateRejected")
        causes = [codec.loads(e.error) for e in rejected]
        assert all(isinstance(c, DurableError) and "@update 'add' takes (n: int)" in str(c) for c in causes)
        sim.signal("stop")
        sim.decide()
        assert sim.result() == 3
        sim.check_replay()
    finally:
        sim.close()

    class Loose(Workflow):  # a later release whose handler takes any number of arguments
        name = "UpdArgsLoose"

        def handle(self) -> int:
            await_signal("stop")
            return 0

        @update
        def add(self, *ns: int) -> int:
            return 0

    driver = Driver(resolve=lambda _name: Loose)
    try:  # the rejected updates stay rejected: replay reads the history, it does not check again
        driver.replay(list(sim.history))
        assert driver.status == "completed"
    finally:
        driver.close()


# ------------------------------------------------------------------ reused ids


def test_a_reused_update_id_with_other_arguments_warns_and_prints_the_first_outcome(worker: Any) -> None:
    WorkflowStub.make(UpdCart, id="cart-4").start()
    assert _cli("update", "cart-4", "add", '"a"', "--update-id", "k-1").exit_code == 0
    out = _cli("update", "cart-4", "add", '"b"', "--update-id", "k-1", "--json")
    assert out.exit_code == 0 and json.loads(out.stdout) == 1
    assert "update id 'k-1' was first sent as add('a')" in out.stderr
    same = _cli("update", "cart-4", "add", '"a"', "--update-id", "k-1", "--json")
    assert same.exit_code == 0 and same.stderr == ""
