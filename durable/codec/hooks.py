"""The byte-level payload hook (encryption, compression) applied around the codec."""

from __future__ import annotations

import importlib
import os
import traceback
from typing import Protocol

from durable.errors import ConfigurationError, SerializationError
from durable.frames import code_position

from .keyring import MAGIC, key_id_of

#: ``module:attribute`` naming the payload hook (or a function returning it) that
#: :func:`install_payload_hook_from_env` installs; the ``durable`` CLI reads it at startup.
ENV_HOOK = "DURABLE_PAYLOAD_HOOK"


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


def install_payload_hook_from_env() -> PayloadHook | None:
    """Install the payload hook that ``$DURABLE_PAYLOAD_HOOK`` names, if it is set.

    The variable is ``module:attribute``; the attribute is a hook (an object with
    ``encode``/``decode``) or a function of no arguments returning one. The ``durable`` CLI
    calls this at startup, so ``durable describe``, ``history`` and ``list --dead`` read
    encrypted runs; call it (or :func:`set_payload_hook`) in your own processes.

    Returns:
        The installed hook, or ``None`` when the variable is unset or empty.

    Raises:
        ConfigurationError: The value is not ``module:attribute``, the module does not
            import, or the attribute is not a hook.
    """
    spec = os.environ.get(ENV_HOOK, "").strip()
    if not spec:
        return None
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(
            f"{ENV_HOOK}={spec!r}: expected module:attribute, e.g. shop.crypto:payload_hook"
        )
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    # SystemExit too: a module that exits when its key is missing ended every command silently.
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - its import may raise anything: one line
        where = (
            " (looked for on sys.path: run from the folder that holds it, or add its folder to PYTHONPATH)"
            # The hook's module itself (or its package), not a module it imports that is missing.
            if isinstance(exc, ModuleNotFoundError) and f"{module_name}.".startswith(f"{exc.name}.")
            else ""
        )
        raise ConfigurationError(
            f"{ENV_HOOK}={spec!r}: {type(exc).__name__}: {exc}{where}{_at(exc)}"
        ) from None
    try:
        hook = target if hasattr(target, "encode") else target() if callable(target) else target
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a factory missing its key: one line
        raise ConfigurationError(
            f"{ENV_HOOK}={spec!r}: calling it raised {type(exc).__name__}: {exc}{_at(exc)}"
        ) from None
    if not (callable(getattr(hook, "encode", None)) and callable(getattr(hook, "decode", None))):
        raise ConfigurationError(
            f"{ENV_HOOK}={spec!r} is a {type(hook).__name__}, not a payload hook "
            "(an object with encode(bytes) and decode(bytes), or a function returning one)"
        )
    set_payload_hook(hook)
    return hook


def _at(exc: BaseException) -> str:
    """`` (at file:line in function)``: the innermost line of the app's code that raised ``exc``."""
    frames = traceback.extract_tb(exc.__traceback__)[1:]  # the first is this module's call
    return f" (at {code_position(frames)})" if frames else ""


def get_payload_hook() -> PayloadHook | None:
    """Return the installed payload hook, or ``None``."""
    return _hook


def apply(data: bytes) -> bytes:
    """Run the installed hook's ``encode`` over canonical bytes.

    Raises:
        SerializationError: the hook raised (what it raised is its cause).
    """
    hook = _hook
    if hook is None:
        return data
    try:
        return hook.encode(data)
    except SerializationError:
        raise
    except Exception as exc:
        raise SerializationError(
            f"the payload hook could not encode {len(data)} bytes: {type(exc).__name__}: {exc}"
        ) from exc


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
        if data.startswith(MAGIC):  # never a plain payload: the key ring's envelope
            raise SerializationError(
                f"payload is encrypted by a KeyRing (key id {key_id_of(data)!r}) and this process has no "
                f"payload hook: install the key ring with set_payload_hook() or ${ENV_HOOK}"
            )
        return data
    try:
        return hook.decode(data)
    except SerializationError:
        raise
    except Exception as exc:
        raise SerializationError(
            f"the payload hook could not decode {len(data)} bytes: {type(exc).__name__}: {exc}"
        ) from exc
