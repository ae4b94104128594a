"""Which classes a payload may name: the decoder builds nothing else.

A payload names dataclasses, Enums and exceptions by ``module.QualName``. The decoder
finds the class among the modules already loaded (``sys.modules``; nothing is ever
imported) by reading module and class ``__dict__`` entries (so no lazy module
``__getattr__`` runs), and accepts it only when it is allowed:

* a class registered with :func:`register_type`;
* a class defined in an allowed module: durable's own (``durable.*``), a module that
  defines a registered workflow or activity, or a module given to :func:`allow_module`
  (with its submodules);
* a dataclass, model or Enum a registered workflow's or activity's handlers name in their
  parameter or return annotations, and those their fields name in turn, wherever they are
  defined (``shop/models.py`` beside ``shop/workflows.py``): the code that was loaded asks
  for them, so a payload of them is expected;
* an Enum or an exception (a subclass of ``Exception``) of the standard library.

A ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``,
``GreenletExit``) is never rebuilt: it would change the control flow of the code that
receives it.

The encoder applies the same rule (:func:`refusal`): a dataclass, model or Enum member of a
class that is not allowed is refused when written, not when some worker reads it. An
exception is written either way (a decoder that does not allow it gets an ``ApplicationError``).
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import threading
import typing
import weakref
from types import ModuleType
from typing import Any

from durable import registry

from .ext import type_name

_lock = threading.Lock()
_modules: set[str] = {"durable"}
_types: dict[str, type] = {}
# Positive lookups: name -> (the module it was found in, the class). Checked against
# sys.modules on use, so a module removed from sys.modules stops resolving.
_found: dict[str, tuple[ModuleType | None, type]] = {}
# Classes the encoder found allowed (see refusal): checked for every instance encoded, so
# remembered; weak, so a class that goes away is forgotten with it.
_allowed_seen: weakref.WeakSet[type] = weakref.WeakSet()


def allow_module(name: str) -> None:
    """Allow the payload types (dataclasses, Enums, exceptions) defined in module ``name``.

    Submodules are allowed with it: ``allow_module("shop")`` allows ``shop.models``. The
    modules defining registered workflows and activities are allowed without this; call it
    for a module that only defines the types your payloads use, e.g. ``allow_module("shop.models")``.

    Args:
        name: A module name (``"shop.models"``); the module need not be imported yet.
    """
    if not isinstance(name, str) or not name or name.startswith(".") or name.endswith("."):
        raise ValueError(f"allow_module needs a module name such as 'shop.models', not {name!r}")
    with _lock:
        _modules.add(name)
        _allowed_seen.clear()


def register_type(cls: type) -> type:
    """Allow one class (dataclass, Enum or exception) in payloads, wherever it is defined.

    Usable as a class decorator. The class must be defined at module level.

    Args:
        cls: The class.

    Returns:
        ``cls`` itself.
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_type needs a class, not {cls!r}")
    if "<locals>" in cls.__qualname__:
        raise ValueError(f"{type_name(cls)} is defined inside a function; define it at module level")
    with _lock:
        _types[type_name(cls)] = cls
        # A class registered under a name another class held before no longer is allowed.
        _allowed_seen.clear()
    return cls


def _registered_modules() -> set[str]:
    found = {cls.__module__ for cls in registry.workflows().values()}
    found.update(d.module or getattr(d.fn, "__module__", "") for d in registry.activities().values())
    found.discard("")
    return found


def _under(module: str, allowed: set[str]) -> bool:
    if module in allowed:
        return True
    parts = module.split(".")
    return any(".".join(parts[:i]) in allowed for i in range(1, len(parts)))


def _stdlib(module: str) -> bool:
    return module.partition(".")[0] in sys.stdlib_module_names


def module_allowed(module: str, *, stdlib: bool = False) -> bool:
    """Whether payload types of ``module`` may be built (``stdlib``: the standard library counts)."""
    if stdlib and _stdlib(module):
        return True
    return _under(module, _modules) or module in _registered_modules()


_named: tuple[tuple[int, int], set[type]] = ((-1, -1), set())


def _annotated() -> set[type]:
    """The classes the registered handlers' annotations name (see the module docstring),
    worked out again when a workflow or activity is registered."""
    global _named
    flows, acts = registry.workflows(), registry.activities()
    version = (len(flows), len(acts))
    if _named[0] != version:
        found: set[type] = set()
        for cls in flows.values():
            for attr in (
                "handle",
                *cls._signals.values(),
                *cls._queries.values(),
                *(u for u, _ in cls._updates.values()),
            ):
                _collect(getattr(cls, attr, None), found)
        for definition in acts.values():
            fn = definition.fn
            _collect(getattr(fn, "handle", None) if isinstance(fn, type) else fn, found)
        _named = (version, found)
    return _named[1]


def _collect(target: Any, found: set[type], depth: int = 0) -> None:
    """Add the payload classes ``target`` (a function or a type) names to ``found``."""
    if target is None or depth > 8:
        return
    if isinstance(target, type):
        if target in found or not (
            dataclasses.is_dataclass(target) or issubclass(target, enum.Enum) or _is_model(target)
        ):
            return
        found.add(target)
        if issubclass(target, enum.Enum):
            return
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - a forward reference not resolvable now: nothing named
        return
    for hint in hints.values():
        for tp in _types_in(hint):
            _collect(tp, found, depth + 1)


def _types_in(hint: Any) -> list[type]:
    if isinstance(hint, type):
        return [hint]
    return [tp for arg in typing.get_args(hint) for tp in _types_in(arg)]


def _is_model(tp: type) -> bool:
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and issubclass(tp, pydantic.BaseModel)


def is_allowed(cls: type) -> bool:
    """Whether the decoder builds instances of ``cls`` from payloads (see :mod:`~durable.codec.allowlist`);
    the encoder refuses a dataclass, model or Enum member of a class for which this is false.

    Args:
        cls: A dataclass, Enum or exception class.
    """
    if _types.get(type_name(cls)) is cls:
        return True
    stdlib = issubclass(cls, Exception | enum.Enum)
    return module_allowed(cls.__module__, stdlib=stdlib) or cls in _annotated()


def refusal(cls: type) -> str | None:
    """Why the decoder would refuse to build ``cls`` (``None``: it builds it), worded as the
    decoder words it: the encoder refuses such a value, so what is written can be read.

    Only "allowed" verdicts are remembered (until :func:`allow_module` or
    :func:`register_type` changes the lists): a module becomes allowed when it registers a
    workflow or activity, so a refusal is worked out anew each time -- it raises anyway. (A
    verdict remembered outlives a registration undone later, a test's mock: the decoder, which
    checks on its own, refuses then.)
    """
    if cls in _allowed_seen:
        return None
    if is_allowed(cls):
        _allowed_seen.add(cls)
        return None
    return f"its module {cls.__module__!r} is not allowed to be decoded; " + how_to_allow(cls.__module__)


class Resolution:
    """The outcome of looking a stored class name up: the class, or why there is none."""

    __slots__ = ("cls", "loaded", "module")

    def __init__(self, cls: type | None, module: str, *, loaded: bool) -> None:
        self.cls = cls
        self.module = module
        self.loaded = loaded


def _walk(module: ModuleType, qualname: str) -> Any:
    obj: Any = module
    for part in qualname.split("."):
        namespace = vars(obj) if isinstance(obj, ModuleType | type) else None
        if namespace is None:
            return None
        obj = namespace.get(part)
        if obj is None:
            return None
    return obj


def find(name: str) -> Resolution:
    """Find the class stored as ``name`` among loaded modules, without importing anything.

    A class the named module re-exports counts too (a class moved to another module, its
    old module importing it: payloads recorded before the move still name the old place);
    the decoder checks the class itself against the allowlist, wherever it is defined.
    """
    if name in _types:
        return Resolution(_types[name], name.rpartition(".")[0], loaded=True)
    cached = _found.get(name)
    if cached is not None:
        module_obj, cls = cached
        if sys.modules.get(cls.__module__) is module_obj:
            return Resolution(cls, cls.__module__, loaded=True)
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:i])
        module = sys.modules.get(module_name)
        if module is None:
            continue
        qualname = ".".join(parts[i:])
        obj = _walk(module, qualname)
        if isinstance(obj, type):
            if obj.__module__ == module_name and obj.__qualname__ == qualname:
                _found[name] = (module, obj)  # (a re-export is looked up each time: it may change)
            return Resolution(obj, module_name, loaded=True)
        return Resolution(None, module_name, loaded=True)
    return Resolution(None, name.rpartition(".")[0], loaded=False)


def how_to_allow(module: str) -> str:
    """The hint that ends a "not allowed" message."""
    return (
        f"allow it with durable.codec.allow_module({module!r}) or durable.codec.register_type(<the class>) "
        f"in every process that decodes it (the modules of registered workflows and activities are allowed)"
    )
