"""``--build-id auto`` hashes the code a workflow runs, not only the ``--app`` file.

A tester's workflow took its steps from a helper module its ``--app`` module imported: an
incompatible edit of the helper and a reload kept the build id, so the old build's runs were
not drained to old code but replayed on the new one (and blocked, NondeterminismError).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from procs import ROOT

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
