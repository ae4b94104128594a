"""Decoding canonical msgpack back to payload values (the hook is undone by the caller).

Only allowed classes are built (see :mod:`durable.codec.allowlist`), every limit of
:mod:`durable.codec.limits` is enforced, and every failure is a
:class:`~durable.errors.SerializationError` with the reason, so a caller can set one bad
input aside and carry on.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta, timezone, tzinfo
from decimal import Decimal
from typing import Any, NoReturn
from uuid import UUID
from zoneinfo import ZoneInfo

import msgpack

from durable.errors import ApplicationError, SerializationError

from . import allowlist, limits, models
from .ext import (
    CONTAINER_EXTS,
    EXT_BIGINT,
    EXT_DATACLASS,
    EXT_DATE,
    EXT_DATETIME,
    EXT_DECIMAL,
    EXT_ENUM,
    EXT_EXCEPTION,
    EXT_FROZENSET,
    EXT_MODEL,
    EXT_SET,
    EXT_TIME,
    EXT_TIMEDELTA,
    EXT_TUPLE,
    EXT_UUID,
)


def _build_map(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    if len(pairs) > limits.MAX_HASH_COLLISIONS:
        limits.check_hashes([key for key, _ in pairs], "a dict")
    return dict(pairs)


def _unpackb(data: bytes) -> Any:
    return msgpack.unpackb(
        data,
        ext_hook=_ext_hook,
        raw=False,
        strict_map_key=False,
        use_list=True,
        object_pairs_hook=_build_map,
    )


def _no_ext(code: int, data: bytes) -> NoReturn:
    raise SerializationError(f"unexpected msgpack extension type {code} inside a scalar value")


def _scalar_body(data: bytes) -> Any:
    """Unpack the body of a scalar extension (datetime, ...), which never holds extensions."""
    return msgpack.unpackb(data, ext_hook=_no_ext, raw=False, use_list=True)


def _disallowed(kind: str, name: str, module: str) -> NoReturn:
    raise SerializationError(
        f"cannot decode {kind} <{name}>: its module {module!r} is not allowed to be decoded; "
        + allowlist.how_to_allow(module),
        type_name=name,
    )


def _missing(kind: str, name: str, module: str, loaded: bool) -> NoReturn:
    rest = name.removeprefix(module + ".")
    if module == "__main__":  # the script that wrote it: no other process has its classes
        hint = (
            "it was defined in the script that wrote it (__main__), which no other process can import: "
            "move the class to a module both the client and the worker import"
        )
    elif loaded and "." in rest:  # a package is loaded, the module under it is not
        hint = (
            f"module {name.rsplit('.', 1)[0]!r} is not loaded (package {module!r} has no "
            f"{rest.split('.')[0]!r}): import it from the --app modules; if the class moved or was "
            f"renamed, keep a module {name.rsplit('.', 1)[0]!r} re-exporting it under its old name"
        )
    elif loaded:  # the module is there, the class is not: moved or renamed since it was recorded
        hint = (
            f"module {module!r} is loaded but has no {name.removeprefix(module + '.')!r}: if the class "
            f"moved or was renamed, keep it importable under its old name there (a re-export in {module!r})"
        )
    else:
        hint = (
            f"it is not loaded in this process; import the module defining it (probably {module!r}) "
            "before decoding (a class that moved: keep its old module, re-exporting it)"
        )
    raise SerializationError(f"cannot decode {kind} <{name}>: {hint}", type_name=name)


def _resolve(kind: str, name: str, base: type) -> type:
    found = allowlist.find(name)
    if found.cls is None:
        _missing(kind, name, found.module, found.loaded)
    if not (isinstance(found.cls, type) and issubclass(found.cls, base)):
        raise SerializationError(
            f"cannot decode <{name}>: it is not {'an' if kind == 'enum' else 'a'} {kind} here", type_name=name
        )
    if not allowlist.is_allowed(found.cls):
        _disallowed(kind, name, found.cls.__module__)  # where it is defined (a re-export: elsewhere)
    return found.cls


def _dec_bigint(data: bytes) -> int:
    if len(data) * 8 > limits.MAX_INT_BITS + 8:
        raise SerializationError(
            f"cannot decode int of {len(data)} bytes: over durable.codec.MAX_INT_BITS ({limits.MAX_INT_BITS})"
        )
    n = int.from_bytes(data, "big", signed=True)
    reason = limits.int_reason(n)
    if reason is not None:
        raise SerializationError(f"cannot decode payload: {reason}")
    return n


def _dec_tuple(data: bytes) -> tuple[Any, ...]:
    return tuple(_unpackb(data))


def _dec_set(data: bytes) -> set[Any]:
    items = _unpackb(data)
    limits.check_hashes(items, "a set")
    return set(items)


def _dec_frozenset(data: bytes) -> frozenset[Any]:
    items = _unpackb(data)
    limits.check_hashes(items, "a frozenset")
    return frozenset(items)


def _dec_tz(tz: Any) -> tzinfo | None:
    if tz is None:
        return None
    if isinstance(tz, str):
        try:
            return ZoneInfo(tz)
        except Exception as exc:
            raise SerializationError(f"cannot decode time zone {tz!r}: {exc}") from exc
    offset = timedelta(microseconds=tz[0])
    if offset == timedelta(0) and len(tz) == 1:
        return UTC
    return timezone(offset, tz[1]) if len(tz) > 1 else timezone(offset)


def _dec_datetime(data: bytes) -> datetime:
    y, mo, d, h, mi, s, us, fold, tz = _scalar_body(data)
    if tz is None:
        raise SerializationError("cannot decode a naive datetime (the encoder refuses them too)")
    return datetime(y, mo, d, h, mi, s, us, tzinfo=_dec_tz(tz), fold=fold)


def _dec_date(data: bytes) -> date:
    return date.fromordinal(_scalar_body(data))


def _dec_time(data: bytes) -> time:
    h, mi, s, us, fold, tz = _scalar_body(data)
    return time(h, mi, s, us, tzinfo=_dec_tz(tz), fold=fold)


def _dec_timedelta(data: bytes) -> timedelta:
    days, seconds, microseconds = _scalar_body(data)
    return timedelta(days=days, seconds=seconds, microseconds=microseconds)


def _dec_decimal(data: bytes) -> Decimal:
    if len(data) > limits.MAX_DECIMAL_DIGITS + 32:
        raise SerializationError(f"cannot decode a Decimal of {len(data)} characters")
    d = Decimal(data.decode("ascii"))
    reason = limits.decimal_reason(d)
    if reason is not None:
        raise SerializationError(f"cannot decode payload: {reason}")
    return d


def _dec_uuid(data: bytes) -> UUID:
    return UUID(bytes=data)


def _dec_dataclass(data: bytes) -> Any:
    name, values = _unpackb(data)
    cls = _resolve("dataclass", name, object)
    if not dataclasses.is_dataclass(cls):
        raise SerializationError(f"cannot decode <{name}>: it is not a dataclass here", type_name=name)
    if not isinstance(values, dict) or not all(isinstance(key, str) for key in values):
        raise SerializationError(f"cannot decode dataclass <{name}>: malformed field values", type_name=name)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise SerializationError(
            f"cannot decode dataclass <{name}>: it has no field(s) {', '.join(map(repr, unknown))}",
            type_name=name,
        )
    init = {key: value for key, value in values.items() if fields[key].init}
    try:
        # Through __init__, so its validation and __post_init__ run as for any other instance.
        obj = cls(**init)
    except Exception as exc:
        raise SerializationError(
            f"cannot decode dataclass <{name}>: {name}(...) raised {type(exc).__name__}: {exc}",
            type_name=name,
        ) from exc
    for key, value in values.items():
        if not fields[key].init:
            # A declared field that __init__ does not take: restore its recorded value.
            object.__setattr__(obj, key, value)
    return obj


def _dec_model(data: bytes) -> Any:
    name, values = _unpackb(data)
    cls = _resolve("pydantic model", name, object)
    if not models.is_model_class(cls):
        raise SerializationError(f"cannot decode <{name}>: it is not a pydantic model here", type_name=name)
    return models.validate(cls, values, f"cannot decode <{name}>", dict(models.DECODE_CONTEXT))


def _dec_enum(data: bytes) -> enum.Enum:
    name, value = _unpackb(data)
    cls = _resolve("enum", name, enum.Enum)
    try:
        return cls(value)
    except ValueError as exc:
        raise SerializationError(f"cannot decode <{name}>: {exc}", type_name=name) from exc


def _builtin_base(cls: type[BaseException]) -> type[BaseException]:
    for base in cls.__mro__:
        if base.__module__ == "builtins":
            return base
    return BaseException


def _rebuild(cls: type[BaseException], args: list[Any], attrs: dict[str, Any]) -> BaseException:
    """Rebuild an exception without calling the class's own ``__init__``.

    Its signature need not match ``args`` (``PaymentDeclined(code, message)`` passes only
    ``message`` up), and user code should not run on a payload's say-so: the nearest
    built-in base creates the instance from ``args`` and the recorded attributes are restored.
    """
    base = _builtin_base(cls)
    exc = base.__new__(cls, *args)
    base.__init__(exc, *args)
    vars(exc).update(attrs)
    return exc


def _exception_class(name: str) -> tuple[type[BaseException] | None, str]:
    """The class to rebuild, or ``None`` with the reason an ApplicationError stands in."""
    found = allowlist.find(name)
    cls = found.cls
    if cls is None or not issubclass(cls, BaseException):
        return None, ""
    if not issubclass(cls, Exception):
        return None, f"{name} is a BaseException that is not an Exception; it is never rebuilt from a payload"
    if not allowlist.is_allowed(cls):
        return None, f"{name} is not allowed to be decoded: " + allowlist.how_to_allow(found.module)
    return cls, ""


def _dec_exception(data: bytes) -> BaseException:
    body = _unpackb(data)
    name: str = body["type"]
    message: str = body["message"]
    tb: str = body["traceback"]
    cls, why = _exception_class(name)
    exc: BaseException | None = None
    if cls is not None:
        args = [_unpackb(arg) for arg in body["args"]]
        attrs = {
            k: _unpackb(v) for k, v in body["attrs"].items() if isinstance(k, str) and not k.startswith("__")
        }
        try:
            exc = _rebuild(cls, args, attrs)
        except Exception as error:
            why = f"{name} could not be rebuilt: {type(error).__name__}: {error}"
    if exc is None:
        exc = ApplicationError(message, type_name=name, traceback=tb)
        if why:
            exc.add_note(f"durable: decoded as ApplicationError because {why}")
    exc.__durable_traceback__ = tb  # type: ignore[attr-defined]
    if tb:  # printed with it (traceback.print_exception, pytest): where the remote code raised
        exc.add_note(f"durable: raised in another process, where its traceback was:\n{tb.rstrip()}")
    cause = None if body["cause"] is None else _unpackb(body["cause"])
    exc.__cause__ = cause if isinstance(cause, BaseException) else None
    return exc


_DECODERS: dict[int, Callable[[bytes], Any]] = {
    EXT_BIGINT: _dec_bigint,
    EXT_TUPLE: _dec_tuple,
    EXT_SET: _dec_set,
    EXT_FROZENSET: _dec_frozenset,
    EXT_DATETIME: _dec_datetime,
    EXT_DATE: _dec_date,
    EXT_TIME: _dec_time,
    EXT_TIMEDELTA: _dec_timedelta,
    EXT_DECIMAL: _dec_decimal,
    EXT_UUID: _dec_uuid,
    EXT_DATACLASS: _dec_dataclass,
    EXT_EXCEPTION: _dec_exception,
    EXT_ENUM: _dec_enum,
    EXT_MODEL: _dec_model,
}

_nesting = threading.local()  # .depth: nested extensions; .view: decoding for display

_NAMED = (EXT_DATACLASS, EXT_MODEL, EXT_ENUM)


def _shown(data: bytes) -> dict[str, Any]:
    """A dataclass, pydantic model or enum that cannot be built here (its class is not loaded, not
    allowed, or changed), for display: its type's name and its recorded fields (or value)."""
    name, values = _unpackb(data)
    if isinstance(values, dict) and all(isinstance(key, str) for key in values):
        return {"__type__": name, **values}
    return {"__type__": name, "value": values}


def _ext_hook(code: int, data: bytes) -> Any:
    dec = _DECODERS.get(code)
    if dec is None:
        raise SerializationError(f"cannot decode: unknown msgpack extension type {code}")
    depth: int = getattr(_nesting, "depth", 0)
    if code in CONTAINER_EXTS:
        # Each nested extension is a nested unpackb call on the C stack: stop before it overflows.
        if depth >= limits.MAX_DEPTH:
            raise SerializationError(f"cannot decode payload: {limits.depth_reason()}")
        _nesting.depth = depth + 1
    try:
        return dec(data)
    except SerializationError as exc:
        if exc.type_name and code in _NAMED and getattr(_nesting, "view", False):
            return _shown(data)
        raise
    except Exception as exc:
        raise SerializationError(f"cannot decode extension type {code}: {type(exc).__name__}: {exc}") from exc
    finally:
        _nesting.depth = depth


def decode(data: bytes, *, view: bool = False) -> Any:
    """Decode canonical msgpack (no hook) into a payload value.

    ``view``: for display (the CLI, the API): a dataclass, pydantic model or enum that cannot be
    built here comes out as ``{"__type__": "app.Receipt", <its fields>}`` (an enum's value under
    ``"value"``) instead of failing the whole payload.

    Raises:
        SerializationError: For any malformed, over-limit or disallowed input.
    """
    if view:
        _nesting.view = True
        try:
            return decode(data)
        finally:
            _nesting.view = False
    try:
        value = _unpackb(data)
        if len(data) > limits.MAX_DEPTH:  # each container takes a byte at least: short ones pass
            limits.check_depth(value)
    except SerializationError:
        raise
    except limits.TooDeep:
        raise SerializationError(f"cannot decode payload: {limits.depth_reason()}") from None
    except Exception as exc:
        detail = str(exc) or "the bytes are not valid msgpack"  # msgpack's FormatError says nothing
        raise SerializationError(f"cannot decode payload: {type(exc).__name__}: {detail}") from exc
    return value
