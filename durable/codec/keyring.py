"""A payload hook that encrypts with named keys: key id in the envelope, key rotation.

Install it with :func:`durable.codec.set_payload_hook` in every process that reads or
writes payloads (workers, clients, the CLI)::

    ring = KeyRing({"2024-06": AesGcm(key_2024_06), "2025-01": AesGcm(key_2025_01)}, current="2025-01")
    codec.set_payload_hook(ring)

Every payload is encrypted with the ``current`` key and carries its id; a payload is
decrypted with the key its envelope names, so old payloads stay readable while the ring
holds their key. To rotate: add the new key, make it current (every process), and drop the
old key once nothing written with it is still read (retention).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Protocol

from durable.errors import ConfigurationError, SerializationError

# Envelope: MAGIC, one byte of key id length, the key id (ASCII), the cipher's output. No
# msgpack payload but the single byte b"D" starts with 0x44, so MAGIC cannot be mistaken
# for a plaintext payload.
MAGIC = b"DK1"


def key_id_of(data: bytes) -> str:
    """The key id an envelope names (``""``: not an envelope)."""
    if not data.startswith(MAGIC) or len(data) <= len(MAGIC):
        return ""
    end = len(MAGIC) + 1 + data[len(MAGIC)]
    return data[len(MAGIC) + 1 : end].decode("ascii", "replace")


class Cipher(Protocol):
    """Authenticated encryption of payload bytes; ``aad`` (the key id) must be authenticated."""

    def encrypt(self, data: bytes, aad: bytes) -> bytes:
        """Encrypt ``data``, binding ``aad``."""
        ...

    def decrypt(self, data: bytes, aad: bytes) -> bytes:
        """Decrypt and authenticate; raise on tampering."""
        ...


class KeyRing:
    """A :class:`~durable.codec.PayloadHook` encrypting with the current key of a ring.

    Args:
        ciphers: Key id -> cipher. Key ids are 1-64 ASCII characters.
        current: The key id new payloads are encrypted with.
        accept_plaintext: Also read payloads written before encryption was turned on.
    """

    def __init__(
        self, ciphers: Mapping[str, Cipher], current: str, *, accept_plaintext: bool = False
    ) -> None:
        for key_id in ciphers:
            if not (isinstance(key_id, str) and 0 < len(key_id) <= 64 and key_id.isascii()):
                raise ValueError(f"key ids are 1-64 ASCII characters, not {key_id!r}")
        if current not in ciphers:
            raise ValueError(f"the current key {current!r} is not in the ring {sorted(ciphers)}")
        self._ciphers = dict(ciphers)
        self._current = current
        self._accept_plaintext = accept_plaintext

    @property
    def current(self) -> str:
        """The key id new payloads are encrypted with."""
        return self._current

    def encode(self, data: bytes) -> bytes:
        """Encrypt ``data`` with the current key; the envelope names the key."""
        key_id = self._current.encode("ascii")
        return MAGIC + bytes((len(key_id),)) + key_id + self._ciphers[self._current].encrypt(data, key_id)

    def decode(self, data: bytes) -> bytes:
        """Decrypt with the key the envelope names.

        Raises:
            SerializationError: Not an envelope (and plaintext not accepted), a key id not in
                the ring, or bytes that do not authenticate.
        """
        if not data.startswith(MAGIC):
            if self._accept_plaintext:
                return data
            raise SerializationError("payload is not encrypted by a KeyRing (no key id envelope)")
        end = len(MAGIC) + 1 + data[len(MAGIC)] if len(data) > len(MAGIC) else 0
        key_id = data[len(MAGIC) + 1 : end]
        cipher = self._ciphers.get(key_id.decode("ascii", "replace"))
        if cipher is None:
            raise SerializationError(
                f"payload is encrypted with key id {key_id.decode('ascii', 'replace')!r}, which is not in "
                f"the key ring {sorted(self._ciphers)}; add that key to decode it"
            )
        try:
            return cipher.decrypt(data[end:], key_id)
        except Exception as exc:
            raise SerializationError(
                f"payload encrypted with key id {key_id.decode('ascii')!r} does not decrypt: {type(exc).__name__}"
            ) from None


class AesGcm:
    """AES-GCM (``cryptography`` package, an optional dependency) with a random 96-bit nonce.

    Args:
        key: 16, 24 or 32 bytes, e.g. ``os.urandom(32)`` kept in your secret store.
    """

    def __init__(self, key: bytes) -> None:
        # Imported here: cryptography is optional and only processes that encrypt need it.
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415
        except ImportError:
            raise ConfigurationError(
                "AesGcm needs the cryptography package: pip install -e '.[crypto]' in durable's checkout"
            ) from None

        self._aead = AESGCM(key)

    def encrypt(self, data: bytes, aad: bytes) -> bytes:
        """Encrypt: nonce + ciphertext with tag."""
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, data, aad)

    def decrypt(self, data: bytes, aad: bytes) -> bytes:
        """Decrypt and authenticate (``InvalidTag`` on tampering or a wrong key)."""
        return self._aead.decrypt(data[:12], data[12:], aad)
