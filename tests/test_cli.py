"""The ``durable`` command: in-process (click's CliRunner) and as real processes.

Every process a test starts is stopped in a ``finally``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apps.basic import Boom, Waiter
from click.testing import CliRunner, Result
from procs import children

from durable import WorkflowStub
from durable.store.redis_store import RedisStore
from durable.testing import TestEnvironment
from workers import supervisor as supervisor_module
from workers.cli import cli, json_default, parse_args, to_json
from workers.cli.core import CliError
from workers.supervisor import Supervisor

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- helpers


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def env_for(*paths: Path) -> dict[str, str]:
    env = dict(os.environ)
    extra = [str(ROOT), *(str(p) for p in paths)]
    env["PYTHONPATH"] = os.pathsep.join(extra + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def run_cli(
    *args: str, paths: tuple[Path, ...] = (), timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        cwd=ROOT,
        env=env_for(*paths),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def popen_cli(*args: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "workers.cli", *args],
        cwd=ROOT,
        env=env_for(),
        text=True,
        **kwargs,  # type: ignore[arg-type]
    )


def stop(proc: subprocess.Popen[str], timeout: float = 10.0) -> int:
    """SIGTERM ``proc`` and wait; kill it if it does not exit (then fail)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"process {proc.args} did not exit within {timeout} s of SIGTERM") from None


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)


def one_error_line(result: Result | subprocess.CompletedProcess[str]) -> str:
    err = result.stderr.strip()
    assert err.startswith("error: "), err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


@pytest.fixture
def worker_proc(redis_url: str) -> Iterator[subprocess.Popen[str]]:
    """``durable worker --app examples.order`` as a real process."""
    proc = popen_cli(
        "worker",
        "--app",
        "examples.order",
        "--concurrency",
        "4",
        "--unknown-type-grace",
        "2",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()


# --------------------------------------------------------------------------- pure helpers


@pytest.mark.parametrize("value", ['{"name": "bob",}', "[1, 2", '"unterminated', "{'a': 1}"])
def test_parse_args_refuses_what_was_meant_as_json(value: str) -> None:
    """It became a string, silently: ``'{"name": "bob",}'`` reached the workflow as text."""
    with pytest.raises(CliError, match=r"argument 2 is not valid JSON: .* in "):
        parse_args(["1", value])


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("9" * 5000, "is a number of 5000 characters, more than can be read"),
        ("1e999999", "out of a float's range"),
    ],
)
def test_parse_args_refuses_a_number_it_cannot_read(value: str, says: str) -> None:
    """5,000 digits became a string, 1e999999 infinity: silently."""
    with pytest.raises(CliError, match=says):
        parse_args(["1", value])
    # NaN and Infinity are not JSON: plain strings, as any value that is not (the API refuses them).
    assert parse_args(["-5", "Infinity", "NaN", "-Infinity", "1e3"]) == [
        -5,
        "Infinity",
        "NaN",
        "-Infinity",
        1000.0,
    ]
    with pytest.raises(CliError, match=r"argument 1 is not valid JSON: NaN is not a JSON number"):
        parse_args(["[NaN]"])


def test_parse_args_json_then_string() -> None:
    assert parse_args(["1", '"1"', "[1, 2]", "alice", '{"a": null}', "true"]) == [
        1,
        "1",
        [1, 2],
        "alice",
        {"a": None},
        True,
    ]


def test_json_default_covers_history_values() -> None:
    import datetime as dt
    import uuid

    value = {
        "b": b"\x00\xff",
        "s": {3, 1, 2},
        "t": (1, 2),
        "d": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "e": ValueError("boom"),
        "u": uuid.UUID(int=1),
    }
    out = json.loads(to_json(value))
    assert out["b"] == {"$bytes": base64.b64encode(b"\x00\xff").decode()}
    assert out["s"] == [1, 2, 3]
    assert out["t"] == [1, 2]
    assert out["d"] == "2024-01-02T03:04:05+00:00"
    assert out["e"] == {"$error": "ValueError", "message": "boom"}
    assert out["u"] == str(uuid.UUID(int=1))
    assert json_default(object()).startswith("<object")


def test_json_log_format(capsys: pytest.CaptureFixture[str]) -> None:
    from workers.logging import configure

    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure("INFO", "json")
        log = logging.getLogger("durable.test")
        log.debug("hidden")
        try:
            raise RuntimeError("bad")
        except RuntimeError:
            log.exception("it failed: %s", 42)
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
        assert len(lines) == 1
        assert lines[0]["level"] == "ERROR"
        assert lines[0]["logger"] == "durable.test"
        assert lines[0]["message"] == "it failed: 42"
        assert "RuntimeError: bad" in lines[0]["exc"]
        assert lines[0]["ts"].endswith("+00:00")
        with pytest.raises(ValueError):
            configure("INFO", "xml")
    finally:
        for handler in list(root.handlers):
            if getattr(handler, "_durable", False):
                root.removeHandler(handler)
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


# --------------------------------------------------------------------------- errors


def test_status_of_unknown_id_is_one_error_line(redis_url: str) -> None:
    result = invoke("status", "no-such-id")
    assert result.exit_code == 1
    assert "no-such-id" in one_error_line(result)
    assert result.stdout == ""


def test_an_absurdly_long_id_is_not_echoed_whole(redis_url: str) -> None:
    result = invoke("status", "x" * 100_000)
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "(100,000 characters)" in line and len(line) < 400, line[:500]


def test_unreachable_redis_is_one_error_line(tmp_path: Path) -> None:
    result = run_cli("--redis", f"unix://{tmp_path}/nothing.sock", "status", "x")
    assert result.returncode == 1
    assert "cannot reach Redis" in one_error_line(result)


def test_bad_app_module_is_one_error_line(redis_url: str) -> None:
    result = invoke("start", "Anything", "--app", "no_such_module_xyz")
    assert result.exit_code == 1
    assert "no_such_module_xyz" in one_error_line(result)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("list", "--status", "bogus"), "Invalid value for '--status': 'bogus' is not one of 'cancelled'"),
        (("list", "--limit", "99999999999999999999"), "Invalid value for '--limit'"),
        (("worker", "--app", "apps.basic", "--queue", "a b"), "invalid queue name 'a b'"),
        (("worker", "--app", "apps.basic", "--queue", "@private"), "a leading '@' is reserved"),
    ],
)
def test_option_values_no_run_could_match_are_refused(
    redis_url: str, args: tuple[str, ...], says: str
) -> None:
    """A typo'd status would list nothing (read as "none blocked"); a worker of a queue name no
    run can have would wait for nothing."""
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert says in result.output


def test_status_of_a_closed_run_says_how_it_ended(redis_url: str) -> None:
    store = RedisStore(redis_url)
    with TestEnvironment(store=store):
        WorkflowStub.make(Boom, id="boom-1", store=store).start()
        wait_for(lambda: store.instance_statuses(["boom-1"]) == ["failed"])
        WorkflowStub.make(Waiter, id="called-off", store=store).start(60).cancel("customer asked")
        wait_for(lambda: store.instance_statuses(["called-off"]) == ["cancelled"])
        napping = WorkflowStub.make(Waiter, id="cut-short", store=store).start(3600)
        wait_for(lambda: napping.snapshot()["pending"])
        napping.terminate("ops")
    assert invoke("status", "boom-1").stdout.strip() == "failed (KeyError: 'boom')"
    assert invoke("status", "called-off").stdout.strip() == "cancelled (customer asked)"
    assert invoke("status", "cut-short").stdout.strip() == "terminated (ops)"
    # What it waited on as it closed is labelled so, and no deadline of it is counted down.
    described = invoke("describe", "cut-short").stdout
    assert "pending when it closed (nothing waits now)" in described and "(in " not in described


def test_result_of_failed_run_exits_1(redis_url: str) -> None:
    stub = WorkflowStub.make("Whatever", id="doomed", store=RedisStore(redis_url)).start()
    assert invoke("terminate", "doomed", "--reason", "testing").exit_code == 0
    assert invoke("status", "doomed").stdout.strip() == "terminated (testing)"
    result = invoke("result", "doomed", "--timeout", "5")
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "doomed" in line and "terminated" in line and "testing" in line
    assert stub.status() == "terminated"
    again = invoke("terminate", "doomed")
    assert again.exit_code == 1
    assert "already terminated" in one_error_line(again)


# --------------------------------------------------------------------------- demo + replay


def _only_order_id() -> str:
    runs = json.loads(invoke("list", "--type", "OrderWorkflow", "--json").stdout)
    assert len(runs) == 1, runs
    return str(runs[0]["workflow_id"])


def test_demo_history_export_and_replay(redis_url: str, tmp_path: Path) -> None:
    result = invoke("demo", "--timeout", "30")
    assert result.exit_code == 0, result.output
    assert '"approved_by": "alice"' in result.stdout
    assert "WorkflowCompleted" in result.stdout and "ChildStarted" in result.stdout
    order_id = _only_order_id()

    exported = invoke("history", order_id, "--json")
    assert exported.exit_code == 0
    items = json.loads(exported.stdout)
    # Same seq/type/ts/data as WorkflowStub.history() (made JSON-friendly), plus raw.
    expected = json.loads(to_json([e.to_dict() for e in WorkflowStub.load(order_id).history()]))
    assert [{k: v for k, v in item.items() if k != "raw"} for item in items] == expected
    assert all(base64.b64decode(item["raw"]) for item in items)

    history_file = tmp_path / "exports" / "order.json"
    history_file.parent.mkdir()
    history_file.write_text(exported.stdout)
    ok = invoke("replay", str(history_file), "--app", "examples.order")
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.startswith("OK ")
    ok_dir = invoke("replay", str(history_file.parent), "--app", "examples.order")
    assert ok_dir.exit_code == 0 and ok_dir.stdout.count("OK ") == 1

    # Today's code reserves stock under another activity name: replay must diverge.
    # (A separate process: a second OrderWorkflow cannot be registered next to the first.)
    app_dir = tmp_path / "app_v2"
    app_dir.mkdir()
    (app_dir / "order_v2.py").write_text(
        textwrap.dedent(
            """
            from durable import Workflow, activity

            def reserve_everything(order_id, items):
                return {"reservation": "r", "items": items}

            class OrderWorkflow(Workflow):
                def handle(self, order_id, items, cents):
                    activity(reserve_everything, order_id, items)
                    return {}
            """
        )
    )
    diverged = run_cli("replay", str(history_file), "--app", "order_v2", paths=(app_dir,))
    assert diverged.returncode == 1, diverged.stdout + diverged.stderr
    assert diverged.stdout.startswith("DIVERGED ")
    assert "reserve_stock" in diverged.stdout or "reserve_everything" in diverged.stdout
    # A check before a deploy: no run is blocked by it (it said "The run is blocked").
    assert "Deployed, this code would block the run" in diverged.stdout, diverged.stdout
    assert "The run is blocked" not in diverged.stdout

    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps([{k: v for k, v in item.items() if k != "raw"} for item in items]))
    bad = invoke("replay", str(broken), "--app", "examples.order")
    assert bad.exit_code == 1 and "raw" in bad.stdout
    by_id = invoke("replay", "order-42", "--app", "examples.order")  # a workflow id, not a file
    assert by_id.exit_code == 1 and "`durable history order-42 --json > order-42.json`" in by_id.output
    missing = invoke("replay", str(tmp_path / "nope.json"), "--app", "examples.order")
    assert missing.exit_code == 1 and "nope.json" in one_error_line(missing)
    # Every ERROR line names its file; a gap names the run (it said "run : history jumps").
    garbled = tmp_path / "garbled.json"
    garbled.write_text(json.dumps([{**items[0], "raw": "AAAA"}, *items[1:]]))
    gap = tmp_path / "gap.json"
    gap.write_text(json.dumps(items[:1] + items[2:]))
    for path, says in (
        (garbled, "not valid msgpack"),
        (gap, f"run {items[0]['data']['run_id']}: history jumps"),
    ):
        out = invoke("replay", str(path), "--app", "examples.order")
        assert out.exit_code == 1 and out.stdout.startswith(f"ERROR {path}: ") and says in out.stdout, (
            out.stdout
        )


# --------------------------------------------------------------------------- a real worker process


def test_worker_process_end_to_end(redis_url: str, worker_proc: subprocess.Popen[str]) -> None:
    starter = popen_cli(
        "start",
        "OrderWorkflow",
        "o-1",
        '["book", "pen"]',
        "1999",
        "--id",
        "o-1",
        "--app",
        "examples.order",
        "--wait",
        "--timeout",
        "30",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert starter.stdout is not None
        first = starter.stdout.readline()
        assert first.strip() == "workflow_id: o-1", first + (starter.stderr.read() if starter.stderr else "")
        assert starter.stdout.readline().startswith("run_id: ")
        sent = invoke("signal", "o-1", "approve", '"bob"')
        assert sent.exit_code == 0, sent.output
        out, err = starter.communicate(timeout=30)
        assert starter.returncode == 0, err
    finally:
        if starter.poll() is None:
            starter.kill()
        starter.wait()
    result = json.loads(out.strip().splitlines()[-1])
    assert result["approved_by"] == "bob" and result["items"] == ["book", "pen"]
    assert result["charge"] == "ch-o-1" and result["receipt"].startswith("msg-o-1/")

    assert json.loads(invoke("result", "o-1").stdout) == result
    assert invoke("status", "o-1").stdout.strip() == "completed"
    assert json.loads(invoke("query", "o-1", "progress", "--app", "examples.order").stdout) == "done"

    items = json.loads(invoke("history", "o-1", "--json").stdout)
    assert [e["seq"] for e in items] == list(range(1, len(items) + 1))
    types = [e["type"] for e in items]
    assert types[0] == "WorkflowStarted" and types[-1] == "WorkflowCompleted"
    for t in ("ActivityScheduled", "TimerStarted", "TimerFired", "SignalReceived", "ChildStarted"):
        assert t in types
    assert invoke("history", "o-1").exit_code == 0
    # A long history's table is paged (51,000 events took 40 s to print whole): the caption
    # names the next page, which starts right after it.
    page = invoke("history", "o-1", "--limit", "3", "--after", "2")
    assert page.exit_code == 0 and "durable history o-1 --after 5" in " ".join(page.stdout.split())
    rows = [line.split()[1] for line in page.stdout.splitlines() if line.startswith("│")]
    assert rows == ["3", "4", "5"], page.stdout
    last = invoke("history", "o-1", "--after", str(len(items) - 1))
    assert "more events follow" not in last.stdout and items[-1]["type"] in last.stdout

    described = invoke("describe", "o-1")
    assert described.exit_code == 0
    assert "completed" in described.stdout and "activity attempts" in described.stdout
    info = json.loads(invoke("describe", "o-1", "--json").stdout)
    assert info["status"] == "completed" and len(info["attempts"]) == 4  # reserve, charge, ship, label

    listed = invoke("list")
    assert "o-1" in listed.stdout and "SendReceipt" in listed.stdout

    closed = invoke("signal", "o-1", "approve", '"again"')
    assert closed.exit_code == 1
    line = one_error_line(closed)
    assert "o-1" in line and "completed" in line

    # An unknown type can be started by name; a worker parks its task after the grace (dead letters).
    assert invoke("start", "NoSuchWorkflow", "--id", "ghost").exit_code == 0

    def parked() -> bool:
        return "NoSuchWorkflow" in invoke("list", "--dead").stdout

    wait_for(parked, timeout=10)
    assert "ghost" in invoke("list", "--status", "blocked").stdout or invoke("status", "ghost").exit_code == 0

    started = time.monotonic()
    assert stop(worker_proc, timeout=10) == 0
    assert time.monotonic() - started < 10
    assert "Traceback" not in (worker_proc.stderr.read() if worker_proc.stderr else "")


def test_worker_processes_supervised(redis_url: str) -> None:
    proc = popen_cli("worker", "--app", "examples.order", "--processes", "2", "--log-format", "json")
    try:
        kids = wait_for(lambda: (c := children(proc.pid)) and len(c) == 2 and c, timeout=10)
        store = RedisStore(redis_url)
        from examples.order import OrderWorkflow

        stub = WorkflowStub.make(OrderWorkflow, id="o-2", store=store).start("o-2", ["cup"], 500)
        stub.signal("approve", "carol")
        assert stub.result(timeout=30)["approved_by"] == "carol"

        victim = min(kids)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: (c := children(proc.pid)) and len(c) == 2 and victim not in c, timeout=10)
        assert stop(proc, timeout=15) == 0
        for pid in kids:
            assert (
                not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
            )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in children(proc.pid):
            os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- supervisor unit


def test_supervisor_restarts_dead_child_and_stops(tmp_path: Path) -> None:
    marker = tmp_path / "runs"
    script = textwrap.dedent(
        f"""
        import os, signal, sys, time
        path = {str(marker)!r}
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
        with open(path, "a") as f:
            f.write("x")
        try:
            os.close(os.open(path + ".died", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            pass
        else:
            sys.exit(3)  # the first child to get here dies at once
        while True:
            time.sleep(0.05)
        """
    )
    sup = Supervisor([sys.executable, "-c", script], 2, min_backoff=0.1, max_backoff=0.2, poll_interval=0.02)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(sup.run()))
    thread.start()
    try:
        wait_for(lambda: sup.restarts >= 1 and len(marker.read_text()) == 3, 10)
        assert all(s.proc is not None and s.proc.poll() is None for s in sup.slots)
    finally:
        sup.stop()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert codes == [0]
    assert all(s.proc is None for s in sup.slots)


def test_a_stop_signal_during_a_restart_reaches_the_child_being_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGTERM landed while the supervisor was starting a dead child's replacement (seen in CI:
    `received SIGTERM: stopping` and `started worker process 0` in the same millisecond): the
    stop's forwarding missed the new child, and the supervisor waited for it for ever."""
    script = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nwhile True: time.sleep(0.05)"
    sup = Supervisor([sys.executable, "-c", script], 1, min_backoff=0.1, poll_interval=0.02)
    popen = subprocess.Popen

    def stopped_while_starting(*args: Any, **kwargs: Any) -> Any:
        if sup.restarts:  # the replacement: the stop signal arrives as it is started
            sup.stop()
        return popen(*args, **kwargs)

    monkeypatch.setattr(supervisor_module.subprocess, "Popen", stopped_while_starting)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(sup.run()), daemon=True)
    thread.start()
    try:
        first = wait_for(lambda: sup.slots[0].proc, 10)
        first.kill()  # dies unasked: restarted, and the stop comes during that start
        thread.join(timeout=15)
        assert not thread.is_alive(), "the supervisor still waits for the child it started while stopping"
    finally:
        for slot in sup.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.kill()
    assert codes == [0]


def test_dev_prints_url_and_stops_on_sigterm(redis_url: str) -> None:
    proc = popen_cli("dev", "--app", "examples.order", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert redis_url in first, first
        wait_for(lambda: "serving queues" in proc.stderr.readline(), timeout=10)  # type: ignore[union-attr]
        assert stop(proc, timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def test_a_worker_logging_json_says_why_it_stops_in_json(redis_url: str) -> None:
    """A fatal start-up error (a port taken) was a plain-text line among JSON ones: a log
    pipeline dropped the one line saying why the worker was down (observability pass)."""
    import socket  # noqa: PLC0415

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        proc = popen_cli(
            "worker",
            "--app",
            "examples.order",
            "--log-format",
            "json",
            "--metrics-port",
            port,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    lines = [json.loads(line) for line in err.splitlines()]  # every line is JSON
    assert lines[-1]["level"] == "CRITICAL" and lines[-1]["message"].startswith(
        f"error: --metrics-port {port}"
    )


def test_dev_says_an_app_that_does_not_import_before_its_banner(redis_url: str) -> None:
    """It printed the Redis URL and "web UI and API at http://..." first, then the import error."""
    proc = popen_cli("dev", "--app", "no_such_app_module", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert err.startswith("error: cannot import app module 'no_such_app_module'"), err
    assert "web UI" not in err


@pytest.mark.slow
def test_a_worker_whose_app_defines_nothing_warns(redis_url: str, tmp_path: Path) -> None:
    """Most likely the wrong module: otherwise it would serve its queues and run nothing. A
    package naming none itself (the types are in its modules) is told which modules it has."""
    (tmp_path / "empty_app.py").write_text("x = 1\n")
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "orders.py").write_text("raise SystemExit('not imported by the hint')\n")
    log = tmp_path / "worker.log"
    env = dict(
        os.environ, DURABLE_REDIS_URL=redis_url, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)])
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "worker", "--app", "empty_app", "--app", "shop"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 30
            while "serving queues" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
    text = log.read_text()
    assert "--app empty_app, shop defines no workflow and no activity: this worker runs nothing" in text, text
    assert "a package's own modules are not imported: it has shop.orders)" in text, text
    # Named, so that commands run from another folder can be pointed at the same Redis.
    assert f"redis: {redis_url}; build id:" in text, text


def test_cancel_of_a_blocked_run_says_it_waits_and_names_terminate(redis_url: str) -> None:
    """A blocked run runs no workflow code, so its cancellation (which does) waits: said at once,
    not left for the operator to find out (a tester's report)."""
    stub = WorkflowStub.make(Waiter, queue="no-worker-here").start(0.01)
    assert stub.blocked() is not None  # no live worker serves its queue
    result = CliRunner().invoke(cli, ["cancel", stub.id], catch_exceptions=False)
    assert result.exit_code == 0
    assert f"cancellation requested for {stub.id}" in result.stdout
    assert (
        "note: the run is blocked (no_live_worker: no live worker serves queue 'no-worker-here'"
        in result.stderr
    )
    assert f"`durable terminate {stub.id}`" in result.stderr
    assert "durable repair" not in result.stderr  # a worker moves it: nothing recorded to repair


def test_history_rows_write_timer_and_wait_times_as_dates() -> None:
    """``durable history``'s data column wrote a timer's ``fire_at`` (and a signal wait's
    ``deadline``) as raw epoch ms: now the UTC time and its distance from the event."""
    from durable.runinfo import HistoryEvent
    from workers.cli.render import summarize

    ts = 1_764_979_200_000  # 2025-12-06 00:00:00 UTC
    timer = HistoryEvent(seq=3, type="TimerStarted", ts=ts, data={"id": "2", "fire_at": ts + 90_500})
    assert summarize(timer) == "fire_at=2025-12-06 00:01:30.500 (+90.5 s)"
    wait = HistoryEvent(
        seq=4,
        type="SignalWaitStarted",
        ts=ts,
        data={"id": "3", "name": "approve", "deadline": ts + 3_600_000},
    )
    assert summarize(wait) == "name=approve, deadline=2025-12-06 01:00:00.000 (+3600 s)"


def test_a_dict_shaped_like_a_marker_does_not_read_as_what_the_marker_stands_for() -> None:
    """A signal argument ``{"$bytes": "AAEC"}`` was printed exactly as the bytes 00 01 02 are."""
    assert json.loads(to_json(b"\x00\x01\x02")) == {"$bytes": "AAEC"}
    assert json.loads(to_json({"$bytes": "AAEC"})) == {"$dict": {"$bytes": "AAEC"}}
    assert json.loads(to_json([{"$float": "nan", "x": 1}])) == [{"$dict": {"$float": "nan", "x": 1}}]
    assert json.loads(to_json({"a": float("nan")})) == {"a": {"$float": "nan"}}  # markers still made
    assert json.loads(to_json({"$other": 1})) == {"$other": 1}


def test_list_by_type_finds_runs_older_than_a_window_of_other_types_and_pages_on(redis_url: str) -> None:
    # `list --type T --limit N` read the newest N*4 runs of each partition and kept those of T:
    # older runs of T behind 100 newer of other types came back "runs (0)", no cursor.
    store = RedisStore(redis_url)
    old = []
    for i in range(3):  # a millisecond apart: runs of one millisecond are listed by run id
        old.append(WorkflowStub.make("OldType", id=f"old-type-{i}", store=store).start().run_id)
        time.sleep(0.002)
    for i in range(100):
        WorkflowStub.make("NewType", id=f"new-type-{i}", store=store).start()
    first = invoke("list", "--type", "OldType", "--limit", "2", "--json")
    rows = json.loads(first.stdout)
    assert [r["workflow_id"] for r in rows] == ["old-type-2", "old-type-1"], first.output
    cursor = first.stderr.strip().removeprefix("more: --before ")
    rest = json.loads(
        invoke("list", "--type", "OldType", "--limit", "2", "--before", cursor, "--json").stdout
    )
    assert [r["run_id"] for r in rest] == [old[0]]


def test_list_dead_with_a_limit_shows_that_many_of_the_newest(redis_url: str) -> None:
    # `--limit 1` printed one letter a partition, and each partition's oldest, not the newest.
    store = RedisStore(redis_url)
    for i in range(6):
        store.redis.xadd(
            store.keys.dead(i % store.keys.partitions), {"kind": "test", "reason": f"letter {i}"}
        )
        time.sleep(0.002)
    letters = json.loads(invoke("list", "--dead", "--limit", "2", "--json").stdout)
    assert [letter["reason"] for letter in letters] == ["letter 4", "letter 5"]
    # The table says how many are parked in all (it said "dead letters (2)" of 6; of 5,001, "50").
    table = " ".join(invoke("list", "--dead", "--limit", "2").stdout.split())
    assert "dead letters (2 newest of 6)" in table and "--limit N for more" in table, table
