"""docs/: the API reference is generated and in sync; the index and the CLI page are complete."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import durable

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_gen_api", DOCS / "gen_api.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_name_has_a_heading_in_api_md() -> None:
    text = (DOCS / "api.md").read_text()
    headings = set(re.findall(r"^### (\S+)$", text, re.M))
    missing = [name for name in durable.__all__ if name not in headings]
    assert not missing, f"not in docs/api.md: {missing}"


def test_api_md_is_the_generators_output() -> None:
    assert (DOCS / "api.md").read_text() == _generator().render(), (
        "docs/api.md is stale: run python docs/gen_api.py"
    )


def test_index_links_every_document() -> None:
    index = (DOCS / "README.md").read_text()
    for name in ("concepts.md", "guide.md", "determinism.md", "api.md", "operations.md", "cli.md"):
        assert (DOCS / name).is_file(), name
        assert f"]({name})" in index, name


def test_cli_md_documents_every_command() -> None:
    from workers.cli import cli

    text = (DOCS / "cli.md").read_text()
    for name in cli.commands:
        assert re.search(rf"^## .*\b{re.escape(name)}\b", text, re.M), f"`durable {name}` not in docs/cli.md"


def test_relative_links_resolve() -> None:
    for doc in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text()):
            if target == "errors.md":  # written by another change
                continue
            assert (doc.parent / target).exists(), f"{doc.name}: broken link {target}"
