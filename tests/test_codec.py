"""Tests of the msgpack payload codec (no Redis)."""

from __future__ import annotations

import math
import os
import sys
import types
import zlib
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from enum import Enum, IntEnum
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo, available_timezones

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable import codec
from durable.errors import ApplicationError, SerializationError, error_text

# The classes below are payload types: allow them, as an app does for its own modules.
codec.allow_module(__name__)

# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Structural equality that also checks exact types (and treats nan as equal to nan)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, Decimal):
        return str(a) == str(b)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return len(a) == len(b) and all(
            same(ka, kb) and same(va, vb) for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True)
        )
    if isinstance(a, set | frozenset):
        return sorted(codec.dumps(x) for x in a) == sorted(codec.dumps(x) for x in b)
    if isinstance(a, datetime | time):
        return a == b and a.tzinfo == b.tzinfo and a.fold == b.fold and a.utcoffset() == b.utcoffset()
    return bool(a == b)


def roundtrip(value: Any) -> Any:
    data = codec.dumps(value)
    back = codec.loads(data)
    assert codec.dumps(back) == data
    return back


# --------------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------------

fixed_offsets = st.builds(
    timezone,
    st.timedeltas(min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59)),
)
zones = st.sampled_from(sorted(available_timezones()) or ["UTC"]).map(ZoneInfo)
tzinfos = st.one_of(st.just(UTC), fixed_offsets, zones)

hashable_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**64, max_value=2**200),
    st.integers(min_value=-(2**200), max_value=-(2**63) - 1),
    st.floats(allow_nan=False),
    st.text(max_size=10),
    st.binary(max_size=10),
    st.dates(),
    st.timedeltas(),
    st.decimals(allow_nan=False, allow_infinity=True),
    st.uuids(),
)
hashables = st.recursive(
    hashable_scalars,
    lambda inner: st.one_of(
        st.tuples(inner, inner),
        st.lists(inner, max_size=3).map(tuple),
        st.frozensets(inner, max_size=3),
    ),
    max_leaves=6,
)
scalars = st.one_of(
    hashable_scalars,
    st.floats(allow_nan=True, allow_infinity=True),
    st.datetimes(timezones=tzinfos),
    st.times(),
    st.times(timezones=st.one_of(st.just(UTC), fixed_offsets)),
    st.decimals(allow_nan=True, allow_infinity=True),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(hashables, inner, max_size=4),
        st.sets(hashables, max_size=4),
        st.frozensets(hashables, max_size=4),
    ),
    max_leaves=15,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_roundtrip_property(value: Any) -> None:
    data = codec.dumps(value)
    back = codec.loads(data)
    assert codec.dumps(back) == data
    assert same(back, value)


# --------------------------------------------------------------------------------------------
# Types
# --------------------------------------------------------------------------------------------


def test_exact_types_preserved() -> None:
    value = [
        None,
        True,
        False,
        0,
        1,
        2**64,
        -(2**64),
        2**300,
        1.0,
        -0.0,
        "s",
        b"b",
        [1, [2]],
        (1, (2,), []),
        (),
        {1, 2},
        frozenset({"a"}),
        {"a": 1, 2: "b", (1, 2): None, b"k": 3, frozenset({1}): 4},
        date(2024, 2, 29),
        timedelta(days=-3, microseconds=5),
        Decimal("1.10"),
        Decimal("-Infinity"),
        UUID("12345678-1234-5678-1234-567812345678"),
    ]
    back = roundtrip(value)
    assert same(back, value)
    assert [type(x) for x in back] == [type(x) for x in value]


def test_bool_distinct_from_int() -> None:
    assert codec.dumps(True) != codec.dumps(1)
    assert codec.loads(codec.dumps(True)) is True
    assert type(codec.loads(codec.dumps(1))) is int
    assert codec.dumps([1.0]) != codec.dumps([1])


def test_bytearray_comes_back_as_bytes() -> None:
    assert codec.loads(codec.dumps(bytearray(b"xy"))) == b"xy"


def test_datetimes_exact() -> None:
    paris = ZoneInfo("Europe/Paris")
    cases = [
        datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        datetime(2024, 6, 1, 12, 0, tzinfo=paris),
        datetime(2024, 10, 27, 2, 30, tzinfo=paris, fold=1),
        datetime(2024, 1, 1, tzinfo=timezone(timedelta(hours=5, minutes=30), "IST")),
        datetime(2024, 1, 1, tzinfo=timezone(timedelta(seconds=-7, microseconds=3))),
    ]
    for dt in cases:
        back = roundtrip(dt)
        assert same(back, dt)
        assert back.tzinfo == dt.tzinfo
        assert back.microsecond == dt.microsecond
    assert roundtrip(cases[0]).tzinfo is UTC
    assert roundtrip(cases[1]).tzinfo is paris
    assert same(roundtrip(time(1, 2, 3, 4)), time(1, 2, 3, 4))
    t = time(23, 59, tzinfo=paris)
    assert roundtrip(t).tzinfo is paris


def test_naive_datetime_rejected() -> None:
    with pytest.raises(SerializationError) as info:
        codec.dumps({"when": datetime(2024, 1, 1)}, path="result")
    msg = str(info.value)
    assert "<datetime.datetime>" in msg
    assert "result['when']" in msg
    assert "tzinfo" in msg
    assert info.value.path == "result['when']"
    assert info.value.type_name == "datetime.datetime"


def test_sets_are_canonical() -> None:
    a = set()
    b = set()
    items = [f"item-{i}" for i in range(50)] + list(range(50)) + [(1, "x"), b"raw"]
    for x in items:
        a.add(x)
    for x in reversed(items):
        b.add(x)
    assert codec.dumps(a) == codec.dumps(b)
    assert codec.dumps(frozenset(a)) == codec.dumps(frozenset(reversed(items)))
    assert codec.dumps(a) != codec.dumps(frozenset(a))
    assert codec.loads(codec.dumps(a)) == a


def test_dict_order_preserved() -> None:
    d = {"b": 1, "a": 2, 3: 3}
    back = roundtrip(d)
    assert list(back) == ["b", "a", 3]
    assert codec.dumps({"a": 1, "b": 2}) != codec.dumps({"b": 2, "a": 1})


class Color(Enum):
    RED = "red"
    BLUE = (1, 2)


class Level(IntEnum):
    LOW = 1


def test_enum_roundtrip() -> None:
    assert roundtrip([Color.RED, Color.BLUE, Level.LOW]) == [Color.RED, Color.BLUE, Level.LOW]
    assert roundtrip(Level.LOW) is Level.LOW


# --------------------------------------------------------------------------------------------
# Errors on encode / decode
# --------------------------------------------------------------------------------------------


class Opaque:
    pass


def test_error_path_for_nested_unsupported_value() -> None:
    with pytest.raises(SerializationError) as info:
        codec.dumps([1, {"when": [(0, Opaque())]}], path="args")
    msg = str(info.value)
    assert msg.startswith(f"cannot encode <{__name__}.Opaque> at args[1]['when'][0][1]:")
    assert info.value.path == "args[1]['when'][0][1]"
    assert info.value.type_name == f"{__name__}.Opaque"


@pytest.mark.parametrize(
    "bad",
    [lambda: None, (x for x in ()), object(), type("Str", (str,), {})("s"), complex(1, 2), Opaque],
)
def test_unsupported_types(bad: Any) -> None:
    with pytest.raises(SerializationError, match=r"cannot encode <.*> at value"):
        codec.dumps(bad)


def test_circular_reference() -> None:
    a: list[Any] = []
    a.append(a)
    with pytest.raises(SerializationError):
        codec.dumps(a)


@pytest.mark.parametrize("data", [b"\xc1", b"\x93\x01", b"\x01\x02", b"\xd4\x7f\x00", b"", b"\xd4\x0c\x00"])
def test_garbage_bytes(data: bytes) -> None:
    with pytest.raises(SerializationError):
        codec.loads(data)


# --------------------------------------------------------------------------------------------
# Dataclasses
# --------------------------------------------------------------------------------------------


@dataclass
class Point:
    x: int
    y: float
    tags: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Frozen:
    when: datetime
    points: list[Point]
    computed: int = field(init=False, default=7)


def test_dataclass_roundtrip() -> None:
    p = Point(1, 2.5, ("a", "b"), {"k": {1, 2}})
    assert roundtrip(p) == p
    f = Frozen(datetime(2024, 1, 1, tzinfo=UTC), [p, Point(0, 0.0)])
    back = roundtrip(f)
    assert back == f
    assert type(back.points[0].tags) is tuple
    assert back.computed == 7


def test_dataclass_field_error_path() -> None:
    with pytest.raises(SerializationError) as info:
        codec.dumps([Point(1, 2.0, meta={"bad": Opaque()})], path="args")
    assert info.value.path == "args[0].meta['bad']"


def test_dataclass_from_unloaded_module() -> None:
    mod = types.ModuleType("durable_test_ephemeral_mod")
    code = "from dataclasses import dataclass\n@dataclass\nclass Gone:\n    a: int\n"
    sys.modules[mod.__name__] = mod
    codec.allow_module(mod.__name__)
    try:
        exec(code, mod.__dict__)
        data = codec.dumps(mod.Gone(1))
        assert codec.loads(data) == mod.Gone(1)
    finally:
        del sys.modules[mod.__name__]
    with pytest.raises(SerializationError) as info:
        codec.loads(data)
    assert "durable_test_ephemeral_mod.Gone" in str(info.value)
    assert "import" in str(info.value)


def test_local_dataclass_rejected() -> None:
    @dataclass
    class Local:
        a: int

    with pytest.raises(SerializationError, match="module level"):
        codec.dumps(Local(1))


# --------------------------------------------------------------------------------------------
# Exceptions
# --------------------------------------------------------------------------------------------


class CustomError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message, code)
        self.code = code


class KwargsOnlyError(Exception):
    def __init__(self, *, reason: str) -> None:
        super().__init__(f"failed: {reason}")
        self.reason = reason


def _raise(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_builtin_exception_roundtrip() -> None:
    exc = _raise(ValueError("bad value", 3))
    back = codec.loads(codec.dumps(exc))
    assert type(back) is ValueError
    assert back.args == ("bad value", 3)
    assert "Traceback" in back.__durable_traceback__
    assert "_raise" in back.__durable_traceback__


def test_custom_exception_with_attributes() -> None:
    exc = _raise(CustomError("nope", 42))
    exc.extra = {"when": datetime(2024, 1, 1, tzinfo=UTC)}  # type: ignore[attr-defined]
    exc.unencodable = Opaque()  # type: ignore[attr-defined]
    exc._private = 1  # type: ignore[attr-defined]
    exc.__dunder__ = 2  # type: ignore[attr-defined]
    back = codec.loads(codec.dumps(exc))
    assert type(back) is CustomError
    assert back.code == 42
    assert back.extra == {"when": datetime(2024, 1, 1, tzinfo=UTC)}
    assert not hasattr(back, "unencodable")
    # Private state travels too: the class's __init__ does not run again to recreate it.
    assert back._private == 1
    assert not hasattr(back, "__dunder__")


def test_unencodable_exception_args_become_repr() -> None:
    back = codec.loads(codec.dumps(ValueError(Opaque(), 1)))
    assert type(back) is ValueError
    assert isinstance(back.args[0], str) and "Opaque" in back.args[0]
    assert back.args[1] == 1


def test_chained_cause() -> None:
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as exc:
        outer = exc
    back = codec.loads(codec.dumps(outer))
    assert type(back) is RuntimeError
    assert type(back.__cause__) is KeyError
    assert back.__cause__.args == ("inner",)
    assert "inner" in back.__cause__.__durable_traceback__


def test_exception_cycle_does_not_hang() -> None:
    a = ValueError("a")
    b = ValueError("b")
    a.__cause__ = b
    b.__cause__ = a
    back = codec.loads(codec.dumps(a))
    assert back.args == ("a",)
    assert back.__cause__.args == ("b",)


def test_exception_needing_kwargs_keeps_its_type() -> None:
    exc = _raise(KwargsOnlyError(reason="disk full"))
    exc.__cause__ = ValueError("root")
    back = codec.loads(codec.dumps(exc))
    assert type(back) is KwargsOnlyError
    assert back.reason == "disk full"
    assert str(back) == "failed: disk full"
    assert "KwargsOnlyError" in back.__durable_traceback__
    assert type(back.__cause__) is ValueError


def test_exception_from_unloaded_module_becomes_application_error() -> None:
    mod = types.ModuleType("durable_test_errors_mod")
    sys.modules[mod.__name__] = mod
    try:
        exec("class Boom(Exception):\n    pass\n", mod.__dict__)
        data = codec.dumps(mod.Boom("kaboom"))
    finally:
        del sys.modules[mod.__name__]
    back = codec.loads(data)
    assert type(back) is ApplicationError
    assert back.type_name == "durable_test_errors_mod.Boom"
    assert str(back) == "kaboom"


def test_durable_traceback_is_kept_on_reencode() -> None:
    back = codec.loads(codec.dumps(_raise(ValueError("x"))))
    again = codec.loads(codec.dumps(_raise(back)))
    assert again.__durable_traceback__ == back.__durable_traceback__


# --------------------------------------------------------------------------------------------
# Payload hook
# --------------------------------------------------------------------------------------------


class Zlib:
    def encode(self, data: bytes) -> bytes:
        return zlib.compress(data)

    def decode(self, data: bytes) -> bytes:
        return zlib.decompress(data)


class ToyXor:
    """A toy 'encryption': XOR with a keystream derived from a random nonce (not secure)."""

    key = b"secret-key"

    def _stream(self, nonce: bytes, n: int) -> bytes:
        seed = nonce + self.key
        return bytes(seed[i % len(seed)] ^ (i & 0xFF) for i in range(n))

    def encode(self, data: bytes) -> bytes:
        nonce = os.urandom(8)
        return nonce + bytes(a ^ b for a, b in zip(data, self._stream(nonce, len(data)), strict=True))

    def decode(self, data: bytes) -> bytes:
        nonce, body = data[:8], data[8:]
        return bytes(a ^ b for a, b in zip(body, self._stream(nonce, len(body)), strict=True))


@pytest.fixture
def hook_reset() -> Any:
    yield
    codec.set_payload_hook(None)


@pytest.mark.parametrize("hook", [Zlib(), ToyXor()])
def test_hook_roundtrip_and_canonical(hook: Any, hook_reset: Any) -> None:
    value = {"a": [1, 2, 3] * 20, "s": {3, 1, 2}, "when": datetime(2024, 1, 1, tzinfo=UTC)}
    plain = codec.dumps(value)
    codec.set_payload_hook(hook)
    assert codec.get_payload_hook() is hook
    one = codec.dumps(value)
    two = codec.dumps(dict(value))
    assert one != plain
    assert codec.loads(one) == value
    assert codec.canonical(one) == codec.canonical(two) == plain
    if isinstance(hook, ToyXor):
        assert one != two  # random nonce


def test_hook_decode_failure_is_serialization_error(hook_reset: Any) -> None:
    codec.set_payload_hook(Zlib())
    with pytest.raises(SerializationError):
        codec.loads(b"not zlib")


def test_canonical_without_hook_is_identity() -> None:
    data = codec.dumps([1, 2])
    assert codec.canonical(data) == data


# --------------------------------------------------------------------------------------------
# Plain pack / unpack
# --------------------------------------------------------------------------------------------


def test_pack_unpack_plain() -> None:
    env = {"type": "x", "ts": 123, "data": b"\x00\x01", 5: [None, True, 1.5], b"k": "v"}
    back = codec.unpack(codec.pack(env))
    assert back == env
    assert type(back["data"]) is bytes
    assert type(back[5]) is list
    assert codec.unpack(codec.pack((1, 2))) == [1, 2]


def test_pack_rejects_non_native() -> None:
    with pytest.raises(SerializationError):
        codec.pack({"x": Opaque()})
    with pytest.raises(SerializationError):
        codec.pack(2**70)


def test_unpack_rejects_ext_and_garbage() -> None:
    with pytest.raises(SerializationError):
        codec.unpack(codec.dumps((1, 2)))
    with pytest.raises(SerializationError):
        codec.unpack(b"\xc1")


def test_an_error_not_rebuilt_is_named_by_its_original_type() -> None:
    """``sys.exit(3)`` in ``handle()``: the run's failure reads ``SystemExit: 3``, not the stand-in's name."""
    decoded = codec.loads(codec.dumps(SystemExit(3)))
    assert isinstance(decoded, ApplicationError) and decoded.type_name == "builtins.SystemExit"
    assert error_text(decoded) == "SystemExit: 3"
    assert (
        error_text(ApplicationError("declined", type_name="shop.errors.Declined"))
        == "shop.errors.Declined: declined"
    )
    assert error_text(ApplicationError("plain")) == "ApplicationError: plain"
