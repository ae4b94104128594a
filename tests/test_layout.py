"""The module layout stays easy to see and to change (see docs/design-notes.md, "Layers").

These read the source with :mod:`ast`; nothing is imported or run.

* no file in ``durable/`` or ``workers/`` over 600 lines, no function over 80;
* no import cycle among the modules of ``workers`` (``durable``'s are checked, with the other
  import rules of the library, in test_architecture.py);
* ``durable`` never imports ``workers`` at module level (the dependency points one way).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def _sources(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported (TYPE_CHECKING blocks left out)."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If | ast.Try | ast.With) and not _type_checking_block(node):
            stack.extend(ast.iter_child_nodes(node))


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    """Project modules an import statement makes ``module`` depend on."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    base = _resolve(module, node, path.name == "__init__.py")
    found = set()
    for alias in node.names:
        if f"{base}.{alias.name}" in known:  # `from durable import codec` imports a module
            found.add(f"{base}.{alias.name}")
        elif base in known:
            found.add(base)
    return found


def _graph(*packages: str) -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in _sources(*packages)}
    known = set(paths)
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        if path.name == "__init__.py":
            continue  # a package's __init__ re-exports; importing a submodule runs it anyway
        deps: set[str] = set()
        for node in _module_level_imports(ast.parse(path.read_text())):
            deps |= _targets(module, path, node, known)
        graph[module] = {d for d in deps if d != module and d in paths and not _is_init(paths[d])}
    return graph


def _is_init(path: Path) -> bool:
    return path.name == "__init__.py"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in graph.get(node, ()):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_the_workers_modules() -> None:
    assert _cycles(_graph("workers")) == []


def test_files_and_functions_stay_small() -> None:
    too_big = []
    for path in _sources("durable", "workers"):
        text = path.read_text()
        name = path.relative_to(ROOT)
        if text.count("\n") > MAX_FILE_LINES:
            too_big.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_big.append(f"{name}:{node.lineno} {node.name}(): {length} lines")
    assert too_big == []


def test_durable_never_imports_workers_at_module_level() -> None:
    graph = _graph("durable", "workers")
    assert {
        m: sorted(d for d in deps if d.startswith("workers"))
        for m, deps in graph.items()
        if m.startswith("durable") and any(d.startswith("workers") for d in deps)
    } == {}
