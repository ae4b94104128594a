"""The ``durable`` command as an operator meets it: secrets, errors, repair, odd stored data.

Real Redis (the shared test server) and real processes where a process boundary matters
(``/proc/<pid>/cmdline`` of supervised workers, a fresh directory without a Redis).
Every process a test starts is stopped in a ``finally``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from apps.basic import Waiter
from click.testing import CliRunner, Result
from procs import children

from durable import HistoryEvent, WorkflowStub, count_runs
from durable.store.redis_store import RedisStore
from workers.cli import cli
from workers.cli.render import console, history_table
from workers.config import WorkerConfig, mask_url
from workers.logging import MaskingFormatter
from workers.worker import Worker, WorkerThread

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SECRET = "s3cretMarker"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def env_without_redis(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DURABLE_REDIS_URL", "DURABLE_HOME")}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(ROOT)])
    env.update(extra)
    return env


def run_cli(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        cwd=cwd,
        env=env if env is not None else env_without_redis(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_error_line(result: Result | subprocess.CompletedProcess[str]) -> str:
    err = result.stderr.strip()
    assert err.startswith("error: "), err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)


def with_password(url: str, password: str = SECRET) -> str:
    """``url`` with user ``default`` and ``password``: a server without requirepass accepts any
    password for the nopass default user, so the URL still works."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://default:{quote(password)}@{rest}"


# --------------------------------------------------------------------------- masking


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://user:pw@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:pw@host", "redis://:***@host"),
        ("rediss://u:p%40ss@h:1?ssl_cert_reqs=none", "rediss://u:***@h:1?ssl_cert_reqs=none"),
        ("redis+cluster://:pw@h1:1,h2:2", "redis+cluster://:***@h1:1,h2:2"),
        ("unix://default:pw@/tmp/r.sock?db=1", "unix://default:***@/tmp/r.sock?db=1"),
        ("unix:///tmp/r.sock?db=0&password=pw", "unix:///tmp/r.sock?db=0&password=***"),
        ("redis://user@host", "redis://user@host"),
        ("redis://host:6379", "redis://host:6379"),
        ("", ""),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_unreachable_redis_error_masks_the_password(tmp_path: Path) -> None:
    result = run_cli("--redis", f"redis://user:{SECRET}@127.0.0.1:1/0", "status", "x")
    assert result.returncode == 1
    line = one_error_line(result)
    assert "cannot reach Redis" in line and "redis://user:***@127.0.0.1:1/0" in line
    assert SECRET not in result.stdout + result.stderr


def test_errors_name_the_redis_used(redis_url: str) -> None:
    result = invoke("status", "no-such-id")
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "no-such-id" in line and redis_url in line


def test_supervised_children_get_the_url_from_the_environment(redis_url: str) -> None:
    url = with_password(redis_url)
    with redis.Redis.from_url(url) as client:
        assert client.ping()  # the server takes the password-bearing URL
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "worker", "--app", "apps.basic", "--processes", "2"],
        cwd=ROOT,
        env=env_without_redis(DURABLE_REDIS_URL=url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    kids: set[int] = set()
    try:
        kids = wait_for(lambda: (c := children(proc.pid)) and len(c) == 2 and c, timeout=15)
        for pid in kids:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            assert SECRET not in cmdline and redis_url not in cmdline, cmdline
        # The children do work with that URL.
        stub = WorkflowStub.make(Waiter, id="sup-1", store=RedisStore(redis_url)).start(0.01)
        stub.signal("go", "ok")
        assert stub.result(timeout=30) == "ok"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert SECRET not in (proc.stderr.read() if proc.stderr else "")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.stderr:
            proc.stderr.close()


def test_worker_config_round_trips_through_the_environment() -> None:
    config = WorkerConfig(
        redis_url="redis://:pw@h:1",
        apps=("a", "b"),
        queues=("q",),
        concurrency=3,
        cache_size=7,
        eager=True,
        claim_idle=1.5,
        build_id="b1",
        compatible=("b0",),
        unversioned=False,
        gc_threshold=0,
        log_format="json",
        log_level="DEBUG",
    )
    env = config.to_env()
    assert list(env) == [WorkerConfig.ENV]
    assert WorkerConfig.from_env(env) == config
    assert "pw" not in repr(config)


# --------------------------------------------------------------------------- repair


def test_repair_with_build_id_reports_success_when_the_run_finishes_at_once(
    redis_url: str, store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    stub = WorkflowStub.make(Waiter, id="rp-1", store=store)
    with WorkerThread(Worker(store, concurrency=2, grace=5, block_ms=100, build_id="v1")):
        stub.start(0.01)
        wait_for(lambda: store.run_record(store.ref("rp-1")).get("build") == "v1")
        wait_for(lambda: any(p.get("kind") == "signal" for p in stub.describe().get("pending") or []))
    stub.signal("go", "moved")  # queued on v1's stream, which nobody serves any more
    repin = RedisStore.repin

    def repin_then_finish(self: RedisStore, workflow_id: str, build: str):  # type: ignore[no-untyped-def]
        ref = repin(self, workflow_id, build)
        wait_for(lambda: stub.status() == "completed", timeout=20)  # v2 finishes the run at once
        return ref

    monkeypatch.setattr(RedisStore, "repin", repin_then_finish)
    with WorkerThread(Worker(store, concurrency=2, grace=5, block_ms=100, build_id="v2")):
        result = invoke("repair", "rp-1", "--build-id", "v2")
    assert result.exit_code == 0, result.output
    assert "v2" in result.stdout and "completed" in result.stdout
    assert stub.result(timeout=5) == "moved"

    closed = invoke("repair", "rp-1", "--build-id", "v3")
    assert closed.exit_code == 1
    assert "nothing to repair" in one_error_line(closed)
    assert store.run_record(store.ref("rp-1")).get("build") == "v2"  # a closed run is not moved


# --------------------------------------------------------------------------- odd stored data


def test_list_dead_json_with_a_parked_workflow_task(redis_url: str, store: RedisStore) -> None:
    WorkflowStub.make("NoSuchWorkflowType", id="ghost", store=store).start()
    with WorkerThread(Worker(store, concurrency=2, grace=5, block_ms=100, unknown_type_grace=0)):
        wait_for(lambda: store.dead_letters(), timeout=15)
    result = invoke("list", "--dead", "--json")
    assert result.exit_code == 0, result.output
    letters = json.loads(result.stdout)
    assert letters and letters[0]["kind"] == "workflow"
    assert "NoSuchWorkflowType" in letters[0]["reason"]
    assert invoke("list", "--dead").exit_code == 0


def test_describe_a_far_future_timer(redis_url: str, store: RedisStore) -> None:
    stub = WorkflowStub.make(Waiter, id="far", store=store)
    with WorkerThread(Worker(store, concurrency=2, grace=5, block_ms=100)):
        stub.start(10**12)  # about 31,700 years: past datetime's year 9999
        wait_for(lambda: stub.describe().get("pending"))
    result = invoke("describe", "far")
    assert result.exit_code == 0, result.output
    assert "timer" in result.stdout
    assert invoke("describe", "far", "--json").exit_code == 0


def test_describe_counts_a_cancel_and_signals_no_decision_took_yet(redis_url: str, store: RedisStore) -> None:
    """A run no worker has decided yet (none serves its queue) showed nothing of a cancel sent to
    it, and its --json had no cancel_requested or signals_buffered."""
    stub = WorkflowStub.make(Waiter, id="undecided", queue="nobody-here", store=store).start(1)
    stub.signal("go", "a")
    stub.signal("go", "b")
    assert invoke("cancel", "undecided", "--reason", "not needed").exit_code == 0
    described = json.loads(invoke("describe", "undecided", "--json").stdout)
    assert described["cancel_requested"] is True and described["signals_undecided"] == {"go": 2}
    assert described["signals_buffered"] == {}
    shown = invoke("describe", "undecided").stdout
    assert "cancel requested" in shown and "signals not yet decided" in shown


# --------------------------------------------------------------------------- app modules


def test_syntax_error_in_app_is_one_line_naming_module_and_line(tmp_path: Path) -> None:
    (tmp_path / "broken_app.py").write_text("x = 1\n\ndef f(:\n    pass\n")
    env = env_without_redis()
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    result = run_cli("check", "--app", "broken_app", env=env)
    assert result.returncode == 1
    line = one_error_line(result)
    assert "broken_app" in line and "line 3" in line


def test_app_given_as_a_file_name_hints_to_drop_py(tmp_path: Path) -> None:
    result = invoke("check", "--app", "examples/order.py")
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "examples.order" in line and ".py" in line


def test_an_app_not_found_says_where_it_was_looked_for(redis_url: str) -> None:
    """From another folder: "No module named 't2'" alone did not say it was looked for here."""
    line = one_error_line(invoke("query", "some-id", "progress", "--app", "not_here_app"))
    assert f"No module named 'not_here_app' in {os.getcwd()} or on the Python path" in line, line


def test_query_without_app_is_one_error_line(redis_url: str) -> None:
    result = invoke("query", "some-id", "progress")
    assert result.exit_code == 1
    line = one_error_line(result)
    assert "--app" in line


def test_read_only_command_never_starts_an_embedded_server(tmp_path: Path) -> None:
    for args in (("status", "x"), ("list",), ("describe", "x")):
        result = run_cli(*args, cwd=tmp_path)
        assert result.returncode == 1, result.stdout + result.stderr
        line = one_error_line(result)
        assert "no Redis" in line and "DURABLE_REDIS_URL" in line, line
        assert str(tmp_path / ".durable") in line
    assert not (tmp_path / ".durable" / "redis.sock").exists()
    assert not (tmp_path / ".durable" / "redis.pid").exists()


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_log_records_mask_passwords(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    from workers.logging import configure

    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure("INFO", fmt)
        logging.getLogger("durable.test").warning("lost redis://app:%s@db:6379/0", SECRET)
        err = capsys.readouterr().err
        assert "redis://app:***@db:6379/0" in err and SECRET not in err
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_repair_to_a_build_no_live_worker_runs_warns(redis_url: str, store: RedisStore) -> None:
    stub = WorkflowStub.make(Waiter, id="rp-2", store=store)
    with WorkerThread(Worker(store, concurrency=2, grace=5, block_ms=100, build_id="v1")):
        stub.start(0.01)
        wait_for(lambda: any(p.get("kind") == "signal" for p in stub.describe().get("pending") or []))
        result = invoke("repair", "rp-2", "--build-id", "v9")
    assert result.exit_code == 0, result.output
    assert "re-queued rp-2" in result.stdout
    assert result.stderr.startswith("warning: no live worker serves build 'v9' on queue 'default'"), (
        result.stderr
    )


def test_a_pinned_run_moves_back_to_unversioned_workers(redis_url: str, store: RedisStore) -> None:
    """A developer who tried `--build-id` and went back to plain `durable worker` had no way to move
    the runs pinned meanwhile: `--compatible-build-id` on an unversioned worker was ignored without a
    word, and `repair --build-id ""` said "re-queued" and left the run pinned."""
    stub = WorkflowStub.make(Waiter, id="rp-3", store=store)
    with WorkerThread(Worker(store, concurrency=2, grace=5, block_ms=100, build_id="v1")):
        stub.start(0.01)
        wait_for(lambda: any(p.get("kind") == "signal" for p in stub.describe().get("pending") or []))
    blocked = stub.blocked()
    assert blocked is not None and "or `--unversioned`" in blocked.message, blocked
    for odd in ("v 1", "v{1}", "v1\nx", "a|b"):  # part of stream names and log lines
        refused = invoke("worker", "--app", "apps.basic", "--build-id", odd)
        assert refused.exit_code == 2 and "use 1-100 characters from letters" in refused.output, odd
    assert "use 1-100 characters" in invoke("repair", "rp-3", "--build-id", "v 2").output
    ignored = invoke("worker", "--app", "apps.basic", "--compatible-build-id", "v1")
    assert ignored.exit_code == 2 and "--compatible-build-id needs --build-id" in ignored.output
    empty = invoke("repair", "rp-3", "--build-id", "")
    assert empty.exit_code == 2 and "or --unversioned (no build)" in empty.output
    moved = invoke("repair", "rp-3", "--unversioned")
    assert moved.exit_code == 0, moved.output
    assert moved.stdout.startswith("re-queued rp-3 (run ") and "on unversioned workers" in moved.stdout
    assert not store.run_record(store.ref("rp-3")).get("build")
    with WorkerThread(Worker(store, concurrency=2, grace=5, block_ms=100)):  # unversioned
        stub.signal("go", "back")
        assert stub.result(timeout=20) == "back"
    assert count_runs("build_id = 'v1'", store=store) == 0  # the search index followed


def test_tables_print_brackets_in_the_data_as_they_are(capsys: pytest.CaptureFixture[str]) -> None:
    """rich took a signal's payload ``[true]`` for markup and `durable history` showed ``payload=``."""
    event = HistoryEvent(
        seq=5,
        type="SignalReceived",
        ts=0,
        data={"name": "approve", "payload": [True], "note": "[red]x[/red]"},
    )
    console().print(history_table([event], title="run [wf-1]"))
    out = capsys.readouterr().out
    assert "payload=[true]" in out and "note=[red]x[/red]" in out and "run [wf-1]" in out, out


def test_ids_with_emoji_codes_are_printed_as_they_are(store: RedisStore) -> None:
    """Colons are legal in ids: rich showed ``:skull:-order-1`` as ``💀-order-1`` (copied from the
    table, an id that does not exist)."""
    for wid in (":skull:-order-1", "x:cross_mark:y"):
        WorkflowStub.make(Waiter, id=wid, store=store).start(60)
    listed = CliRunner().invoke(cli, ["list"])
    assert ":skull:-order-1" in listed.output and "x:cross_mark:y" in listed.output, listed.output
    described = CliRunner().invoke(cli, ["describe", ":skull:-order-1"])
    assert "workflow id :skull:-order-1" in " ".join(described.output.split()), described.output
    assert "💀" not in listed.output + described.output and "❌" not in listed.output
    for wid in (":skull:-order-1", "x:cross_mark:y"):
        WorkflowStub.load(wid, store=store).terminate("test over")


def test_control_characters_in_what_runs_wrote_do_not_reach_the_terminal(store: RedisStore) -> None:
    """A cancel/terminate reason or an activity's error is anyone's text: its escape sequences
    reached the operator's terminal raw through `status` and `describe` (clear the screen, set
    the title, OSC 52: write the clipboard) and the worker's log."""
    evil = "reason \x1b[2J\x1b]52;c;ZWNobyBwd25lZA==\x07 \x9b31m cleared \u202edesrever"
    stub = WorkflowStub.make(Waiter, id="ansi-reason", store=store).start(60)
    stub.terminate(evil)
    for command in (["status", "ansi-reason"], ["describe", "ansi-reason"], ["list"]):
        out = CliRunner().invoke(cli, command).output
        assert not any(c in out for c in "\x1b\x07\x9b\u202e"), (command, out)
    described = CliRunner().invoke(cli, ["describe", "ansi-reason"]).output
    assert "reason \\x1b[2J\\x1b]52;c;ZWNobyBwd25lZA==\\x07 \\x9b31m cleared \\u202edesrever" in described, (
        described
    )
    line = MaskingFormatter("%(message)s").format(
        logging.makeLogRecord({"msg": f"failed: {evil}\nnext line"})
    )
    assert "\x1b" not in line and "\\x1b[2J" in line and line.endswith("\nnext line"), line
