"""The ``durable`` command's error lines as a user meets them: bad Redis URLs, an app module
that raises at import, an embedded server that died. Run as real processes (a traceback only
shows there), each in a tmp folder of its own.

Every process a test starts is stopped by pid, the embedded ``redis-server`` included.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from waiting import wait_for

from workers.cli import cli

ROOT = Path(__file__).resolve().parent.parent
SECRET = "s3cretMarker"


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without a configured Redis (no URL, no DURABLE_HOME): the CLI falls back
    to the embedded server of its working folder."""
    env = {k: v for k, v in os.environ.items() if k not in ("DURABLE_REDIS_URL", "DURABLE_HOME")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.update(extra)
    return env


def run_cli(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        cwd=cwd,
        env=env if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result.stdout + result.stderr
    err = result.stderr.strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: "), err
    return err


def alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def kill_and_wait(pid: int, sig: signal.Signals = signal.SIGTERM, timeout: float = 10.0) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"pid {pid} did not exit within {timeout} s of {sig.name}")
        time.sleep(0.02)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """A tmp project folder; whatever embedded server a test leaves in its ``.durable`` is stopped."""
    yield tmp_path
    pidfile = tmp_path / ".durable" / "redis.pid"
    if pidfile.exists():
        kill_and_wait(int(pidfile.read_text().strip()))


# --------------------------------------------------------------------------- bad Redis URLs


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://localhost:notaport", "Port could not be cast to integer"),
        ("http://x", "must specify one of the following schemes"),
        ("garbage", "must specify one of the following schemes"),
        (f"redis://app:{SECRET}@db:99999/0", "Port out of range"),
        (f"redis+cluster://app:{SECRET}@db:bad", "bad Redis URL"),
        ("redis://[::1", "Invalid IPv6 URL"),
    ],
)
def test_a_bad_url_is_one_error_line(project: Path, url: str, says: str) -> None:
    line = one_error_line(run_cli(project, "--redis", url, "status", "x"))
    assert line.startswith("error: --redis: bad Redis URL"), line
    assert says in line
    assert "a Redis URL looks like redis://host" in line  # what a good one looks like
    assert SECRET not in line
    if SECRET in url:
        assert url.replace(SECRET, "***") in line
    else:
        assert url in line
    assert not (project / ".durable").exists()  # a URL was given: no embedded server


@pytest.mark.parametrize("command", [("list",), ("worker", "--app", "app1")])
def test_a_bad_url_in_the_environment_is_one_error_line(project: Path, command: tuple[str, ...]) -> None:
    (project / "app1.py").write_text("x = 1\n")
    result = run_cli(project, *command, env=clean_env(DURABLE_REDIS_URL="garbage"))
    assert result.returncode == 1
    line = one_error_line(result)
    assert line.startswith("error: $DURABLE_REDIS_URL: bad Redis URL 'garbage'"), line


def test_an_unreachable_cluster_is_one_error_line(project: Path) -> None:
    line = one_error_line(run_cli(project, "--redis", "redis+cluster://127.0.0.1:1", "status", "x"))
    assert "cannot reach Redis at redis+cluster://127.0.0.1:1" in line
    assert "no node of the Redis Cluster answers" in line


def test_a_worker_waits_for_an_unreachable_cluster(project: Path) -> None:
    """As for one Redis that is not up yet (docs/operations.md): a WARNING, no exit."""
    (project / "app1.py").write_text("x = 1\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workers.cli",
            "--redis",
            "redis+cluster://127.0.0.1:1",
            "worker",
            "--app",
            "app1",
        ],
        cwd=project,
        env=clean_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert "redis unavailable (connection lost" in first and "worker startup" in first, first
        assert proc.poll() is None
    finally:
        kill_and_wait(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stderr:
            proc.stderr.close()


# --------------------------------------------------------------------------- --app import errors


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('raise RuntimeError("boom at import")\n', "RuntimeError: boom at import (app6.py, line 1)"),
        # The line in the app's code, not in the library it called.
        ('import json\n\njson.loads("{")\n', "JSONDecodeError: Expecting property name"),
        ("raise RuntimeError()\n", "RuntimeError (app6.py, line 1)"),
        ("import no_such_dependency_xyz\n", "No module named 'no_such_dependency_xyz' (app6.py, line 1)"),
        ("def f(:\n", "(app6.py, line 1)"),
    ],
)
def test_an_app_that_raises_at_import_is_one_error_line(project: Path, source: str, expected: str) -> None:
    (project / "app6.py").write_text(source)
    result = run_cli(project, "check", "--app", "app6")
    assert result.returncode == 1
    line = one_error_line(result)
    assert line.startswith("error: cannot import app module 'app6': "), line
    assert expected in line
    if "json" in source:
        assert line.endswith("(app6.py, line 3)"), line


def test_worker_with_an_app_that_raises_at_import(project: Path, redis_url: str) -> None:
    (project / "app6.py").write_text('raise RuntimeError("boom at import")\n')
    result = run_cli(project, "worker", "--app", "app6", env=clean_env(DURABLE_REDIS_URL=redis_url))
    assert result.returncode == 1
    line = one_error_line(result)
    assert "error: cannot import app module 'app6': RuntimeError: boom at import (app6.py, line 1)" in line


# --------------------------------------------------------------------------- the embedded server


def test_a_read_command_restarts_the_dead_embedded_server(project: Path) -> None:
    started = run_cli(project, "start", "Greet", "alice", "--id", "survivor")
    assert started.returncode == 0, started.stderr
    pidfile = project / ".durable" / "redis.pid"
    first = int(pidfile.read_text())
    # A new, empty server is announced (a command run from the wrong folder would make one).
    assert (
        f"note: started a new embedded Redis in {project / '.durable'} (pid {first}); runs started here are kept there"
        in started.stderr
    ), started.stderr
    assert "note:" not in run_cli(project, "start", "Greet", "bob").stderr  # the same one, reused
    kill_and_wait(first, signal.SIGKILL)
    assert (project / ".durable" / "redis.sock").exists()  # left behind, as after a crash

    listed = run_cli(project, "list")
    assert listed.returncode == 0, listed.stderr
    second = int(pidfile.read_text())
    assert second != first and alive(second)
    assert listed.stderr.strip() == (
        f"note: the embedded Redis in {project / '.durable'} was not running; restarted it (pid {second})"
    )
    assert "survivor" in listed.stdout  # its data came back with it

    again = run_cli(project, "status", "survivor")
    assert again.returncode == 0, again.stderr
    assert "note:" not in again.stderr  # running: nothing to say


def test_a_stopped_embedded_server_reached_from_another_folder_is_said_with_how_to_start_it(
    project: Path, tmp_path: Path
) -> None:
    # Its URL given from elsewhere, the error said only "No such file or directory".
    assert run_cli(project, "start", "Greet", "alice", "--id", "elsewhere").returncode == 0
    kill_and_wait(int((project / ".durable" / "redis.pid").read_text()))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    url = f"unix://{project / '.durable' / 'redis.sock'}"
    said = one_error_line(run_cli(elsewhere, "status", "elsewhere", env=clean_env(DURABLE_REDIS_URL=url)))
    assert f"it is the embedded Redis of {project}, stopped: any `durable` command run in that folder" in said


REVIVE_APP = """
from durable import Workflow, await_signal


class RvWait(Workflow):
    def handle(self) -> str:
        return "got " + await_signal("go")
"""


@pytest.mark.fault
def test_a_worker_starts_its_dead_embedded_server_again(project: Path) -> None:
    """Killed (SIGKILL, the OOM killer), the project's server is started again on its AOF by the
    worker, which then carries the run on; stopped cleanly, it is left stopped."""
    (project / "rv_app.py").write_text(REVIVE_APP)
    env = clean_env(PYTHONPATH=os.pathsep.join([str(project), str(ROOT)]))
    worker = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "worker", "--app", "rv_app"],
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        pidfile = project / ".durable" / "redis.pid"
        wait_for(pidfile.exists, timeout=30)
        assert run_cli(project, "start", "RvWait", "--id", "rv", env=env).returncode == 0
        wait_for(
            lambda: (
                run_cli(project, "status", "rv", env=env).stdout.strip()
                == "suspended (waiting for signal 'go')"
            ),
            timeout=30,
        )
        first = int(pidfile.read_text())
        kill_and_wait(first, signal.SIGKILL)
        wait_for(lambda: pidfile.exists() and int(pidfile.read_text()) != first, timeout=30)
        second = int(pidfile.read_text())
        assert alive(second)
        signalled = run_cli(project, "signal", "rv", "go", '"back"', env=env)
        assert signalled.returncode == 0 and "note:" not in signalled.stderr, signalled.stderr
        result = run_cli(project, "result", "rv", "--timeout", "30", env=env)
        assert result.stdout.strip() == '"got back"', result.stdout + result.stderr

        kill_and_wait(second)  # SIGTERM: a clean stop removes the pidfile; nobody's crash
        time.sleep(7)  # past the worker's next tries (one each 5 s)
        assert not pidfile.exists() and alive(second) is False
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            _, err = worker.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            _, err = worker.communicate()
    assert "the embedded Redis had died; started it again on its data (AOF)" in err, err
    assert err.count("started it again") == 1, err
    sock = project / ".durable" / "redis.sock"
    assert f"redis: unix://{sock} (embedded); build id:" in err, err


def test_a_folder_without_data_gets_no_server(project: Path) -> None:
    """A ``.durable`` with no AOF (only a lock, a stale pidfile) is no project's server."""
    (project / ".durable").mkdir(mode=0o700)
    (project / ".durable" / "redis.lock").write_text("")
    (project / ".durable" / "redis.pid").write_text("999999\n")
    line = one_error_line(run_cli(project, "list"))
    assert "no Redis here" in line
    assert "a worker logs the URL of its Redis when it starts" in line
    assert not (project / ".durable" / "redis.sock").exists()
    (project / ".durable" / "redis.pid").unlink()  # not a server's: nothing to stop


def test_a_worker_whose_app_is_not_found_starts_no_server(project: Path) -> None:
    """A typo in --app, or the wrong folder: said before an embedded Redis is started for it
    (it was started first, and left running)."""
    line = one_error_line(run_cli(project, "worker", "--app", "no_such_app"))
    assert line.startswith(
        "error: cannot import app module 'no_such_app': No module named 'no_such_app' in "
    ), line
    assert not (project / ".durable").exists()


def test_a_worker_whose_app_raises_at_import_starts_no_server(project: Path) -> None:
    """The module is found but fails while it is imported: said before an embedded Redis is
    started for it (it was, and left running). A supervisor's children import it themselves."""
    (project / "app7.py").write_text('raise RuntimeError("missing setting FOO")\n')
    line = one_error_line(run_cli(project, "worker", "--app", "app7"))
    assert (
        line == "error: cannot import app module 'app7': RuntimeError: missing setting FOO (app7.py, line 1)"
    )
    assert not (project / ".durable").exists()


@pytest.mark.parametrize(
    "command",
    [
        ("start", "Order", "1", '{"sku": "x",}'),
        ("start", "Order", "--signal", "go", "--signal-arg", "[1,"),
        ("signal", "o-1", "go", "[1,"),
    ],
)
def test_an_argument_that_is_not_json_starts_no_server(project: Path, command: tuple[str, ...]) -> None:
    """A typo in a JSON argument is refused before an embedded Redis is started for the command
    (``start`` started one first, and left it running)."""
    line = one_error_line(run_cli(project, *command))
    assert "is not valid JSON" in line, line
    assert not (project / ".durable").exists()


NESTED = "[" * 5000 + "]" * 5000  # deeper than json.loads can read: it raised RecursionError


@pytest.mark.parametrize(
    "command",
    [("start", "Order", NESTED), ("signal", "o-1", "go", NESTED), ("update", "o-1", "set", NESTED)],
    ids=["start", "signal", "update"],
)
def test_an_argument_nested_too_deeply_is_one_error_line(project: Path, command: tuple[str, ...]) -> None:
    line = one_error_line(run_cli(project, *command))
    assert line == "error: argument 1 is JSON nested too deeply to read", line
    assert not (project / ".durable").exists()


@pytest.mark.parametrize("before", ["²", "²:01J", pytest.param("9" * 5000, id="5000-digits"), "-1:01J"])
def test_a_list_cursor_int_cannot_read_is_a_usage_error(project: Path, before: str) -> None:
    """``str.isdigit`` passed "²" (and 5,000 digits), which ``int`` then refused with a traceback."""
    result = run_cli(project, "list", "--before", before)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "expected MS or MS:RUN_ID" in result.stderr, result.stderr


def test_replaying_a_file_nested_too_deeply_says_so(project: Path) -> None:
    export = project / "deep.json"
    export.write_text(NESTED)
    result = run_cli(project, "replay", str(export), "--app", "examples.order")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout.strip() == f"ERROR {export}: not a JSON history export (nested too deeply to read)"


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (("worker", "--app", "app", "--claim-idle", "nan"), "'nan' is not a number of seconds"),
        (("worker", "--app", "app", "--sticky-timeout", "inf"), "inf is not in the range 0<=x<=1e+15"),
        (("worker", "--app", "app", "--unknown-type-grace", "nan"), "'nan' is not a number of seconds"),
        (("worker", "--app", "app", "--grace", "-1"), "-1.0 is not in the range 0<=x<=1e+15"),
        (("result", "o-1", "--timeout", "inf"), "inf is not in the range 0<=x<=1e+15"),
        (("update", "o-1", "set", "--timeout", "nan"), "'nan' is not a number of seconds"),
    ],
    ids=["claim-idle", "sticky-timeout", "unknown-type-grace", "grace", "result", "update"],
)
def test_seconds_that_are_no_duration_are_a_usage_error(
    project: Path, command: tuple[str, ...], says: str
) -> None:
    """``--claim-idle nan`` or ``inf`` passed click's FloatRange and killed the worker with a
    traceback at ``int(seconds * 1000)``; ``--timeout inf`` did so in the wait."""
    result = run_cli(project, *command)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert says in result.stderr, result.stderr
    assert not (project / ".durable").exists()


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (redis.exceptions.ClusterDownError("The cluster is down"), "no replica took over"),
        (redis.exceptions.ResponseError("ERR something odd"), "redis: ERR something odd"),
    ],
)
def test_a_redis_error_while_opening_the_store_names_the_redis(
    monkeypatch: pytest.MonkeyPatch, error: Exception, says: str
) -> None:
    """A cluster whose master of some slots was stopped failed the store's opening (its slot
    map read): the line said only ``error: redis: The cluster is down``, no Redis named."""

    def refused(*_args: object, **_kwargs: object) -> None:
        raise error

    monkeypatch.setattr("workers.cli.core.RedisStore", refused)
    url = "redis+cluster://127.0.0.1:7000"
    result = CliRunner().invoke(cli, ["--redis", url, "list"])
    assert result.exit_code == 1
    assert says in result.output and f"(redis: {url})" in result.output, result.output
