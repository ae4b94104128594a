"""``@immutable``: a dataclass the type checker treats as frozen, as cheap to build as a plain one.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (its own
``__setattr__`` refuses): measured on Python 3.11, 4.2 µs to build one of 26 fields against
0.5 µs for a plain slotted one. A worker builds dozens of records per workflow step (history
events, tasks, commit plans, attempt outcomes); as frozen dataclasses their ``__init__`` took
7 % of a W2 worker's CPU (py-spy), and the worker's CPU per step fell by about an eighth
without them (``benchmarks/README.md``, "Wave 6, fifth session").

An ``@immutable`` class is frozen to the type checker (``dataclass_transform``'s
``frozen_default``: mypy refuses an assignment to a field) and hashes by its fields as a
frozen dataclass does, but is a plain dataclass at run time. The engine's records use it; a
user's own dataclass that must refuse mutation at run time stays ``@dataclass(frozen=True)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

T = TypeVar("T")


@overload
def immutable(cls: type[T], /) -> type[T]: ...


@overload
def immutable(*, slots: bool = True, kw_only: bool = False) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def immutable(cls: Any = None, /, *, slots: bool = True, kw_only: bool = False) -> Any:
    """Make ``cls`` a dataclass that type checkers treat as frozen and that hashes by its
    fields; slotted unless ``slots=False``; ``kw_only`` as for dataclasses."""

    def wrap(c: type[T]) -> type[T]:
        return dataclasses.dataclass(slots=slots, kw_only=kw_only, unsafe_hash=True)(c)

    return wrap if cls is None else wrap(cls)
