"""Who may call the API: bearer tokens with two roles, the CSRF rule, the hook signature.

Tokens come from a file (``--auth-file``, JSON or TOML) or the environment
(``DURABLE_SERVER_TOKENS``), never from the command line (``ps`` shows it). They
are kept as SHA-256 digests and compared in constant time; no token is ever
logged or answered. Without any token the server is open to whoever reaches it,
so ``durable server`` then binds loopback only and accepts only loopback ``Host``
headers (a page of another site cannot reach it through DNS rebinding).

A state-changing request from a browser must carry the bearer header or, with no
tokens configured, the ``X-Durable-Request`` header: a cross-site form or
``fetch`` can set neither without a CORS preflight, which this server never grants.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable.untrusted import json_loads
from workers.cli.server import is_loopback
from workers.server.errors import ApiError

__all__ = [
    "CSRF_HEADER",
    "MIN_TOKEN_LENGTH",
    "ROLES",
    "SIGNATURE_HEADER",
    "AuthConfig",
    "AuthFileError",
    "load_auth",
    "sign",
]

ROLES = ("read", "operator")
"""``read``: every GET and queries; ``operator``: also start, signal, update, cancel, terminate,
repair and the schedule actions."""

_ROLE_NAMES = {"read": "read", "read-only": "read", "readonly": "read", "operator": "operator"}
MIN_TOKEN_LENGTH = 16
"""Shortest bearer token accepted (a short one could be guessed)."""

CSRF_HEADER = "X-Durable-Request"
SIGNATURE_HEADER = "X-Durable-Signature"
TOKENS_ENV = "DURABLE_SERVER_TOKENS"
HOOK_SECRET_ENV = "DURABLE_SERVER_HOOK_SECRET"


class AuthFileError(ValueError):
    """The auth file or ``DURABLE_SERVER_TOKENS`` cannot be used (the message says why)."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def sign(secret: str | bytes, body: bytes) -> str:
    """The ``X-Durable-Signature`` value of ``body``: ``sha256=<hex HMAC-SHA256>``."""
    key = secret.encode() if isinstance(secret, str) else secret
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


@dataclass
class AuthConfig:
    """The tokens (by digest) with their role and name, and the hook body secret."""

    tokens: dict[bytes, tuple[str, str]] = field(default_factory=dict)
    hook_secret: bytes | None = None

    @property
    def enabled(self) -> bool:
        """Whether tokens are configured (else the server is open, on loopback only)."""
        return bool(self.tokens)

    def add(self, token: str, role: str, name: str = "") -> None:
        """Accept ``token`` with ``role`` (``read``/``read-only`` or ``operator``).

        Raises:
            AuthFileError: an unknown role or a token under :data:`MIN_TOKEN_LENGTH` characters.
        """
        canonical = _ROLE_NAMES.get(str(role).strip().lower())
        if canonical is None:
            raise AuthFileError(f"unknown role {role!r}: use 'read' (read-only) or 'operator'")
        if not isinstance(token, str) or len(token.strip()) < MIN_TOKEN_LENGTH:
            raise AuthFileError(
                f"{'an' if canonical == 'operator' else 'a'} {canonical} token is shorter than {MIN_TOKEN_LENGTH} characters; "
                "make one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
            )
        digest = _digest(token.strip())
        if digest in self.tokens:  # the later role silently won: a read token could be an operator's
            raise AuthFileError(
                f"token {name or canonical!r} is listed twice (as {self.tokens[digest][1]!r} too): "
                "give each token one entry, with its one role"
            )
        self.tokens[digest] = (canonical, name or canonical)

    def role_of(self, headers: Mapping[str, str]) -> tuple[str, str]:
        """``(role, name)`` of the request's bearer token (``operator`` when auth is off).

        Raises:
            ApiError: ``unauthorized`` -- no bearer token, or an unknown one.
        """
        if not self.enabled:
            return "operator", "anonymous"
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                "unauthorized",
                "this server needs a bearer token: send the header 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        found = self._lookup(token.strip())
        if found is None:
            raise ApiError(
                "unauthorized",
                "unknown bearer token",
                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )
        return found

    def _lookup(self, token: str) -> tuple[str, str] | None:
        want = _digest(token)
        match = None
        for digest, who in self.tokens.items():  # every entry compared: no early exit to time
            if hmac.compare_digest(digest, want):
                match = who
        return match

    def check_signature(self, headers: Mapping[str, str], body: bytes) -> None:
        """With a hook secret configured, require a valid ``X-Durable-Signature`` over ``body``.

        Raises:
            ApiError: ``bad_signature``.
        """
        if self.hook_secret is None:
            return
        given = headers.get(SIGNATURE_HEADER.lower(), "")
        if not given:
            raise ApiError(
                "bad_signature",
                f"this server signs hook bodies: send {SIGNATURE_HEADER}: sha256=<hex HMAC-SHA256 of the body>",
            )
        if not hmac.compare_digest(given.strip().lower(), sign(self.hook_secret, body)):
            raise ApiError("bad_signature", f"the {SIGNATURE_HEADER} does not match the body")


def check_browser_rules(auth: AuthConfig, method: str, headers: Mapping[str, str]) -> None:
    """The DNS-rebinding and CSRF rules (see the module's docstring).

    Raises:
        ApiError: ``forbidden`` for a foreign ``Host`` while auth is off; ``csrf`` for a
            state-changing request with neither a bearer token nor the custom header, or
            from another origin.
    """
    host = headers.get("host", "")
    if not auth.enabled and not loopback_host(host):
        raise ApiError("forbidden", LOOPBACK_ONLY)
    if method in ("GET", "HEAD", "OPTIONS"):
        return
    origin = headers.get("origin")
    if origin and origin not in (f"http://{host}", f"https://{host}"):
        raise ApiError("csrf", f"cross-origin request refused (origin {origin!r})")
    if "authorization" not in headers and CSRF_HEADER.lower() not in headers:
        raise ApiError(
            "csrf",
            f"a state-changing request needs 'Authorization: Bearer <token>' or an {CSRF_HEADER} header",
        )


LOOPBACK_ONLY = "without tokens this server answers only requests to a loopback host"


def loopback_host(host: str) -> bool:
    """Whether a request's ``Host`` header names a loopback host (port or not): ``localhost``
    or a loopback address (all of 127.0.0.0/8, which ``durable server --host`` may bind)."""
    return is_loopback(_hostname(host))  # the rule `durable server --host` is checked by


def _hostname(host: str) -> str:
    if host.startswith("["):
        return host.split("]")[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def load_auth(path: Path | None = None, environ: Mapping[str, str] | None = None) -> AuthConfig:
    """The tokens and hook secret of ``path`` (JSON, or TOML when it ends in ``.toml``) and of
    ``DURABLE_SERVER_TOKENS`` (``role:token`` items, comma-separated) and
    ``DURABLE_SERVER_HOOK_SECRET``.

    The file holds ``tokens``: a list of ``{"token", "role", "name"}``, and optionally
    ``hook_secret``.

    Raises:
        AuthFileError: an unreadable or malformed file, an unknown role, a short token.
    """
    env = os.environ if environ is None else environ
    auth = AuthConfig()
    if path is not None:
        _load_file(auth, Path(path))
    for item in filter(None, (s.strip() for s in env.get(TOKENS_ENV, "").split(","))):
        role, sep, token = item.partition(":")
        if not sep:
            raise AuthFileError(f"${TOKENS_ENV} items are role:token (e.g. operator:...), one is not")
        auth.add(token, role, f"{role} (env)")
    if env.get(HOOK_SECRET_ENV):
        auth.hook_secret = env[HOOK_SECRET_ENV].encode()
    return auth


MAX_AUTH_FILE = 1024 * 1024
"""Largest auth file read: ``/dev/zero`` given by mistake grew the server to 2.5 GB in 5 s."""


def _load_file(auth: AuthConfig, path: Path) -> None:
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_AUTH_FILE + 1)
        if len(raw) > MAX_AUTH_FILE or not path.is_file():
            raise AuthFileError(
                f"auth file {path} is not a regular file of at most {MAX_AUTH_FILE:,} bytes: give the "
                "JSON or TOML file of tokens"
            )
        data: Any = tomllib.loads(raw.decode()) if path.suffix == ".toml" else json_loads(raw)
    except (OSError, ValueError) as exc:  # tomllib and json errors are ValueErrors
        raise AuthFileError(f"cannot read auth file {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("tokens", []), list):
        raise AuthFileError(f"auth file {path}: expected an object with a 'tokens' list")
    for n, entry in enumerate(data.get("tokens", []), 1):
        if not isinstance(entry, dict) or "token" not in entry or "role" not in entry:
            raise AuthFileError(f"auth file {path}: token #{n} needs 'token' and 'role'")
        auth.add(str(entry["token"]), str(entry["role"]), str(entry.get("name", "")))
    secret = data.get("hook_secret")
    if secret:
        auth.hook_secret = str(secret).encode()
