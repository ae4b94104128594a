"""The user's app in a worker process: importing its modules, the build id of its code,
the garbage collector tuned for it."""

from __future__ import annotations

import ast
import gc
import hashlib
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from durable import codec, registry

__all__ = ["AUTO_BUILD_ID", "AUTO_SHAPE", "code_build_id", "load_app", "tune_gc"]


def app_path() -> None:
    """Put the current folder on ``sys.path``, where ``--app`` modules are looked for."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def missing_app(modules: Iterable[str]) -> str | None:
    """The first of ``modules`` Python cannot find at all (a typo, the wrong folder), without
    importing any: a worker says so before it starts an embedded Redis it would not use."""
    app_path()
    for name in modules:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):  # its parent package is missing; a name like ".x"
            return name
    return None


def load_app(modules: Iterable[str]) -> list[Any]:
    """Import the user's modules (``--app``); their workflows and activities register themselves."""
    loaded = []
    app_path()
    for name in modules:
        module = importlib.import_module(name)
        # Payloads may name the app's own types (dataclasses, enums, exceptions): allow them.
        codec.allow_module(name)
        registry.register_module_functions(module)
        loaded.append(module)
    return loaded


def tune_gc(threshold: int) -> None:
    """Set up the garbage collector for a worker process (call once its app is imported).

    A worker keeps thousands of live objects per cached run (suspended greenlets,
    their frames, replay state) and allocates many short-lived ones per decision.
    With Python's default (a young-generation pass every 700 allocations) the
    collector kept scanning them: measured on 2 cores, W2 eager rose from about
    7,400 to 8,600 steps/s with ``threshold`` 10,000. ``gc.freeze()`` moves what
    the imports built into a generation no pass scans. Cycles are still
    collected, only in larger batches.
    """
    gc.freeze()
    _, second, third = gc.get_threshold()
    gc.set_threshold(threshold, second, third)


AUTO_BUILD_ID = "auto"
"""``--build-id auto``: the build id is :func:`code_build_id` of the ``--app`` modules."""

AUTO_SHAPE = re.compile(r"[0-9a-f]{12}")
"""What a :func:`code_build_id` looks like."""


def code_build_id(modules: Sequence[Any]) -> str:
    """A build id derived from the app's code (``--build-id auto``): a hash of the source files
    of the ``--app`` modules and of every module of the same project (the folders the ``--app``
    modules were found in, outside installed packages) they import -- at their top, or inside a
    function (a lazy import, the usual way around an import cycle), found by reading their
    sources -- so any change to code a workflow runs -- a helper module too, even a comment --
    gets a new build id. A module imported by a name computed at run time
    (``importlib.import_module(name)``) is not seen unless it is loaded at start."""
    digest = hashlib.sha256()
    for name, path in _project_sources(modules):
        digest.update(name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _project_sources(modules: Sequence[Any]) -> list[tuple[str, Path]]:
    """``(module name, source file)`` of the project's modules the ``--app`` modules use: those
    loaded under the ``--app`` modules' roots, and those their sources import (transitively)."""
    roots = set()
    for module in modules:
        path = getattr(module, "__file__", None)
        if path:
            # /proj/shop/orders.py for shop.orders: the root is /proj
            roots.add(Path(path).resolve().parents[module.__name__.count(".")])
    found: dict[str, Path] = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) if module is not None else None
        if path and path.endswith(".py") and _ours(Path(path).resolve(), roots):
            found[name] = Path(path).resolve()
    for module in modules:  # an --app module is always in (an __init__-less path, say)
        path = getattr(module, "__file__", None)
        if path:
            found[module.__name__] = Path(path).resolve()
    todo = list(found.items())
    while todo:
        name, path = todo.pop()
        for imported in _imported_names(name, path):
            source = _source_of(imported, roots)
            if source is not None and imported not in found:
                found[imported] = source
                todo.append((imported, source))
    return sorted(found.items())


def _ours(source: Path, roots: set[Path]) -> bool:
    """Whether ``source`` is the project's: under a root, not installed, not durable's own (an
    editable install of durable may sit in the project: it is the engine, not the app)."""
    engine = {Path(codec.__file__).resolve().parents[1], Path(__file__).resolve().parent}
    installed = {"site-packages", "dist-packages"} & set(source.parts)
    under = any(root in source.parents for root in roots)
    return under and not installed and not engine & set(source.parents) and source.is_file()


def _imported_names(name: str, path: Path) -> set[str]:
    """The absolute module names the source of module ``name`` imports anywhere in it (for
    ``from a import b``: ``a`` and ``a.b``, which may be a module); an unreadable source, none."""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                if node.level - 1 > len(parts):
                    continue
                base = ".".join(
                    parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else [])
                )
            else:
                base = node.module or ""
            if base:
                names.add(base)
            names.update(f"{base}.{alias.name}" if base else alias.name for alias in node.names)
    return names


def _source_of(name: str, roots: set[Path]) -> Path | None:
    """The project source file of module ``name`` under one of ``roots``, without importing it."""
    relative = Path(*name.split("."))
    for root in sorted(roots):
        for candidate in (root / relative.with_suffix(".py"), root / relative / "__init__.py"):
            if candidate.is_file() and _ours(candidate.resolve(), roots):
                return candidate.resolve()
    return None
