"""``--build-id auto`` hashes the code a workflow runs, not only the ``--app`` file.

A tester's workflow took its steps from a helper module its ``--app`` module imported: an
incompatible edit of the helper and a reload kept the build id, so the old build's runs were
not drained to old code but replayed on the new one (and blocked, NondeterminismError).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from procs import ROOT, spawn_worker, stop
from waiting import wait_for

from durable.store.redis_store import RedisStore

APP = "from bid_helpers import first_steps\n\n\ndef steps():\n    return first_steps()\n"


def _build_id(folder: Path) -> str:
    code = "from workers.app import load_app, code_build_id; print(code_build_id(load_app(['bid_app'])))"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip()


def test_an_edit_of_a_module_the_app_imports_is_a_new_build(tmp_path: Path) -> None:
    (tmp_path / "bid_app.py").write_text(APP)
    helpers = tmp_path / "bid_helpers.py"
    helpers.write_text("def first_steps():\n    return ['reserve']\n")
    before = _build_id(tmp_path)
    assert before == _build_id(tmp_path)  # the same code: the same id, in any process
    helpers.write_text("def first_steps():\n    return ['fraud-check', 'reserve']\n")
    assert _build_id(tmp_path) != before


def test_an_edit_of_a_module_imported_inside_a_function_is_a_new_build(tmp_path: Path) -> None:
    # A lazy import (the usual way around an import cycle) is not loaded when the worker starts:
    # its module was left out of the hash, and an incompatible edit of it kept the build id.
    package = tmp_path / "bid_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "flows.py").write_text(
        "def steps():\n    from . import lazy_steps\n    from bid_pkg.deeper import more\n"
        "    return lazy_steps.plan() + more()\n"
    )
    (package / "lazy_steps.py").write_text("def plan():\n    return ['reserve']\n")
    (package / "deeper.py").write_text("def more():\n    return []\n")
    (tmp_path / "bid_app.py").write_text("from bid_pkg.flows import steps\n")
    before = _build_id(tmp_path)
    (package / "lazy_steps.py").write_text("def plan():\n    return ['fraud-check', 'reserve']\n")
    after = _build_id(tmp_path)
    assert after != before
    (package / "deeper.py").write_text("def more():\n    return ['ship']\n")
    assert _build_id(tmp_path) not in (before, after)


def test_a_worker_given_another_codes_auto_id_by_hand_says_so(
    redis_url: str, store: RedisStore, tmp_path: Path
) -> None:
    """The hints say "start `durable worker --build-id B`": a tester did, with the new code on
    disk, and the worker parked B's runs (NondeterminismError) without a word about the code."""
    (tmp_path / "bid_app.py").write_text(APP)
    (tmp_path / "bid_helpers.py").write_text("def first_steps():\n    return ['reserve']\n")
    own = _build_id(tmp_path)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    worker = spawn_worker(redis_url, app="bid_app", extra=("--build-id", "0123456789ab"), env=env)
    try:
        wait_for(store.live_workers, timeout=30)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.stderr is not None
        err = worker.stderr.read().decode()
        stop(worker)
    assert f"--build-id 0123456789ab looks like a `--build-id auto` hash, but this code's is {own}" in err, (
        err
    )
