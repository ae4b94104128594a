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

A payload never chooses what code runs: the decoder builds only allowed classes
(:func:`allow_module`, :func:`register_type`; see :mod:`durable.codec.allowlist`) and
enforces the limits of :mod:`durable.codec.limits` (nesting depth, int and Decimal
size, hash collisions) exactly as the encoder does.

A byte-level :class:`PayloadHook` (encryption, compression) can be installed
with :func:`set_payload_hook`; it wraps the output of :func:`dumps` only.
:class:`KeyRing` is such a hook that encrypts with named keys (key id in the envelope,
rotation), e.g. with :class:`AesGcm`.

Modules: ``encoder`` and ``decoder`` (the two directions), ``allowlist`` (which classes
a payload may name), ``limits``, ``hooks`` (the payload hook), ``plain`` (envelopes),
``ext`` (extension type codes).
"""

from __future__ import annotations

from typing import Any

from .allowlist import allow_module, is_allowed, register_type
from .decoder import decode
from .encoder import encode
from .hooks import PayloadHook, apply, canonical, get_payload_hook, set_payload_hook
from .keyring import AesGcm, Cipher, KeyRing
from .limits import MAX_DECIMAL_DIGITS, MAX_DECIMAL_EXPONENT, MAX_DEPTH, MAX_HASH_COLLISIONS, MAX_INT_BITS
from .plain import pack, unpack

__all__ = [
    "AesGcm",
    "Cipher",
    "KeyRing",
    "MAX_DECIMAL_DIGITS",
    "MAX_DECIMAL_EXPONENT",
    "MAX_DEPTH",
    "MAX_HASH_COLLISIONS",
    "MAX_INT_BITS",
    "PayloadHook",
    "allow_module",
    "canonical",
    "dumps",
    "get_payload_hook",
    "is_allowed",
    "loads",
    "pack",
    "register_type",
    "set_payload_hook",
    "unpack",
]


def dumps(value: Any, *, path: str = "value") -> bytes:
    """Encode a payload: canonical msgpack, then the payload hook (if installed).

    Args:
        value: The value to encode (see the module docstring for the supported types).
        path: The name of the value's root in error messages, e.g. ``"args"`` or ``"result"``.

    Returns:
        The stored bytes.

    Raises:
        SerializationError: A value cannot be encoded or breaks a limit; the message names its
            type and where it sits, e.g. ``cannot encode <app.Foo> at args[1]['when']: ...``.
    """
    return apply(encode(value, path))


def loads(data: bytes) -> Any:
    """Decode a payload written by :func:`dumps` (undo the hook, then unpack).

    Classes of dataclasses, enums and exceptions are looked up among the modules already
    loaded in this process (nothing is imported) and built only when allowed. Dataclasses
    are built through their ``__init__``; exceptions are rebuilt with their ``args`` and
    attributes without calling their ``__init__``.

    Args:
        data: The stored bytes.

    Returns:
        The value, with its types preserved.

    Raises:
        SerializationError: The bytes are not a valid payload, break a limit, use an unknown
            extension type, or name a dataclass or enum that is not loaded or not allowed.
            (An exception whose class is not loaded or not allowed decodes as
            :class:`~durable.errors.ApplicationError` naming the original type instead.)
    """
    return decode(canonical(data))
