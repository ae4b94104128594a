"""Extension type codes and the helpers the encoder, the decoder and the limits share."""

from __future__ import annotations

from typing import Any

#: msgpack extension type codes. Never renumber: they are stored in histories.
EXT_BIGINT = 1
EXT_TUPLE = 2
EXT_SET = 3
EXT_FROZENSET = 4
EXT_DATETIME = 5
EXT_DATE = 6
EXT_TIME = 7
EXT_TIMEDELTA = 8
EXT_DECIMAL = 9
EXT_UUID = 10
EXT_DATACLASS = 11
EXT_EXCEPTION = 12
EXT_ENUM = 13
EXT_MODEL = 14

#: The extension types that hold further payload values (and so nest).
CONTAINER_EXTS = frozenset(
    {EXT_TUPLE, EXT_SET, EXT_FROZENSET, EXT_DATACLASS, EXT_EXCEPTION, EXT_ENUM, EXT_MODEL}
)

SUPPORTED = (
    "None, bool, int, float, str, bytes, list, dict, tuple, set, frozenset, timezone-aware "
    "datetime, date, time, timedelta, Decimal, UUID, Enum members, dataclass instances, pydantic models and exceptions"
)


def type_name(tp: type) -> str:
    """The stored name of a class: ``module.QualName``."""
    return f"{tp.__module__}.{tp.__qualname__}"


def exception_attrs(exc: BaseException) -> list[tuple[str, Any]]:
    """The instance attributes of ``exc`` the codec records (all but dunder names).

    Private ``_names`` are kept too: the decoder rebuilds the exception without calling
    its ``__init__``, so state the class keeps privately must travel with it.
    """
    try:
        items = list(vars(exc).items())
    except TypeError:
        return []
    return [(name, value) for name, value in items if isinstance(name, str) and not name.startswith("__")]
