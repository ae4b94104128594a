"""Settings shared by the client and the workers, read from the environment.

* ``DURABLE_REDIS_URL`` -- the Redis to use; unset: the embedded server, which
  the store starts on demand (:func:`durable.store.embedded.resolve_redis_url`). A Redis Cluster is named by
  ``redis+cluster://host:port[,host:port...]`` (or ``?cluster=1`` on a
  ``redis://`` URL); see docs/scaling.md.
* ``DURABLE_HOME`` -- data dir of the embedded server (default ``.durable/``).
* ``DURABLE_PREFIX`` -- prefix of every Redis key durable writes (default ``durable``).
* ``DURABLE_PARTITIONS`` -- number of task-queue partitions, 1..1024 (default 8).

Values are read on every call (not cached at import), so tests and CLIs can
change the environment at run time. This module only reads settings: it
starts nothing and imports nothing of the store.
"""

from __future__ import annotations

import os

from durable.errors import ConfigurationError

__all__ = [
    "DEFAULT_PARTITIONS",
    "DEFAULT_PREFIX",
    "MAX_PARTITIONS",
    "key_prefix",
    "configured_redis_url",
    "data_dir",
    "partitions",
]

DEFAULT_PREFIX = "durable"
DEFAULT_PARTITIONS = 8
MAX_PARTITIONS = 1024


def configured_redis_url(explicit: str | None = None) -> str | None:
    """The Redis URL the settings name: ``explicit`` if given, else ``$DURABLE_REDIS_URL``;
    ``None`` when neither does (use the embedded server)."""
    return explicit or os.environ.get("DURABLE_REDIS_URL") or None


def data_dir() -> str | None:
    """``$DURABLE_HOME``: the embedded server's data dir, when set."""
    return os.environ.get("DURABLE_HOME") or None


def key_prefix() -> str:
    """The prefix of every Redis key: ``$DURABLE_PREFIX``, default ``"durable"``."""
    prefix = os.environ.get("DURABLE_PREFIX", "").strip()
    return prefix or DEFAULT_PREFIX


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
