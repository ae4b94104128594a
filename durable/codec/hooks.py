"""The byte-level payload hook (encryption, compression) applied around the codec."""

from __future__ import annotations

from typing import Protocol

from durable.errors import SerializationError


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


def apply(data: bytes) -> bytes:
    """Run the installed hook's ``encode`` over canonical bytes."""
    hook = _hook
    return data if hook is None else hook.encode(data)


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
