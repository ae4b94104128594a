"""Pydantic models (v2) in payloads, when pydantic is installed (the ``pydantic`` extra).

A model instance is stored as its class name and ``model_dump(mode="json")`` and is
rebuilt with ``model_validate``, so its validators run on every decode, as a dataclass's
``__init__`` does. Its class must be allowed like any other class a payload names
(:mod:`durable.codec.allowlist`). pydantic is never imported here: a value can only be a
model if the program imported pydantic already, so ``sys.modules`` is enough to tell.
"""

from __future__ import annotations

import sys
from typing import Any

from ..errors import SerializationError

#: How many of a validation error's field errors a message quotes.
MAX_ERRORS = 5


def _pydantic() -> Any:
    return sys.modules.get("pydantic")


def is_model(obj: Any) -> bool:
    """Whether ``obj`` is a pydantic model instance."""
    pydantic = _pydantic()
    return pydantic is not None and isinstance(obj, pydantic.BaseModel)


def is_model_class(tp: Any) -> bool:
    """Whether ``tp`` is a pydantic model class."""
    pydantic = _pydantic()
    return pydantic is not None and isinstance(tp, type) and issubclass(tp, pydantic.BaseModel)


def dump(obj: Any) -> Any:
    """The model's JSON-compatible fields (what the payload stores)."""
    return obj.model_dump(mode="json")


def field_errors(exc: Any) -> str:
    """A pydantic ``ValidationError`` as ``field 'a.b': message`` items."""
    errors = exc.errors(include_url=False)
    items = [f"field {'.'.join(map(str, e['loc'])) or '(root)'!r}: {e['msg']}" for e in errors[:MAX_ERRORS]]
    more = f" (and {len(errors) - MAX_ERRORS} more)" if len(errors) > MAX_ERRORS else ""
    return "; ".join(items) + more


def validate(cls: type, values: Any, what: str) -> Any:
    """``cls.model_validate(values)``; a validation error becomes a :class:`SerializationError`
    naming ``what`` and each offending field."""
    pydantic = _pydantic()
    try:
        return cls.model_validate(values)  # type: ignore[attr-defined]
    except pydantic.ValidationError as exc:
        name = f"{cls.__module__}.{cls.__qualname__}"
        raise SerializationError(f"{what}: invalid {name}: {field_errors(exc)}", type_name=name) from None
