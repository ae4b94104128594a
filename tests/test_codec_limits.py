"""The codec's limits: nesting depth, int and Decimal size, hash flooding.

A crash (SIGSEGV from a C stack overflow) would kill the test run, so every case that
crashed before the limits existed runs in a subprocess and checks its exit status.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgpack
import pytest

from durable import codec
from durable.errors import SerializationError

codec.allow_module(__name__)

ROOT = Path(__file__).resolve().parent.parent
M61 = (1 << 61) - 1  # ints that differ by a multiple of this share a hash


def ext(code: int, body: bytes) -> bytes:
    return msgpack.packb(msgpack.ExtType(code, body))


def nested_tuples(levels: int, inner: bytes = b"\x01", lists_per_level: int = 0) -> bytes:
    """Bytes of ``levels`` nested tuples, each holding ``lists_per_level`` nested lists (crafted)."""
    data = inner
    for _ in range(levels):
        data = b"\x91" * lists_per_level + data
        data = ext(2, b"\x91" + data)
    return data


def run_isolated(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (from the repo root, so this worktree's durable)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def nest(levels: int, make: Any) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = make(value)
    return value


@dataclass
class Node:
    child: Any


# --------------------------------------------------------------------------------------------
# Depth
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda v: (v,),
        lambda v: [v],
        lambda v: {"k": v},
        lambda v: Node(v),
        lambda v: [v] if isinstance(v, tuple) else (v,),
    ],
    ids=["tuple", "list", "dict", "dataclass", "mixed"],
)
def test_depth_limit_is_the_same_in_encoder_and_decoder(make: Any) -> None:
    ok = nest(codec.MAX_DEPTH, make)
    assert codec.loads(codec.dumps(ok)) == ok
    with pytest.raises(SerializationError, match=r"nesting deeper than 64 levels .*MAX_DEPTH") as info:
        codec.dumps(nest(codec.MAX_DEPTH + 1, make), path="args")
    assert info.value.path.startswith("args")


def test_depth_error_names_the_path() -> None:
    with pytest.raises(SerializationError) as info:
        codec.dumps({"a": nest(codec.MAX_DEPTH, lambda v: [v])}, path="result")
    assert info.value.path == "result['a']" + "[0]" * (codec.MAX_DEPTH - 1)
    assert info.value.type_name == "builtins.list"


def test_decoder_refuses_what_the_encoder_refuses() -> None:
    # 65 levels that msgpack alone would decode: natives inside one extension.
    crafted = ext(2, msgpack.packb([nest(codec.MAX_DEPTH, lambda v: [v])]))
    with pytest.raises(SerializationError, match="nesting deeper than 64 levels"):
        codec.loads(crafted)
    assert codec.loads(nested_tuples(codec.MAX_DEPTH)) == nest(codec.MAX_DEPTH, lambda v: (v,))
    with pytest.raises(SerializationError, match="nesting deeper than 64 levels"):
        codec.loads(nested_tuples(codec.MAX_DEPTH + 1))


def test_circular_structures_are_refused_by_the_depth_limit() -> None:
    a: list[Any] = []
    a.append(a)
    with pytest.raises(SerializationError, match="circular"):
        codec.dumps(a)
    node = Node(None)
    node.child = node
    with pytest.raises(SerializationError, match="nesting deeper"):
        codec.dumps(node)


def test_deep_payloads_do_not_crash_the_decoding_process() -> None:
    # Before the limit: SIGSEGV (C stack overflow in msgpack's unpacker at ~195 levels).
    proc = run_isolated(
        f"""
        import msgpack
        from durable import codec
        from durable.errors import SerializationError

        def ext(code, body):
            return msgpack.packb(msgpack.ExtType(code, body))

        data = b"\\x01"
        for _ in range(400):
            data = ext(2, b"\\x91" + data)
        chain = b"\\xc0"
        for _ in range(400):
            chain = ext(11, msgpack.packb(["{__name__}.Node", {{}}])[:-1] + b"\\x81\\xa5child" + chain)
        for payload in (data, chain):
            try:
                codec.loads(payload)
            except SerializationError as exc:
                print("refused:", exc)
        """
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("refused:") == 2
    assert "nesting deeper than 64 levels" in proc.stdout


def test_deep_values_do_not_crash_the_encoding_process() -> None:
    # Before the limit: 64 tuples each holding 500 nested lists crashed dumps (SIGSEGV).
    proc = run_isolated(
        """
        from durable import codec
        from durable.errors import SerializationError

        value = 1
        for _ in range(64):
            for _ in range(500):
                value = [value]
            value = (value,)
        try:
            codec.dumps(value)
        except SerializationError as exc:
            print("refused:", str(exc)[-120:])
        """
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused:" in proc.stdout and "nesting deeper than 64 levels" in proc.stdout


# --------------------------------------------------------------------------------------------
# Numbers
# --------------------------------------------------------------------------------------------


def test_decimal_exponent_is_capped_both_ways() -> None:
    limit = codec.MAX_DECIMAL_EXPONENT
    for fine in (Decimal(f"1e{limit}"), Decimal(f"-1e-{limit}"), Decimal("NaN"), Decimal("-Infinity")):
        assert str(codec.loads(codec.dumps(fine))) == str(fine)
    with pytest.raises(SerializationError, match=r"exponent 6145 is beyond the limit of ±6144"):
        codec.dumps({"x": Decimal(f"1e{limit + 1}")})
    start = time.monotonic()
    with pytest.raises(SerializationError, match="MAX_DECIMAL_EXPONENT"):
        codec.loads(ext(9, b"1e999999999"))  # 13 bytes; int() of it ran for minutes
    assert time.monotonic() - start < 1


def test_decimal_digits_are_capped() -> None:
    ok = Decimal("9" * codec.MAX_DECIMAL_DIGITS)
    assert codec.loads(codec.dumps(ok)) == ok
    with pytest.raises(SerializationError, match="MAX_DECIMAL_DIGITS"):
        codec.dumps(Decimal("9" * (codec.MAX_DECIMAL_DIGITS + 1)))
    with pytest.raises(SerializationError):
        codec.loads(ext(9, b"9" * 100_000))


def test_int_size_is_capped_both_ways() -> None:
    biggest = 2**codec.MAX_INT_BITS - 1
    assert codec.loads(codec.dumps([biggest, -biggest])) == [biggest, -biggest]
    repr(codec.loads(codec.dumps(biggest)))  # printable (Python refuses str() past 4300 digits)
    with pytest.raises(SerializationError, match=r"int of 8193 bits exceeds the limit of 8192"):
        codec.dumps(2**codec.MAX_INT_BITS)
    with pytest.raises(SerializationError, match="MAX_INT_BITS"):
        codec.loads(ext(1, b"\x01" + b"\x00" * 100_000))


# --------------------------------------------------------------------------------------------
# Hash flooding
# --------------------------------------------------------------------------------------------


def colliding_ints(n: int) -> list[int]:
    return [k * M61 for k in range(1, n + 1)]


@pytest.mark.parametrize("code", [3, 4], ids=["set", "frozenset"])
def test_set_of_colliding_hashes_is_refused_fast(code: int) -> None:
    items = b"".join(codec.dumps(i) for i in colliding_ints(30_000))
    payload = ext(code, b"\xdd" + (30_000).to_bytes(4, "big") + items)
    start = time.monotonic()
    with pytest.raises(SerializationError, match="share a hash"):
        codec.loads(payload)  # built as a set, this took minutes
    assert time.monotonic() - start < 2


def test_dict_with_colliding_keys_is_refused_fast() -> None:
    n = 30_000
    body = b"".join(codec.dumps(k) + b"\xc0" for k in colliding_ints(n))
    payload = b"\xdf" + n.to_bytes(4, "big") + body
    start = time.monotonic()
    with pytest.raises(SerializationError, match="share a hash"):
        codec.loads(payload)
    assert time.monotonic() - start < 2


def test_colliding_sets_are_refused_when_encoding_too() -> None:
    few = set(colliding_ints(codec.MAX_HASH_COLLISIONS))
    assert codec.loads(codec.dumps(few)) == few
    with pytest.raises(SerializationError, match="share a hash"):
        codec.dumps({"s": set(colliding_ints(200))})
    with pytest.raises(SerializationError, match="share a hash"):
        codec.dumps(dict.fromkeys(colliding_ints(200)))
    big = {str(i): i for i in range(10_000)}
    assert codec.loads(codec.dumps(big)) == big
