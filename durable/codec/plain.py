"""Plain msgpack for internal envelopes (history entries, task records): no extension types, no hook."""

from __future__ import annotations

import threading
from typing import Any, NoReturn

import msgpack

from durable.errors import SerializationError


def _no_ext(code: int, data: bytes) -> NoReturn:
    raise SerializationError(f"unexpected msgpack extension type {code} in an internal envelope")


_local = threading.local()


def packer(use_bin_type: bool = True) -> msgpack.Packer:
    """This thread's reusable packer (``msgpack.packb`` builds one per call, and a worker
    packs several envelopes per workflow step). Safe to reuse: without a ``default`` hook
    a pack runs no Python code, so it cannot be re-entered, and a failed pack resets it."""
    name = "bin" if use_bin_type else "raw"
    found: msgpack.Packer | None = getattr(_local, name, None)
    if found is None:
        found = msgpack.Packer(use_bin_type=use_bin_type)
        setattr(_local, name, found)
    return found


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
        packed: bytes = packer().pack(obj)
        return packed
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
