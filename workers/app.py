"""The user's app in a worker process: importing its modules, the build id of its code,
the garbage collector tuned for it."""

from __future__ import annotations

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
    of the ``--app`` modules and of every module they imported from the same project (the
    folders the ``--app`` modules were found in, outside installed packages), so any change to
    code a workflow runs -- a helper module too, even a comment -- gets a new build id."""
    digest = hashlib.sha256()
    for name, path in _project_sources(modules):
        digest.update(name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _project_sources(modules: Sequence[Any]) -> list[tuple[str, Path]]:
    """``(module name, source file)`` of the loaded modules under the ``--app`` modules' roots."""
    roots = set()
    for module in modules:
        path = getattr(module, "__file__", None)
        if path:
            # /proj/shop/orders.py for shop.orders: the root is /proj
            roots.add(Path(path).resolve().parents[module.__name__.count(".")])
    # durable's own packages are the engine, not the app (an editable install may sit in the project).
    engine = {Path(codec.__file__).resolve().parents[1], Path(__file__).resolve().parent}
    found: dict[str, Path] = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) if module is not None else None
        if not path or not path.endswith(".py"):
            continue
        source = Path(path).resolve()
        installed = {"site-packages", "dist-packages"} & set(source.parts)
        ours = any(root in source.parents for root in roots) and not engine & set(source.parents)
        if not installed and ours and source.is_file():
            found[name] = source
    for module in modules:  # an --app module is always in (an __init__-less path, say)
        path = getattr(module, "__file__", None)
        if path:
            found[module.__name__] = Path(path).resolve()
    return sorted(found.items())
