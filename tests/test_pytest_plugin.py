"""durable.testing as an installed pytest plugin (pytest11 entry point) and py.typed (the typed stubs: test_typing.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

USER_TEST = """
from durable import Workflow


class Greet(Workflow):
    def handle(self, name: str) -> str:
        return f"hello {name}"


def test_fixtures_come_from_the_entry_point(durable_stub, durable_store):
    stub = durable_stub(Greet).start("ada")
    assert stub.result(timeout=15) == "hello ada"
    assert durable_store.ref(stub.id).run_id == stub.run_id
"""


def _entry_point() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(project["entry-points"]["pytest11"])


def test_pyproject_declares_the_plugin_and_ships_py_typed() -> None:
    assert _entry_point() == {"durable.testing": "durable.testing"}
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in data["durable"] and (ROOT / "durable" / "py.typed").is_file()


def _run_user_suite(tmp_path: Path, redis_url: str) -> subprocess.CompletedProcess[str]:
    """A user's project: its tests, no conftest import, durable "installed" with our entry point
    (a dist-info on PYTHONPATH declaring it, since the test must not reinstall the package)."""
    site = tmp_path / "site"
    dist = site / "durable_plugin_probe-0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: durable-plugin-probe\nVersion: 0\n")
    lines = [f"{name} = {value}" for name, value in _entry_point().items()]
    (dist / "entry_points.txt").write_text("[pytest11]\n" + "\n".join(lines) + "\n")
    (tmp_path / "proj" / "test_user.py").write_text(USER_TEST)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)]),
        "DURABLE_TEST_REDIS_URL": redis_url,
    }
    env.pop("PYTEST_DISABLE_PLUGIN_AUTOLOAD", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
        cwd=tmp_path / "proj",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_users_tests_get_the_fixtures_without_a_conftest(tmp_path: Path, redis_url: str) -> None:
    (tmp_path / "proj").mkdir()
    done = _run_user_suite(tmp_path, redis_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    # A conftest from before the entry point still works: no duplicate registration.
    (tmp_path / "proj" / "conftest.py").write_text('pytest_plugins = ["durable.testing"]\n')
    done = _run_user_suite(tmp_path, redis_url)
    assert done.returncode == 0, done.stdout + done.stderr
