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
size, hash collisions) exactly as the encoder does. Asked to (``allowed_only``: what
clients write -- start, signal, update and schedule arguments, hook payloads) the encoder
refuses a dataclass, pydantic model or Enum member whose class the decoder would refuse, with
the decoder's reason, before anything is written.

A byte-level :class:`PayloadHook` (encryption, compression) can be installed
with :func:`set_payload_hook`; it wraps the output of :func:`dumps` only.
:class:`KeyRing` is such a hook that encrypts with named keys (key id in the envelope,
rotation), e.g. with :class:`AesGcm`. Text stored outside payloads that may quote user
data (activity error messages and tracebacks, parked and blocked reasons) is encrypted by
the same hook (:mod:`durable.codec.sealed`).

Modules: ``encoder`` and ``decoder`` (the two directions), ``allowlist`` (which classes
a payload may name), ``limits``, ``hooks`` (the payload hook), ``keyring`` (encryption), ``sealed`` (encrypted text
outside payloads), ``plain`` (envelopes),
``ext`` (extension type codes).
"""

from __future__ import annotations

import logging
from typing import Any

from .. import limits as run_limits
from ..active_driver import active_driver
from ..errors import ApplicationError, PayloadTooLarge, error_text, message_of
from .allowlist import allow_module, is_allowed, register_type
from .decoder import decode
from .encoder import encode
from .hooks import (
    PayloadHook,
    apply,
    canonical,
    get_payload_hook,
    install_payload_hook_from_env,
    set_payload_hook,
)
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
    "install_payload_hook_from_env",
    "is_allowed",
    "loads",
    "pack",
    "register_type",
    "set_payload_hook",
    "unpack",
    "view",
]


def dumps(value: Any, *, path: str = "value", allowed_only: bool = False) -> bytes:
    """Encode a payload: canonical msgpack, then the payload hook (if installed).

    Args:
        value: The value to encode (see the module docstring for the supported types).
        path: The name of the value's root in error messages, e.g. ``"args"`` or ``"result"``.
        allowed_only: Refuse a class the decoder would refuse (a client writing arguments:
            the caller learns it at once, nothing is written).

    Returns:
        The stored bytes.

    Raises:
        SerializationError: A value cannot be encoded, breaks a limit or (``allowed_only``) is
            of a class the decoder would refuse (:func:`is_allowed`); the message names its type
            and where it sits, e.g. ``cannot encode <app.Foo> at args[1]['when']: ...``.
        PayloadTooLarge: The encoded bytes exceed ``max_payload_bytes`` (:mod:`durable.limits`;
            an exception is stored cut down instead). Over ``warn_payload_bytes`` a warning is logged.
    """
    try:
        data = apply(encode(value, path, allowed_only=allowed_only))
    except Exception as exc:  # noqa: BLE001 - an error's own attributes may raise anything
        if not isinstance(value, BaseException) or allowed_only:
            raise
        # An error that cannot be stored as it is (a cycle in its args, a cause chain past the
        # nesting limit, attributes that raise) is stored as a stand-in keeping its type and
        # message: refusing it would lose the failure (a run blocked on an activity that raised).
        data = apply(encode(_stand_in(value, f"its details could not be stored: {error_text(exc)}"), path))
    bounds = run_limits.current()
    if len(data) > bounds.warn_payload_bytes or len(data) > bounds.max_payload_bytes:
        data = _sized(value, path, data)
    return data


_log = logging.getLogger("durable.limits")


def _sized(value: Any, path: str, data: bytes) -> bytes:
    """Refuse a payload over ``max_payload_bytes``; warn about one over ``warn_payload_bytes``.

    An exception too large to store (a huge message) is stored as an ``ApplicationError``
    keeping its type name and the start of its message: refusing it would lose the failure.
    """
    current = run_limits.current()
    if len(data) <= current.max_payload_bytes:
        if len(data) <= current.warn_payload_bytes:
            return data
        driver = active_driver()
        if driver is not None and driver.is_replaying:
            return data  # said when the code first issued it: not again on each replay and query
        _log.warning(
            "payload %s of %d bytes is over %d (warn_payload_bytes)%s; large payloads slow every replay "
            "of the run: store big data elsewhere and pass a reference",
            path,
            len(data),
            current.warn_payload_bytes,
            f" in run {driver.run_id} ({driver.workflow_type})" if driver is not None else "",
        )
        return data
    if isinstance(value, BaseException):
        stand_in = _stand_in(value, f"error of {len(data):,} bytes cut to fit max_payload_bytes")
        return apply(encode(stand_in, path))
    raise PayloadTooLarge(
        f"{path}: encoded payload of {len(data):,} bytes exceeds the limit max_payload_bytes "
        f"({current.max_payload_bytes:,}); nothing was written. Store large data elsewhere and pass a "
        f"reference, or raise the limit with {run_limits.ENV['max_payload_bytes']}",
        limit="max_payload_bytes",
        value=current.max_payload_bytes,
        actual=len(data),
    )


def _stand_in(error: BaseException, why: str) -> ApplicationError:
    """An :class:`ApplicationError` keeping ``error``'s type name and the start of its message."""
    return ApplicationError(
        f"{message_of(error)[:2000]} [{why[:500]}]",
        type_name=f"{type(error).__module__}.{type(error).__qualname__}",
    )


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


def view(data: bytes) -> Any:
    """Decode a payload for display (``durable result``/``history``/``describe``, the API, the UI).

    As :func:`loads`, except that a dataclass, pydantic model or enum whose class is not loaded in
    this process, not allowed, or no longer fits what was recorded comes out as a mapping that
    names its type, ``{"__type__": "app.Receipt", "order": "o-1", "total": 12.5}``, instead of
    failing the whole payload: an operator's tools do not import the application's code.

    Raises:
        SerializationError: The bytes are not a valid payload or break a limit.
    """
    return decode(canonical(data), view=True)
