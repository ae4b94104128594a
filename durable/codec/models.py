"""Pydantic models (v2) in payloads, when pydantic is installed (the ``pydantic`` extra).

A model instance is stored as its class name and what pydantic writes for it as JSON (by
alias, computed fields left out), and is rebuilt as pydantic reads that JSON
(``model_validate_json``), so its validators run on every decode, as a dataclass's
``__init__`` does, and aliases, strict models, ``datetime``/``UUID``/``Decimal``/enum fields
come back as they went. A model that would not come back is refused when it is encoded,
nothing written: one pydantic cannot rebuild from what it writes (a required field excluded
from serialization, a NaN float it writes as null...), and one holding a ``SecretStr`` or
``SecretBytes``, which pydantic writes as ``'**********'`` (the secret would be lost, silently).
Its class must be allowed like any other class a payload names
(:mod:`durable.codec.allowlist`). pydantic is never imported here: a value can only be a
model if the program imported pydantic already, so ``sys.modules`` is enough to tell.
"""

from __future__ import annotations

import json
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


class Unstorable(ValueError):
    """A model whose stored form would not rebuild it (the message says why)."""


def dump(obj: Any) -> Any:
    """The model's fields as pydantic writes them to JSON (what the payload stores).

    Raises:
        Unstorable: pydantic would not rebuild the model from them, or a secret would be lost.
    """
    cls = type(obj)
    if _may_hold_secrets(cls) and (where := _secret_at(obj.model_dump(mode="python", round_trip=True), "")):
        raise Unstorable(
            f"field {where!r} is a pydantic secret, which pydantic writes as '**********': the secret "
            "would be lost; pass a reference to it (a vault key) instead, or give the field a "
            "@field_serializer that returns the value"
        )
    values = obj.model_dump(mode="json", by_alias=True, round_trip=True)
    try:
        rebuilt = cls.model_validate_json(json.dumps(values), context=dict(DECODE_CONTEXT))
    except _pydantic().ValidationError as exc:
        raise Unstorable(
            f"pydantic cannot rebuild it from what it writes ({field_errors(exc)}): a required field "
            "excluded from serialization, a value its JSON form does not hold (NaN), or a validator "
            "refusing its own output; change the model"
        ) from None
    if rebuilt != obj:
        # A field typed Any (or dict[str, Any]) is JSON: a datetime in it came back a str.
        raise Unstorable(
            f"pydantic would rebuild it different from what it writes: {_difference(obj, rebuilt)}; give "
            "the field the type it holds (an Any field is stored as JSON, where datetime, Decimal, UUID "
            "and bytes become str, tuple and set become list)"
        )
    return values


def _difference(given: Any, rebuilt: Any, path: str = "") -> str:
    """Where ``rebuilt`` first differs from ``given`` (a model, a dict or a list, or a leaf), in words."""
    if is_model(given) and type(rebuilt) is type(given):
        for name in type(given).model_fields:
            a, b = getattr(given, name, None), getattr(rebuilt, name, None)
            if a != b:
                return _difference(a, b, f"{path}.{name}" if path else name)
    elif isinstance(given, dict) and isinstance(rebuilt, dict) and given.keys() == rebuilt.keys():
        for key in given:
            if given[key] != rebuilt[key]:
                return _difference(given[key], rebuilt[key], f"{path}.{key}" if path else str(key))
    elif isinstance(given, list) and isinstance(rebuilt, list) and len(given) == len(rebuilt):
        for i, (a, b) in enumerate(zip(given, rebuilt, strict=True)):
            if a != b:
                return _difference(a, b, f"{path}.{i}" if path else str(i))
    return f"field {path or '(root)'!r}: {type(given).__name__} {given!r:.60} comes back as {type(rebuilt).__name__} {rebuilt!r:.60}"


_secretive: dict[type, bool] = {}


def _may_hold_secrets(cls: type) -> bool:
    found = _secretive.get(cls)
    if found is None:
        # pydantic marks SecretStr/SecretBytes fields, nested models' included, as write-only.
        try:
            found = '"writeOnly": true' in json.dumps(cls.model_json_schema())  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - a schema pydantic cannot build: look at every instance
            found = True
        _secretive[cls] = found
    return found


def _secret_at(value: Any, path: str) -> str:
    """The path of the first pydantic secret in a model's python-mode dump (``""``: none)."""
    if isinstance(value, dict):
        return next(
            (p for k, v in value.items() if (p := _secret_at(v, f"{path}.{k}" if path else str(k)))), ""
        )
    if isinstance(value, list | tuple | set | frozenset):
        return next((p for i, v in enumerate(value) if (p := _secret_at(v, f"{path}[{i}]"))), "")
    secret = getattr(_pydantic().types, "_SecretBase", None)
    return path if secret is not None and isinstance(value, secret) else ""


def field_errors(exc: Any) -> str:
    """A pydantic ``ValidationError`` as ``field 'a.b': message`` items."""
    errors = exc.errors(include_url=False)
    items = [f"field {'.'.join(map(str, e['loc'])) or '(root)'!r}: {e['msg']}" for e in errors[:MAX_ERRORS]]
    more = f" (and {len(errors) - MAX_ERRORS} more)" if len(errors) > MAX_ERRORS else ""
    return "; ".join(items) + more


DECODE_CONTEXT = {"durable": "decode"}
"""The pydantic validation context of a model read back from a payload (a recorded argument, a
result): a validator whose verdict changes with time or the world ("must be in the future")
checks ``info.context`` and passes a value it accepted when it was written, which a replay
days later reads again (refused then, the run was blocked for good)."""


def validate(cls: type, values: Any, what: str, context: dict[str, Any] | None = None) -> Any:
    """The model pydantic reads from ``values`` as JSON (with validation ``context``); a
    validation error becomes a :class:`SerializationError` naming ``what`` and each offending field."""
    pydantic = _pydantic()
    try:
        return cls.model_validate_json(json.dumps(values), context=context)  # type: ignore[attr-defined]
    except pydantic.ValidationError as exc:
        name = f"{cls.__module__}.{cls.__qualname__}"
        raise SerializationError(f"{what}: invalid {name}: {field_errors(exc)}", type_name=name) from None
