"""Which release of durable this process runs: the package version, and the commit of the
checkout it was installed from (editable installs, the usual way durable is installed), so a
rolling upgrade can be followed worker by worker (``durable workers``, ``durable --version``)."""

from __future__ import annotations

import functools
from pathlib import Path

__all__ = ["release"]

VERSION = "0.1.0"


@functools.cache
def release() -> str:
    """``0.1.0`` or, from a git checkout, ``0.1.0+g2581695`` (the commit's first 7 hex digits)."""
    commit = _checkout_commit(Path(__file__).resolve().parent.parent / ".git")
    return f"{VERSION}+g{commit[:7]}" if commit else VERSION


def _checkout_commit(git: Path) -> str:
    """The commit HEAD names in the checkout whose ``.git`` is ``git`` (``""``: none readable).
    Read from the files, not by running git: a worker starts without it installed too."""
    try:
        if git.is_file():  # a worktree: "gitdir: <path>"
            git = Path(git.read_text().removeprefix("gitdir:").strip())
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head  # a detached HEAD is the commit itself
        ref = head.removeprefix("ref: ")
        for where in (git, _common(git)):
            if (where / ref).is_file():
                return (where / ref).read_text().strip()
            packed = where / "packed-refs"
            if packed.is_file():
                for line in packed.read_text().splitlines():
                    if line.endswith(f" {ref}"):
                        return line.split()[0]
    except OSError:
        pass
    return ""


def _common(git: Path) -> Path:
    """A worktree's shared git dir (its ``commondir``), else ``git`` itself."""
    common = git / "commondir"
    return (git / common.read_text().strip()).resolve() if common.is_file() else git
