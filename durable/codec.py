"""The msgpack payload codec.

Every user payload (workflow and activity arguments, results, signal payloads,
side-effect values, errors) goes through :func:`dumps` / :func:`loads`. Internal
envelopes (history entries, task records) use the plain :func:`pack` /
:func:`unpack`, which know only msgpack's native types.

Besides msgpack's natives (``None``, ``bool``, ``int``, ``float``, ``str``,
``bytes``, ``list``, ``dict``) the payload codec encodes, as msgpack extension
types: ints beyond 64 bits, ``tuple``, ``set``, ``frozenset``, timezone-aware
``datetime``, ``date``, ``time``, ``timedelta``, ``Decimal``, ``UUID``, ``Enum``
members, dataclass instances and exceptions. Types are preserved exactly (a
tuple comes back as a tuple, ``True`` stays distinct from ``1``), with one
exception: ``bytearray`` and ``memoryview`` are packed natively by msgpack and
come back as ``bytes``.

The encoding is canonical where Python equality allows it: sets and frozensets
are sorted by the bytes of their encoded elements, so equal sets encode to
identical bytes. Dict insertion order is kept. Replay compares recorded and
newly issued commands by these bytes (see :func:`canonical`).

A byte-level :class:`PayloadHook` (encryption, compression) can be installed
with :func:`set_payload_hook`; it wraps the output of :func:`dumps` only.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import threading
import traceback
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta, timezone, tzinfo
from decimal import Decimal
from typing import Any, NoReturn, Protocol
from uuid import UUID
from zoneinfo import ZoneInfo

import msgpack

from durable.errors import ApplicationError, SerializationError

__all__ = [
    "PayloadHook",
    "canonical",
    "dumps",
    "get_payload_hook",
    "loads",
    "pack",
    "set_payload_hook",
    "unpack",
]


class PayloadHook(Protocol):
    """A byte-level transform applied to every encoded payload (encryption, compression).

    ``decode(encode(data)) == data`` must hold. ``encode`` need not be
    deterministic (a random nonce is fine): replay compares payloads through
    :func:`canonical`, which undoes the hook.
    """

    def encode(self, data: bytes) -> bytes:
        """Transform canonical msgpack bytes into stored bytes."""
        ...

    def decode(self, data: bytes) -> bytes:
        """Invert :meth:`encode`."""
        ...


_hook: PayloadHook | None = None


def set_payload_hook(hook: PayloadHook | None) -> None:
    """Install (or, with ``None``, remove) the process-wide payload hook.

    Args:
        hook: An object with ``encode(bytes) -> bytes`` and ``decode(bytes) -> bytes``.
            Every process that reads payloads written with a hook needs the same hook.
    """
    global _hook
    _hook = hook


def get_payload_hook() -> PayloadHook | None:
    """Return the installed payload hook, or ``None``."""
    return _hook


# --------------------------------------------------------------------------------------------
# Extension type codes. Never renumber: they are stored in histories.
# --------------------------------------------------------------------------------------------
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

_MAX_DEPTH = 256

_SUPPORTED = (
    "None, bool, int, float, str, bytes, list, dict, tuple, set, frozenset, timezone-aware "
    "datetime, date, time, timedelta, Decimal, UUID, Enum members, dataclass instances and exceptions"
)


class _EncodeFail(Exception):
    """Raised inside the default hook: ``obj`` cannot be encoded, for ``reason``."""

    def __init__(self, obj: object, reason: str) -> None:
        super().__init__(reason)
        self.obj = obj
        self.reason = reason


def _type_name(tp: type) -> str:
    return f"{tp.__module__}.{tp.__qualname__}"


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------


def _packb(obj: Any) -> bytes:
    """Pack with a fresh packer (safe inside the default hook, which may nest)."""
    return msgpack.packb(obj, default=_default, strict_types=True, use_bin_type=True)


def _new_packer() -> msgpack.Packer:
    return msgpack.Packer(default=_default, strict_types=True, use_bin_type=True, autoreset=True)


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _enc_bigint(n: int) -> msgpack.ExtType:
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
        raise _EncodeFail(obj, f"tzinfo {_type_name(type(tz))} gives no UTC offset here")
    return [offset_td // timedelta(microseconds=1)]


def _enc_datetime(dt: datetime) -> msgpack.ExtType:
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise _EncodeFail(
            dt,
            "naive datetime: attach a tzinfo, e.g. dt.replace(tzinfo=datetime.timezone.utc) "
            "or datetime.now(datetime.timezone.utc)",
        )
    body = [
        dt.year,
        dt.month,
        dt.day,
        dt.hour,
        dt.minute,
        dt.second,
        dt.microsecond,
        dt.fold,
        _enc_tz(dt.tzinfo, dt),
    ]
    return msgpack.ExtType(EXT_DATETIME, _packb(body))


def _enc_date(d: date) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_DATE, _packb(d.toordinal()))


def _enc_time(t: time) -> msgpack.ExtType:
    body = [t.hour, t.minute, t.second, t.microsecond, t.fold, _enc_tz(t.tzinfo, t)]
    return msgpack.ExtType(EXT_TIME, _packb(body))


def _enc_timedelta(td: timedelta) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_TIMEDELTA, _packb([td.days, td.seconds, td.microseconds]))


def _enc_decimal(d: Decimal) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_DECIMAL, str(d).encode("ascii"))


def _enc_uuid(u: UUID) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_UUID, u.bytes)


def _class_ref(obj: object) -> str:
    tp = type(obj)
    if "<locals>" in tp.__qualname__:
        raise _EncodeFail(
            obj,
            "the class is defined inside a function, so it cannot be found when decoding; "
            "define it at module level",
        )
    return _type_name(tp)


def _enc_dataclass(obj: Any) -> msgpack.ExtType:
    name = _class_ref(obj)
    values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return msgpack.ExtType(EXT_DATACLASS, _packb([name, values]))


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
                raise _EncodeFail(exc, "circular reference between exceptions")
            return done
        memo[key] = None
        try:
            message = str(exc)
        except Exception:
            message = repr(exc)
        args = []
        for arg in exc.args:
            packed = _try_pack(arg)
            if packed is None:
                try:
                    packed = _packb(repr(arg))
                except Exception:
                    packed = _packb(f"<{_type_name(type(arg))}>")
            args.append(packed)
        attrs = {}
        try:
            items = list(vars(exc).items())
        except TypeError:
            items = []
        for name, value in items:
            if isinstance(name, str) and not name.startswith("_"):
                packed = _try_pack(value)
                if packed is not None:
                    attrs[name] = packed
        cause = exc.__cause__
        body = {
            "type": _type_name(type(exc)),
            "message": message,
            "args": args,
            "traceback": _exc_traceback(exc),
            "cause": None if cause is None else _try_pack(cause),
            "attrs": attrs,
        }
        ext = msgpack.ExtType(EXT_EXCEPTION, _packb(body))
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
    raise _EncodeFail(obj, f"unsupported type; the codec handles {_SUPPORTED}")


_NATIVE_LEAVES = frozenset({type(None), bool, int, float, str, bytes, bytearray, memoryview})


def _find(obj: Any, path: str, depth: int) -> tuple[Any, str, str] | None:
    """Slow path: locate the first value under ``obj`` that cannot be encoded.

    Returns ``(value, path, reason)`` or ``None`` when everything encodes.
    """
    if depth > _MAX_DEPTH:
        return obj, path, f"nesting deeper than {_MAX_DEPTH} levels (a circular reference?)"
    tp = type(obj)
    if tp in _NATIVE_LEAVES:
        return None
    if tp in (list, tuple, set, frozenset):
        for i, item in enumerate(obj):
            found = _find(item, f"{path}[{i}]", depth + 1)
            if found:
                return found
        return None
    if tp is dict:
        for key, value in obj.items():
            found = _find(key, f"{path} (dict key {key!r})", depth + 1) or _find(
                value, f"{path}[{key!r}]", depth + 1
            )
            if found:
                return found
        return None
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type) and not isinstance(obj, BaseException):
        try:
            _class_ref(obj)
        except _EncodeFail as exc:
            return obj, path, exc.reason
        for f in dataclasses.fields(obj):
            found = _find(getattr(obj, f.name), f"{path}.{f.name}", depth + 1)
            if found:
                return found
        return None
    if isinstance(obj, enum.Enum) and not isinstance(obj, BaseException):
        try:
            _class_ref(obj)
        except _EncodeFail as exc:
            return obj, path, exc.reason
        return _find(obj.value, f"{path}.value", depth + 1)
    try:
        _default(obj)
    except _EncodeFail as exc:
        return exc.obj, path, exc.reason
    except RecursionError:
        return obj, path, "nesting too deep (a circular reference?)"
    except Exception as exc:
        return obj, path, f"{type(exc).__name__}: {exc}"
    return None


def _encode_error(value: Any, path: str, exc: BaseException) -> SerializationError:
    found = _find(value, path, 0)
    if found is None:
        if isinstance(exc, _EncodeFail):
            found = (exc.obj, path, exc.reason)
        else:
            found = (value, path, f"{type(exc).__name__}: {exc}")
    obj, where, reason = found
    type_name = _type_name(type(obj))
    return SerializationError(
        f"cannot encode <{type_name}> at {where}: {reason}", path=where, type_name=type_name
    )


_tls = threading.local()

_ENCODE_ERRORS = (_EncodeFail, TypeError, ValueError, OverflowError, RecursionError)


def _encode(value: Any, path: str) -> bytes:
    packer: msgpack.Packer | None = getattr(_tls, "packer", None)
    if packer is None:
        packer = _new_packer()
    _tls.packer = None  # taken: a re-entrant call (user __str__ calling dumps) gets its own
    try:
        return packer.pack(value)
    except _ENCODE_ERRORS as exc:
        raise _encode_error(value, path, exc) from None
    finally:
        _tls.packer = packer


def dumps(value: Any, *, path: str = "value") -> bytes:
    """Encode a payload: canonical msgpack, then the payload hook (if installed).

    Args:
        value: The value to encode (see the module docstring for the supported types).
        path: The name of the value's root in error messages, e.g. ``"args"`` or ``"result"``.

    Returns:
        The stored bytes.

    Raises:
        SerializationError: A value cannot be encoded; the message names its type and where it
            sits, e.g. ``cannot encode <app.Foo> at args[1]['when']: ...``.
    """
    data = _encode(value, path)
    hook = _hook
    if hook is not None:
        return hook.encode(data)
    return data


def canonical(data: bytes) -> bytes:
    """Undo the payload hook only, returning the inner canonical msgpack bytes.

    Two equal values have equal canonical bytes even when the hook is not deterministic
    (encryption with a random nonce), so replay compares payloads with this.

    Args:
        data: Bytes produced by :func:`dumps`.

    Returns:
        The canonical msgpack encoding (``data`` itself when no hook is installed).

    Raises:
        SerializationError: The hook could not decode ``data``.
    """
    hook = _hook
    if hook is None:
        return data
    try:
        return hook.decode(data)
    except SerializationError:
        raise
    except Exception as exc:
        raise SerializationError(
            f"the payload hook could not decode {len(data)} bytes: {type(exc).__name__}: {exc}"
        ) from exc


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------


def _unpackb(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False, use_list=True)


def _lookup(name: str) -> Any:
    """Find ``module.QualName`` among loaded modules, without importing anything."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:i]))
        if module is None:
            continue
        obj: Any = module
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                return None
        return obj
    return None


def _missing(kind: str, name: str) -> NoReturn:
    module = name.rpartition(".")[0]
    raise SerializationError(
        f"cannot decode {kind} <{name}>: it is not loaded in this process; "
        f"import the module defining it (probably {module!r}) before decoding",
        type_name=name,
    )


def _dec_bigint(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)


def _dec_tuple(data: bytes) -> tuple[Any, ...]:
    return tuple(_unpackb(data))


def _dec_set(data: bytes) -> set[Any]:
    return set(_unpackb(data))


def _dec_frozenset(data: bytes) -> frozenset[Any]:
    return frozenset(_unpackb(data))


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
    y, mo, d, h, mi, s, us, fold, tz = _unpackb(data)
    return datetime(y, mo, d, h, mi, s, us, tzinfo=_dec_tz(tz), fold=fold)


def _dec_date(data: bytes) -> date:
    return date.fromordinal(_unpackb(data))


def _dec_time(data: bytes) -> time:
    h, mi, s, us, fold, tz = _unpackb(data)
    return time(h, mi, s, us, tzinfo=_dec_tz(tz), fold=fold)


def _dec_timedelta(data: bytes) -> timedelta:
    days, seconds, microseconds = _unpackb(data)
    return timedelta(days=days, seconds=seconds, microseconds=microseconds)


def _dec_decimal(data: bytes) -> Decimal:
    return Decimal(data.decode("ascii"))


def _dec_uuid(data: bytes) -> UUID:
    return UUID(bytes=data)


def _dec_dataclass(data: bytes) -> Any:
    name, values = _unpackb(data)
    cls = _lookup(name)
    if cls is None:
        _missing("dataclass", name)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise SerializationError(f"cannot decode <{name}>: it is not a dataclass here", type_name=name)
    obj = cls.__new__(cls)
    for key, value in values.items():
        object.__setattr__(obj, key, value)
    return obj


def _dec_enum(data: bytes) -> enum.Enum:
    name, value = _unpackb(data)
    cls = _lookup(name)
    if cls is None:
        _missing("enum", name)
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
        raise SerializationError(f"cannot decode <{name}>: it is not an Enum here", type_name=name)
    try:
        return cls(value)
    except ValueError as exc:
        raise SerializationError(f"cannot decode <{name}>: {exc}", type_name=name) from exc


def _dec_exception(data: bytes) -> BaseException:
    body = _unpackb(data)
    name: str = body["type"]
    message: str = body["message"]
    tb: str = body["traceback"]
    exc: BaseException | None = None
    cls = _lookup(name)
    if isinstance(cls, type) and issubclass(cls, BaseException):
        try:
            exc = cls(*[_unpackb(arg) for arg in body["args"]])
        except Exception:
            exc = None
        if exc is not None:
            for key, packed in body["attrs"].items():
                try:
                    setattr(exc, key, _unpackb(packed))
                except Exception:
                    pass
    if exc is None:
        exc = ApplicationError(message, type_name=name, traceback=tb)
    try:
        exc.__durable_traceback__ = tb  # type: ignore[attr-defined]
    except Exception:
        pass
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
}


def _ext_hook(code: int, data: bytes) -> Any:
    dec = _DECODERS.get(code)
    if dec is None:
        raise SerializationError(f"cannot decode: unknown msgpack extension type {code}")
    try:
        return dec(data)
    except SerializationError:
        raise
    except Exception as exc:
        raise SerializationError(f"cannot decode extension type {code}: {type(exc).__name__}: {exc}") from exc


def loads(data: bytes) -> Any:
    """Decode a payload written by :func:`dumps` (undo the hook, then unpack).

    Classes of dataclasses, enums and exceptions are looked up among the modules already
    loaded in this process; nothing is imported.

    Args:
        data: The stored bytes.

    Returns:
        The value, with its types preserved.

    Raises:
        SerializationError: The bytes are not a valid payload, use an unknown extension type,
            or name a dataclass or enum whose module is not loaded. (An exception whose class
            is not loaded decodes as :class:`~durable.errors.ApplicationError` instead.)
    """
    inner = canonical(data)
    try:
        return _unpackb(inner)
    except SerializationError:
        raise
    except Exception as exc:
        raise SerializationError(f"cannot decode payload: {type(exc).__name__}: {exc}") from exc


# --------------------------------------------------------------------------------------------
# Plain msgpack for internal envelopes
# --------------------------------------------------------------------------------------------


def _no_ext(code: int, data: bytes) -> NoReturn:
    raise SerializationError(f"unexpected msgpack extension type {code} in an internal envelope")


def pack(obj: Any) -> bytes:
    """Encode an internal envelope as plain msgpack (no extension types, no hook).

    Args:
        obj: Built from ``None``, ``bool``, ``int`` (64-bit), ``float``, ``str``, ``bytes``,
            ``list`` (tuples pack as lists) and ``dict``.

    Returns:
        The msgpack bytes.

    Raises:
        SerializationError: ``obj`` holds anything else.
    """
    try:
        return msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SerializationError(f"cannot pack internal envelope: {type(exc).__name__}: {exc}") from None


def unpack(data: bytes) -> Any:
    """Decode plain msgpack written by :func:`pack`.

    msgpack str comes back as ``str``, bin as ``bytes``, arrays as lists; map keys may be of
    any type.

    Raises:
        SerializationError: The bytes are not valid msgpack or hold an extension type.
    """
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True, ext_hook=_no_ext)
    except SerializationError:
        raise
    except Exception as exc:
        raise SerializationError(f"cannot unpack internal envelope: {type(exc).__name__}: {exc}") from exc
