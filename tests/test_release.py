"""Which release of durable runs: the package version and, from a checkout, its commit."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from durable.release import VERSION, _checkout_commit, release
from workers.cli import cli

ROOT = Path(__file__).resolve().parent.parent


def test_the_version_is_pyprojects() -> None:
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == VERSION


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_a_checkouts_release_names_its_commit_and_the_cli_says_it() -> None:
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    assert release() == f"{VERSION}+g{head.stdout.strip()[:7]}"
    assert CliRunner().invoke(cli, ["--version"]).output.strip() == f"durable, version {release()}"


def test_refs_are_read_loose_packed_or_detached(tmp_path: Path) -> None:
    git = tmp_path / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    assert _checkout_commit(git) == ""  # a branch with no commit yet
    (git / "packed-refs").write_text("# pack-refs with: peeled\n" + "a" * 40 + " refs/heads/main\n")
    assert _checkout_commit(git) == "a" * 40
    (git / "refs" / "heads" / "main").write_text("b" * 40 + "\n")
    assert _checkout_commit(git) == "b" * 40
    (git / "HEAD").write_text("c" * 40 + "\n")
    assert _checkout_commit(git) == "c" * 40
    assert _checkout_commit(tmp_path / "nothing") == ""
