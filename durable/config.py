"""Settings shared by the client and the workers, read from the environment.

* ``DURABLE_REDIS_URL`` -- the Redis to use; unset: the embedded server, which
  the store starts on demand (:func:`durable.store.embedded.resolve_redis_url`). A Redis Cluster is named by
  ``redis+cluster://host:port[,host:port...]`` (or ``?cluster=1`` on a
  ``redis://`` URL); see docs/scaling.md.
* ``DURABLE_HOME`` -- data dir of the embedded server (default ``.durable/``).
* ``DURABLE_NAMESPACE`` -- the namespace: the prefix of every Redis key durable
  writes (default ``durable``). Apps sharing one Redis each take their own; an ACL
  user limited to ``~<namespace>:*`` can run that namespace and nothing else (see
  docs/security.md). ``DURABLE_PREFIX`` is its older name, still read.
* ``DURABLE_PARTITIONS`` -- number of task-queue partitions, 1..1024 (default 8).

Values are read on every call (not cached at import), so tests and CLIs can
change the environment at run time. This module only reads settings: it
starts nothing and imports nothing of the store.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import threading
from urllib.parse import urlsplit

from durable.errors import ConfigurationError

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_PARTITIONS",
    "DEFAULT_PREFIX",
    "MAX_NAMESPACE_LENGTH",
    "MAX_PARTITIONS",
    "check_namespace",
    "configured_redis_url",
    "data_dir",
    "is_local_redis",
    "key_prefix",
    "namespace",
    "partitions",
    "warn_if_shared_default",
]

DEFAULT_NAMESPACE = "durable"
DEFAULT_PREFIX = DEFAULT_NAMESPACE
MAX_NAMESPACE_LENGTH = 64
DEFAULT_PARTITIONS = 8
MAX_PARTITIONS = 1024


def configured_redis_url(explicit: str | None = None) -> str | None:
    """The Redis URL the settings name: ``explicit`` if given, else ``$DURABLE_REDIS_URL``;
    ``None`` when neither does (use the embedded server)."""
    return explicit or os.environ.get("DURABLE_REDIS_URL") or None


def data_dir() -> str | None:
    """``$DURABLE_HOME``: the embedded server's data dir, when set."""
    return os.environ.get("DURABLE_HOME") or None


# No ":" (namespace "a" would hold "a:b"'s keys under the ACL pattern "~a:*"), no hash-tag
# braces (they would move every key's slot) and no glob characters (ACL patterns).
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9_.-]+")


def check_namespace(name: str) -> str:
    """``name`` if it is a valid namespace: 1 to 64 of ``A-Z a-z 0-9 _ . -``.

    Raises:
        ConfigurationError: It is not.
    """
    if not (0 < len(name) <= MAX_NAMESPACE_LENGTH and _NAMESPACE_RE.fullmatch(name)):
        raise ConfigurationError(
            f"namespace {name[:80]!r} is not valid: use 1 to {MAX_NAMESPACE_LENGTH} letters, digits, "
            "'_', '.' or '-' (every key is '<namespace>:...', and an ACL pattern '~<namespace>:*' "
            "must cover exactly one namespace)"
        )
    return name


def namespace(explicit: str | None = None) -> str:
    """The namespace (prefix of every Redis key): ``explicit``, else ``$DURABLE_NAMESPACE``,
    else ``$DURABLE_PREFIX`` (its older name), else ``"durable"``.

    Raises:
        ConfigurationError: The name is not valid (:func:`check_namespace`), or both
            variables are set and disagree.
    """
    if explicit:
        return check_namespace(explicit)
    named = os.environ.get("DURABLE_NAMESPACE", "").strip()
    prefix = os.environ.get("DURABLE_PREFIX", "").strip()
    if named and prefix and named != prefix:
        raise ConfigurationError(
            f"DURABLE_NAMESPACE={named!r} and DURABLE_PREFIX={prefix!r} disagree: "
            "set only DURABLE_NAMESPACE (DURABLE_PREFIX is its older name)"
        )
    return check_namespace(named or prefix or DEFAULT_NAMESPACE)


def key_prefix() -> str:
    """The prefix of every Redis key: :func:`namespace` (kept for callers of the older name)."""
    return namespace()


def is_local_redis(url: str) -> bool:
    """Whether ``url`` names a Redis on this machine only: a unix socket, or loopback hosts."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return True
    hosts = parts.netloc.rsplit("@", 1)[-1]
    for item in hosts.split(","):  # a cluster URL lists its nodes
        item = item.strip()
        host = item[1:].partition("]")[0] if item.startswith("[") else item.rpartition(":")[0] or item
        if host == "localhost" or not host:
            continue
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return False
        except ValueError:
            return False
    return True


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_if_shared_default(url: str | None, name: str) -> bool:
    """Log a warning (once per Redis per process) when the default namespace is used on a
    Redis other processes' apps may share (not local); True if it warned."""
    if name != DEFAULT_NAMESPACE or not url or is_local_redis(url):
        return False
    host = urlsplit(url).netloc.rsplit("@", 1)[-1]  # never log a password
    with _warned_lock:
        if host in _warned:
            return False
        _warned.add(host)
    logging.getLogger("durable").warning(
        "durable is using the default namespace %r on a shared Redis (%s): another app that does too "
        "shares its queues, workers and builds. Give each app its own: DURABLE_NAMESPACE=<app>, "
        "`durable --namespace <app>`, or RedisStore(url, namespace=<app>) (docs/security.md)",
        name,
        host,
    )
    return True


def partitions() -> int:
    """The number of task-queue partitions: ``$DURABLE_PARTITIONS``, default 8.

    Raises:
        ConfigurationError: The variable is not an integer in 1..1024.
    """
    raw = os.environ.get("DURABLE_PARTITIONS", "").strip()
    if not raw:
        return DEFAULT_PARTITIONS
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(
            f"DURABLE_PARTITIONS must be an integer in 1..{MAX_PARTITIONS}, not {raw!r}"
        ) from None
    if not 1 <= value <= MAX_PARTITIONS:
        raise ConfigurationError(f"DURABLE_PARTITIONS must be in 1..{MAX_PARTITIONS}, not {value}")
    return value
