"""Hook tokens: derived, never stored.

A hook token is a bearer capability: whoever holds it can resume the hook. So no
stored copy of it exists. It is derived on demand as ``<partition>.`` followed by an
HMAC-SHA256 of ``run id|hook id`` under a *hook secret*; history records only its
digest (``sha256:<hex>``), and the store routes by that digest. Replay (a worker
rebuilding a run, a client answering a query) derives the same token again with the
same secret, so workflow code sees the same value live and on replay.

The secret comes from ``DURABLE_HOOK_SECRET`` (comma-separated: the first one signs new
tokens, the others still re-derive older ones, for rotation), else from the store (one
random secret per namespace, created on first use), else (no store: offline replay,
simulations) one random secret per process. See ``docs/security.md``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets

ENV = "DURABLE_HOOK_SECRET"
"""The environment variable holding the hook secret(s), comma-separated, current first."""

DIGEST_PREFIX = "sha256:"
"""How a recorded token digest starts (a recorded token without it predates hashing)."""

_PROCESS_SECRET = secrets.token_bytes(32)


def env_secrets() -> tuple[bytes, ...]:
    """The secrets ``DURABLE_HOOK_SECRET`` names (empty when unset)."""
    raw = os.environ.get(ENV, "")
    return tuple(part.strip().encode() for part in raw.split(",") if part.strip())


def process_secrets() -> tuple[bytes, ...]:
    """The secrets of a process without a store: the environment's, else a per-process one."""
    return env_secrets() or (_PROCESS_SECRET,)


def derive(secret: bytes, prefix: str, run_id: str, hook_id: str) -> str:
    """The token of hook ``hook_id`` of run ``run_id`` under ``secret`` (``prefix``: ``"<p>."``)."""
    mac = hmac.new(secret, f"{run_id}|{hook_id}".encode(), hashlib.sha256).digest()
    return prefix + base64.urlsafe_b64encode(mac[:24]).decode("ascii")


def digest(token: str) -> str:
    """What history records and the store routes by: ``sha256:<hex of the token's SHA-256>``."""
    return DIGEST_PREFIX + hashlib.sha256(token.encode()).hexdigest()


def mask(value: object) -> str:
    """A recorded token as printed: a digest shortened, a plaintext token (older runs) hidden."""
    if isinstance(value, str) and value.startswith(DIGEST_PREFIX):
        return value[: len(DIGEST_PREFIX) + 12] + "…"
    return "<hidden>"
