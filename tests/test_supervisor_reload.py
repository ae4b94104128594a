"""SIGHUP to ``durable worker --processes N``: the worker processes are replaced one at a time,
each new one serving before the old one stops; a new one that cannot start stops the reload."""

from __future__ import annotations

import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from procs import children, stop, supervised_app
from waiting import wait_for

from durable import WorkflowStub
from durable.store.redis_store import RedisStore
from workers.supervisor import READY_FD_ENV, Supervisor

# A child that takes a while to start, says when it joined and when it was asked to stop (the
# system's monotonic clock: comparable between processes), and fails to start while `broken`
# exists, as a worker whose new code does not import.
CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    journal, broken = sys.argv[1], sys.argv[2]
    def note(what):
        with open(journal, "a") as fh:
            fh.write(f"{what} {os.getpid()} {time.monotonic()}\\n")
    if os.path.exists(broken):
        print("error: cannot import module 'shop': SyntaxError (shop.py, line 3)", file=sys.stderr)
        sys.exit(1)
    def stopping(*_):
        note("stop")
        sys.exit(0)
    signal.signal(signal.SIGTERM, stopping)
    time.sleep(0.3)
    note("join")
    os.write(int(os.environ[READY]), b"joined\\n")
    while True:
        time.sleep(0.05)
    """
).replace("READY", repr(READY_FD_ENV))


def _journal(path: Path) -> list[tuple[str, int, float]]:
    if not path.exists():
        return []
    return [(w, int(pid), float(t)) for w, pid, t in (line.split() for line in path.read_text().splitlines())]


@pytest.fixture
def supervised(tmp_path: Path):  # type: ignore[no-untyped-def]
    journal, broken = tmp_path / "journal", tmp_path / "broken"
    sup = Supervisor(
        [sys.executable, "-c", CHILD, str(journal), str(broken)], 2, poll_interval=0.02, min_backoff=0.2
    )
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(sup.run()), daemon=True)
    thread.start()
    try:
        wait_for(lambda: all(slot.joined for slot in sup.slots))
        yield sup, journal, broken, thread, codes
    finally:
        sup.stop()
        thread.join(15)
        for slot in sup.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.kill()


def test_a_reload_replaces_each_process_after_its_successor_joined(supervised) -> None:  # type: ignore[no-untyped-def]
    sup, journal, _, thread, codes = supervised
    old = [slot.proc.pid for slot in sup.slots]
    sup.reload()
    wait_for(lambda: sup.reloads == 1)
    new = [slot.proc.pid for slot in sup.slots]
    assert set(new).isdisjoint(old) and all(slot.joined for slot in sup.slots)
    events = _journal(journal)
    joined = {pid: t for what, pid, t in events if what == "join"}
    wait_for(lambda: len([e for e in _journal(journal) if e[0] == "stop"]) == 2)
    stopped = {pid: t for what, pid, t in _journal(journal) if what == "stop"}
    for before, after in zip(old, new, strict=True):
        # The queues were served throughout: each old process was asked to stop only once
        # the process that replaces it had joined.
        assert joined[after] < stopped[before]
    # One at a time: the second replacement started after the first old process was told to stop.
    assert joined[new[1]] > stopped[old[0]]
    assert sup.reload_error is None and sup.restarts == 0  # stopping replaced ones is no death
    sup.stop()
    thread.join(15)
    assert codes == [0]


def test_a_new_process_that_cannot_start_stops_the_reload_and_the_old_ones_keep_serving(supervised) -> None:  # type: ignore[no-untyped-def]
    sup, journal, broken, _, _ = supervised
    old = [slot.proc.pid for slot in sup.slots]
    broken.touch()  # the code deployed does not import
    sup.reload()
    wait_for(lambda: sup.reload_error is not None)
    assert "exited with 1 before it joined" in sup.reload_error
    assert "cannot import module 'shop'" in sup.reload_error  # the new process's own error line
    time.sleep(0.3)
    assert [slot.proc.pid for slot in sup.slots] == old
    assert all(slot.proc.poll() is None for slot in sup.slots)
    assert not [e for e in _journal(journal) if e[0] == "stop"]
    # Fixed: the next reload goes through.
    broken.unlink()
    sup.reload()
    wait_for(lambda: sup.reloads == 1)
    assert sup.reload_error is None and set(slot.proc.pid for slot in sup.slots).isdisjoint(old)


APP_V1 = textwrap.dedent(
    """
    import time
    from durable import Workflow, activity

    def version(seconds: float) -> str:
        time.sleep(seconds)
        return "v1"

    class Versioned(Workflow):
        def handle(self, seconds: float) -> str:
            return activity(version, seconds)
    """
)


@pytest.mark.slow
def test_sighup_deploys_new_code_without_losing_the_running_activity(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    """The edit-deploy loop: edit the app, `kill -HUP` the supervisor; a run whose activity was
    running on an old process completes there (one attempt), and new runs get the new code."""
    (tmp_path / "versioned_app.py").write_text(APP_V1)
    with supervised_app(redis_url, tmp_path, "versioned_app") as (proc, versioned_app, log):
        assert WorkflowStub.make(versioned_app.Versioned, store=store).start(0).result(timeout=30) == "v1"
        old = wait_for(lambda: (c := children(proc.pid)) and len(c) == 2 and c)
        running = WorkflowStub.make(versioned_app.Versioned, store=store).start(3)
        wait_for(lambda: "running on" in str((running.describe().pending or [{}])[0].get("state")))

        (tmp_path / "versioned_app.py").write_text(APP_V1.replace('"v1"', '"v2"'))
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: b"reload done: 2 worker processes replaced" in log.read_bytes(), timeout=60)
        assert running.result(timeout=30) == "v1"  # finished by the old process it ran on
        # The old processes leave once their activities are done (the one above ran for 3 s).
        wait_for(lambda: len(c := children(proc.pid)) == 2 and c.isdisjoint(old))
        attempts = running.describe().attempts
        assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "completed")], attempts
        assert WorkflowStub.make(versioned_app.Versioned, store=store).start(0).result(timeout=30) == "v2"
        assert stop(proc) == 0


def test_a_stop_during_a_reload_stops_the_new_and_the_replaced_processes_too(supervised) -> None:  # type: ignore[no-untyped-def]
    sup, journal, _, thread, codes = supervised
    sup.reload()
    # The first old process told to stop, the second's successor still starting.
    # (One look at the reload: the supervisor's thread moves it on meanwhile.)
    starting = wait_for(
        lambda: (r := sup._reload) is not None and r.index == 1 and (new := r.new) is not None and new.proc
    )
    sup.stop()
    thread.join(15)
    assert not thread.is_alive(), "the supervisor still waits for a child of the reload"
    assert codes == [0]
    assert starting.poll() is not None
    started = {pid for what, pid, _ in _journal(journal) if what == "join"}
    assert all(not Path(f"/proc/{pid}").exists() or _zombie(pid) for pid in started)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
