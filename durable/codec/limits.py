"""The limits every payload obeys, checked identically when encoding and when decoding.

They keep a hostile payload from crashing or stalling the process that decodes it: deep
nesting overflows the C stack (msgpack's unpacker uses about 40 KB of it per nested
extension value), a huge Decimal exponent makes ``int()`` run for minutes, a huge int
cannot even be printed, and many set elements or dict keys with one hash make building
the set quadratic.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Collection, Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from durable.errors import SerializationError

from .ext import exception_attrs

#: Containers (list, dict, tuple, set, frozenset, dataclass, Enum member, exception) a
#: payload may nest: 64 nested lists are accepted, 65 are refused.
MAX_DEPTH = 64
#: Largest int, in bits (about 2,466 decimal digits, under Python's 4,300-digit ``str()`` limit).
MAX_INT_BITS = 8192
#: Most digits a Decimal may have.
MAX_DECIMAL_DIGITS = 4300
#: Largest absolute exponent of a Decimal (``Decimal("1e6144")``): beyond it ``int()`` explodes.
MAX_DECIMAL_EXPONENT = 6144
#: How many elements of one set (or keys of one dict) may share a hash with another one.
MAX_HASH_COLLISIONS = 64

_LEAVES = frozenset(
    {
        type(None),
        bool,
        int,
        float,
        str,
        bytes,
        bytearray,
        memoryview,
        datetime,
        date,
        time,
        timedelta,
        Decimal,
        UUID,
    }
)
# Below this many members a container is scanned item by item; above, one C-speed pass over
# the members' types first skips containers holding only leaves.
_FAST_SCAN = 16


class TooDeep(Exception):
    """A value nests more than :data:`MAX_DEPTH` containers."""


class HashFlood(Exception):
    """A set or dict holds more than :data:`MAX_HASH_COLLISIONS` items whose hash collides."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def depth_reason() -> str:
    return (
        f"nesting deeper than {MAX_DEPTH} levels (the limit, durable.codec.MAX_DEPTH; a circular reference?)"
    )


def _groups(value: Any) -> tuple[Collection[Any], ...] | None:
    """The member collections of a container value; ``None`` for anything else."""
    tp = type(value)
    if tp is list or tp is tuple or tp is set or tp is frozenset:
        return (value,)
    if tp is dict:
        return (value.keys(), value.values())
    if isinstance(value, enum.Enum):
        return ((value.value,),)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return ([getattr(value, f.name) for f in dataclasses.fields(value)],)
    return None


def _exc_height(exc: BaseException, budget: int, memo: dict[int, int | None]) -> int:
    # The encoder writes an exception reachable twice once (its bytes are reused) and drops
    # a reference back to an exception being encoded; the height follows suit.
    key = id(exc)
    if key in memo:
        known = memo[key]
        if known is None:
            return 0
        if known > budget:
            raise TooDeep
        return known
    if budget <= 0:
        raise TooDeep
    memo[key] = None
    members: list[Any] = list(exc.args)
    members.extend(value for _, value in exception_attrs(exc))
    if exc.__cause__ is not None:
        members.append(exc.__cause__)
    height = 1 + _members_height((members,), budget - 1, memo)
    memo[key] = height
    return height


def _members_height(groups: tuple[Collection[Any], ...], budget: int, memo: dict[int, int | None]) -> int:
    best = 0
    for group in groups:
        if len(group) > _FAST_SCAN and _LEAVES.issuperset(map(type, group)):
            continue
        for item in group:
            if type(item) in _LEAVES:
                continue
            height = _height(item, budget, memo)
            if height > best:
                best = height
    return best


def _height(value: Any, budget: int, memo: dict[int, int | None]) -> int:
    """Containers on the longest path down from ``value``; :class:`TooDeep` beyond ``budget``."""
    tp = type(value)
    groups: tuple[Collection[Any], ...] | None
    if tp is list or tp is tuple:  # the common case first: no further checks
        groups = (value,)
    elif isinstance(value, BaseException):
        return _exc_height(value, budget, memo)
    else:
        groups = _groups(value)
        if groups is None:
            return 0
    if budget <= 0:
        raise TooDeep
    if _HASHES in memo and tp in _HASHED and len(value) > MAX_HASH_COLLISIONS:
        # The decoder refuses such a set or dict: refuse to write it.
        reason = collision_reason(list(groups[0]))
        if reason is not None:
            raise HashFlood(reason)
    return 1 + _members_height(groups, budget - 1, memo)


# A memo key no id() takes: present when the walk also checks set elements and dict keys.
_HASHES = -1
_HASHED = frozenset({set, frozenset, dict})


def check_depth(value: Any, *, hashes: bool = False) -> None:
    """Raise :class:`TooDeep` when ``value`` nests more than :data:`MAX_DEPTH` containers.

    With ``hashes``, also raise :class:`HashFlood` for a set or dict the decoder would refuse.
    """
    if type(value) not in _LEAVES:
        _height(value, MAX_DEPTH, {_HASHES: 1} if hashes else {})


def int_reason(n: int) -> str | None:
    """Why ``n`` is refused, or ``None``."""
    if n.bit_length() > MAX_INT_BITS:
        return (
            f"int of {n.bit_length()} bits exceeds the limit of {MAX_INT_BITS} (durable.codec.MAX_INT_BITS)"
        )
    return None


def decimal_reason(d: Decimal) -> str | None:
    """Why ``d`` is refused, or ``None``."""
    sign_digits_exp = d.as_tuple()
    digits = len(sign_digits_exp.digits)
    if digits > MAX_DECIMAL_DIGITS:
        return f"Decimal of {digits} digits exceeds the limit of {MAX_DECIMAL_DIGITS} (durable.codec.MAX_DECIMAL_DIGITS)"
    exponent = sign_digits_exp.exponent
    if isinstance(exponent, int) and abs(exponent) > MAX_DECIMAL_EXPONENT:
        return (
            f"Decimal exponent {exponent} is beyond the limit of ±{MAX_DECIMAL_EXPONENT} "
            "(durable.codec.MAX_DECIMAL_EXPONENT)"
        )
    return None


def collision_reason(items: Sequence[Any]) -> str | None:
    """Why set elements or dict keys are refused (too many share a hash), or ``None``."""
    if len(items) <= MAX_HASH_COLLISIONS:
        return None
    # Hash values are ints below 2**61, which hash to themselves: this set cannot be flooded.
    collisions = len(items) - len(set(map(hash, items)))
    if collisions <= MAX_HASH_COLLISIONS:
        return None
    return (
        f"{collisions} of its {len(items)} items share a hash with another (more than "
        f"{MAX_HASH_COLLISIONS}, durable.codec.MAX_HASH_COLLISIONS; building it would take quadratic time)"
    )


def check_hashes(items: Sequence[Any], what: str) -> None:
    """Refuse set elements or dict keys crafted to share one hash (quadratic to insert).

    Raises:
        SerializationError: More than :data:`MAX_HASH_COLLISIONS` items collide.
    """
    reason = collision_reason(items)
    if reason is not None:
        raise SerializationError(f"cannot decode {what}: {reason}")
