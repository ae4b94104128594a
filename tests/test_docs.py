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


def _mentions() -> dict[str, set[str]]:
    """``durable ...`` command lines the docs, the README and the examples show: inline code
    and the lines of fenced blocks, each with the files it is in."""
    root = DOCS.parent
    found: dict[str, set[str]] = {}
    for path in [*DOCS.glob("*.md"), root / "README.md", *(root / "examples").glob("*.py")]:
        text = path.read_text()
        lines = re.findall(r"`(durable [^`\n]+)`", text)
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            lines += [line.strip().removeprefix("$ ") for line in block.splitlines()]
        for line in lines:
            if line.startswith("durable "):
                found.setdefault(line.split(" #")[0].strip(), set()).add(path.name)
    return found


def _unknown_names(line: str) -> list[str]:
    """The commands and options of one ``durable ...`` line that the CLI does not have."""
    import click

    from workers.cli import cli

    words = line.split()[1:]
    taking_values = {o for p in cli.params if isinstance(p, click.Option) and not p.is_flag for o in p.opts}
    while words and words[0].startswith("-"):  # the group's own options (--namespace NAME ...)
        words = words[2:] if words[0] in taking_values else words[1:]
    if not words or not re.fullmatch(r"[a-z][a-z/-]*", words[0]):
        return []  # `durable ... --json`, `durable status|describe|list`: not one command line
    if words[0] not in cli.commands:
        # An unknown word is a command only in a short mention (`durable repin`), not in a
        # message that starts with the name ("durable is using the default namespace ...").
        return [words[0]] if len(words) <= 4 else []
    chain: list[click.Command] = [cli, cli.commands[words[0]]]
    for alternative in words[1].split("/") if len(words) > 1 else ():
        group = chain[-1]
        if isinstance(group, click.Group) and re.fullmatch(r"[a-z][a-z-]*", alternative):
            if alternative not in group.commands:
                return [f"{words[0]} {alternative}"]
            chain.append(group.commands[alternative])
    options = {"--help"} | {o for c in chain for p in c.params for o in (*p.opts, *p.secondary_opts)}
    return [w for w in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", line) if w not in options]


def test_the_cli_lines_the_docs_show_name_real_commands_and_options() -> None:
    """A renamed command or flag leaves docs that send users to an error (`durable repin`)."""
    stale = {
        line: (names, sorted(files)) for line, files in _mentions().items() if (names := _unknown_names(line))
    }
    assert not stale, f"docs name commands or options the CLI does not have: {stale}"


def test_the_python_examples_of_the_docs_are_valid_python() -> None:
    """The ```python blocks of the guides and the README (not api.md's signatures) parse."""
    import ast
    import textwrap

    broken = []
    for path in [*DOCS.glob("*.md"), DOCS.parent / "README.md"]:
        if path.name == "api.md":
            continue
        text = path.read_text()
        for block in re.finditer(r"```python\n(.*?)```", text, re.S):
            try:
                ast.parse(textwrap.dedent(block.group(1)))
            except SyntaxError as exc:
                broken.append(f"{path.name}:{text[: block.start()].count(chr(10)) + 1}: {exc.msg}")
    assert not broken, broken
