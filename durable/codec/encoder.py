"""Encoding payload values to canonical msgpack (the hook is applied by the caller)."""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import traceback
from collections.abc import Callable
from datetime import date, datetime, time, timedelta, timezone, tzinfo
from decimal import Decimal
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import msgpack

from durable.errors import SerializationError, message_of

from . import allowlist, limits, models
from .ext import (
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
    SUPPORTED,
    exception_attrs,
    type_name,
)


class EncodeFail(Exception):
    """Raised inside the default hook: ``obj`` cannot be encoded, for ``reason``."""

    def __init__(self, obj: object, reason: str) -> None:
        super().__init__(reason)
        self.obj = obj
        self.reason = reason


log = logging.getLogger("durable.codec")

_spare = threading.local()


def _packb(obj: Any) -> bytes:
    """Pack with a packer no outer pack is using (the default hook may nest): one of this
    thread's spares, taken while it packs (``msgpack.packb`` would build a packer per call,
    and a tuple in a workflow's arguments takes one per value). A failed pack resets it."""
    spares: list[msgpack.Packer] | None = getattr(_spare, "packers", None)
    if spares is None:
        spares = _spare.packers = []
    packer = spares.pop() if spares else _new_packer()
    try:
        packed: bytes = packer.pack(obj)
        return packed
    finally:
        spares.append(packer)


def _new_packer() -> msgpack.Packer:
    return msgpack.Packer(default=_default, strict_types=True, use_bin_type=True, autoreset=True)


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _enc_bigint(n: int) -> msgpack.ExtType:
    reason = limits.int_reason(n)
    if reason is not None:
        raise EncodeFail(n, reason)
    return msgpack.ExtType(EXT_BIGINT, n.to_bytes(n.bit_length() // 8 + 1, "big", signed=True))


def _enc_tuple(t: tuple[Any, ...]) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_TUPLE, _packb(list(t)))


def _sorted_items(s: set[Any] | frozenset[Any]) -> bytes:
    items = sorted(_packb(item) for item in s)
    return _array_header(len(items)) + b"".join(items)


def _enc_set(s: set[Any]) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_SET, _sorted_items(s))


def _enc_frozenset(s: frozenset[Any]) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_FROZENSET, _sorted_items(s))


def _enc_tz(tz: tzinfo | None, obj: object) -> Any:
    """Encode a tzinfo: ``None``, a zone key (str) or ``[offset_us]`` / ``[offset_us, name]``."""
    if tz is None:
        return None
    if type(tz) is timezone:
        args = tz.__getinitargs__()  # type: ignore[attr-defined]
        offset = args[0] // timedelta(microseconds=1)
        return [offset] if len(args) == 1 else [offset, args[1]]
    if type(tz) is ZoneInfo and tz.key is not None:
        return tz.key
    # Any other tzinfo (pytz, dateutil, ZoneInfo from a file): keep its fixed offset at obj.
    offset_td = obj.utcoffset() if isinstance(obj, datetime | time) else None
    if offset_td is None:
        raise EncodeFail(obj, f"tzinfo {type_name(type(tz))} gives no UTC offset here")
    return [offset_td // timedelta(microseconds=1)]


def _enc_datetime(dt: datetime) -> msgpack.ExtType:
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise EncodeFail(
            dt,
            "naive datetime: attach a tzinfo, e.g. dt.replace(tzinfo=datetime.timezone.utc) "
            "or datetime.now(datetime.timezone.utc)",
        )
    body = [dt.year, dt.month, dt.day, dt.hour, dt.minute, dt.second, dt.microsecond, dt.fold]
    body.append(_enc_tz(dt.tzinfo, dt))
    return msgpack.ExtType(EXT_DATETIME, _packb(body))


def _enc_date(d: date) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_DATE, _packb(d.toordinal()))


def _enc_time(t: time) -> msgpack.ExtType:
    body = [t.hour, t.minute, t.second, t.microsecond, t.fold, _enc_tz(t.tzinfo, t)]
    return msgpack.ExtType(EXT_TIME, _packb(body))


def _enc_timedelta(td: timedelta) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_TIMEDELTA, _packb([td.days, td.seconds, td.microseconds]))


def _enc_decimal(d: Decimal) -> msgpack.ExtType:
    reason = limits.decimal_reason(d)
    if reason is not None:
        raise EncodeFail(d, reason)
    return msgpack.ExtType(EXT_DECIMAL, str(d).encode("ascii"))


def _enc_uuid(u: UUID) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_UUID, u.bytes)


def _class_ref(obj: object) -> str:
    """The stored name of a dataclass, model or Enum member's class.

    With ``allowed_only`` (a client's start, signal, update, schedule arguments) a class the
    decoder would refuse is refused here, at the caller, with nothing written. Workers do not
    refuse: a payload they write is read back by a run that is then blocked, visibly and
    repairably (allow_module, then ``durable repair``), where an error here would fail it.
    """
    tp = type(obj)
    if "<locals>" in tp.__qualname__:
        raise EncodeFail(
            obj,
            "the class is defined inside a function, so it cannot be found when decoding; "
            "define it at module level",
        )
    if getattr(_tls, "allowed_only", False):
        refused = allowlist.refusal(tp)
        if refused is not None:
            raise EncodeFail(obj, refused)
        if tp.__module__ == "__main__" and tp not in _said_main:
            # Read back in this process (a TestEnvironment beside it), it works; a worker elsewhere
            # cannot import the script, and the run it starts is blocked. Said, not refused.
            _said_main.add(tp)
            log.warning(
                "%s is defined in the script being run (__main__): a worker in another process cannot "
                "import it, and a run given one cannot read it; move it to a module both import",
                type_name(tp),
            )
    return type_name(tp)


_said_main: set[type] = set()


def _enc_dataclass(obj: Any) -> msgpack.ExtType:
    name = _class_ref(obj)
    values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return msgpack.ExtType(EXT_DATACLASS, _packb([name, values]))


def _enc_model(obj: Any) -> msgpack.ExtType:
    name = _class_ref(obj)
    try:
        values = models.dump(obj)
    except models.Unstorable as exc:
        raise EncodeFail(obj, str(exc)) from None
    return msgpack.ExtType(EXT_MODEL, _packb([name, values]))


def _enc_enum(member: enum.Enum) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_ENUM, _packb([_class_ref(member), member.value]))


_active = threading.local()


def _try_pack(value: Any) -> bytes | None:
    try:
        return _packb(value)
    except Exception:
        return None


def _exc_traceback(exc: BaseException) -> str:
    remote = getattr(exc, "__durable_traceback__", None)
    if isinstance(remote, str) and remote:
        return remote
    if exc.__traceback__ is not None:
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, chain=False))
    return ""


def _exc_arg(arg: Any) -> bytes:
    packed = _try_pack(arg)
    if packed is not None:
        return packed
    try:
        return _packb(repr(arg))
    except Exception:
        return _packb(f"<{type_name(type(arg))}>")


def _exc_args(exc: BaseException) -> tuple[Any, ...]:
    if isinstance(exc, OSError) and exc.filename is not None and len(exc.args) == 2:
        # OSError keeps the file names outside args; passed back, they are set again.
        return (*exc.args, exc.filename, None, exc.filename2)
    return exc.args


def _exc_body(exc: BaseException) -> dict[str, Any]:
    attrs = {}
    for name, value in exception_attrs(exc):
        packed = _try_pack(value)
        if packed is not None:
            attrs[name] = packed
    cause = exc.__cause__
    return {
        "type": type_name(type(exc)),
        "message": message_of(exc),
        "args": [_exc_arg(arg) for arg in _exc_args(exc)],
        "traceback": _exc_traceback(exc),
        "cause": None if cause is None else _try_pack(cause),
        "attrs": attrs,
    }


def _enc_exception(exc: BaseException) -> msgpack.ExtType:
    # ``memo`` maps id(exc) -> ext for the exceptions encoded within the outermost one, so an
    # exception reachable twice (``__cause__`` and a ``cause`` attribute) is encoded once;
    # ``None`` marks one being encoded (a cycle).
    memo: dict[int, msgpack.ExtType | None] | None = getattr(_active, "memo", None)
    outermost = memo is None
    if memo is None:
        memo = _active.memo = {}
    try:
        key = id(exc)
        if key in memo:
            done = memo[key]
            if done is None:
                raise EncodeFail(exc, "circular reference between exceptions")
            return done
        memo[key] = None
        ext = msgpack.ExtType(EXT_EXCEPTION, _packb(_exc_body(exc)))
        memo[key] = ext
        return ext
    finally:
        if outermost:
            _active.memo = None


_ENCODERS: dict[type, Callable[[Any], msgpack.ExtType]] = {
    int: _enc_bigint,
    tuple: _enc_tuple,
    set: _enc_set,
    frozenset: _enc_frozenset,
    datetime: _enc_datetime,
    date: _enc_date,
    time: _enc_time,
    timedelta: _enc_timedelta,
    Decimal: _enc_decimal,
    UUID: _enc_uuid,
}


def _default(obj: Any) -> msgpack.ExtType:
    """msgpack ``default`` hook: everything that is not an exact msgpack native lands here."""
    enc = _ENCODERS.get(type(obj))
    if enc is not None:
        return enc(obj)
    if isinstance(obj, BaseException):
        return _enc_exception(obj)
    if isinstance(obj, enum.Enum):
        return _enc_enum(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _enc_dataclass(obj)
    if models.is_model(obj):
        return _enc_model(obj)
    raise EncodeFail(obj, f"unsupported type; the codec handles {SUPPORTED}")


_NATIVE_LEAVES = frozenset({type(None), bool, float, str, bytes, bytearray, memoryview})

Found = tuple[Any, str, str]
Children = list[tuple[Any, str]]


def _children(obj: Any, path: str) -> Children | None:
    """The members of a container value with their paths; ``None`` for anything else."""
    tp = type(obj)
    if tp in (list, tuple, set, frozenset):
        return [(item, f"{path}[{i}]") for i, item in enumerate(obj)]
    if tp is dict:
        found: Children = []
        for key, value in obj.items():
            found += [(key, f"{path} (dict key {key!r})"), (value, f"{path}[{key!r}]")]
        return found
    if isinstance(obj, BaseException):
        found = [(arg, f"{path}.args[{i}]") for i, arg in enumerate(obj.args)]
        found += [(value, f"{path}.{name}") for name, value in exception_attrs(obj)]
        return found + [(obj.__cause__, f"{path}.__cause__")]
    if isinstance(obj, enum.Enum):
        return [(obj.value, f"{path}.value")]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(getattr(obj, f.name), f"{path}.{f.name}") for f in dataclasses.fields(obj)]
    return None


def _find_too_deep(obj: Any, path: str, depth: int, seen: set[int]) -> Found | None:
    """Locate the first container nested deeper than the limit (never packs anything)."""
    if isinstance(obj, BaseException):
        if id(obj) in seen:
            return None
        seen.add(id(obj))
    children = _children(obj, path)
    if children is None:
        return None
    if depth >= limits.MAX_DEPTH:
        return obj, path, limits.depth_reason()
    for child, child_path in children:
        found = _find_too_deep(child, child_path, depth + 1, seen)
        if found:
            return found
    return None


def _find(obj: Any, path: str) -> Found | None:
    """Slow path: locate the first value under ``obj`` that cannot be encoded.

    Returns ``(value, path, reason)`` or ``None`` when everything encodes.
    """
    tp = type(obj)
    if tp in _NATIVE_LEAVES or (tp is int and -(2**63) <= obj < 2**64):
        return None
    children = None if isinstance(obj, BaseException) else _children(obj, path)
    if children is not None:
        if tp not in (list, tuple, set, frozenset, dict):
            try:
                _class_ref(obj)
            except EncodeFail as exc:
                return obj, path, exc.reason
        for child, child_path in children:
            found = _find(child, child_path)
            if found:
                return found
        return None
    try:
        _default(obj)
    except EncodeFail as exc:
        return exc.obj, path, exc.reason
    except Exception as exc:
        return obj, path, f"{type(exc).__name__}: {exc}"
    return None


def _encode_error(value: Any, path: str, exc: BaseException) -> SerializationError:
    if isinstance(exc, limits.HashFlood):
        found = (value, path, exc.reason)
    elif isinstance(exc, limits.TooDeep):
        found = _find_too_deep(value, path, 0, set()) or (value, path, limits.depth_reason())
    else:
        found = _find(value, path) or (
            (exc.obj, path, exc.reason)
            if isinstance(exc, EncodeFail)
            else (value, path, f"{type(exc).__name__}: {exc}")
        )
    obj, where, reason = found
    name = type_name(type(obj))
    return SerializationError(f"cannot encode <{name}> at {where}: {reason}", path=where, type_name=name)


_tls = threading.local()

_ENCODE_ERRORS = (
    EncodeFail,
    limits.TooDeep,
    limits.HashFlood,
    TypeError,
    ValueError,
    OverflowError,
    RecursionError,
)


def encode(value: Any, path: str, *, allowed_only: bool = False) -> bytes:
    """Encode ``value`` to canonical msgpack (no hook).

    Args:
        value: What to encode.
        path: Where it sits, for error messages (``args``, ``result``...).
        allowed_only: Refuse classes the decoder would refuse (see :func:`_class_ref`).

    Raises:
        SerializationError: Naming the offending value's type and path.
    """
    packer: msgpack.Packer | None = getattr(_tls, "packer", None)
    if packer is None:
        packer = _new_packer()
    _tls.packer = None  # taken: a re-entrant call (user __str__ calling dumps) gets its own
    outer = getattr(_tls, "allowed_only", False)
    _tls.allowed_only = allowed_only or outer
    try:
        # Checked before packing: msgpack recurses on the C stack and would crash first.
        limits.check_depth(value, hashes=True)
        return packer.pack(value)
    except _ENCODE_ERRORS as exc:
        raise _encode_error(value, path, exc) from None
    finally:
        _tls.packer = packer
        _tls.allowed_only = outer
