"""A worker process's configuration, and how a Redis URL is shown to people.

:class:`WorkerConfig` is built once from the ``durable worker`` options. With
``--processes N`` the supervisor hands it to its children in the environment
(:attr:`WorkerConfig.ENV`, JSON), never on their command line: the Redis URL
may carry a password, and a process's argv is readable by every user of the
machine (``ps``), its environment only by the same user.

:func:`mask_url` and :func:`mask_secrets` hide passwords wherever the CLI
prints a URL or a message that may hold one, and in log records.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = ["WorkerConfig", "mask_secrets", "mask_url"]

# scheme://user:PASSWORD@ -- a password cannot hold a raw "/" or "@" (URL parsers would
# split there too), so the match stops at the first of either.
_USERINFO_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)[^\s/@]*@")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#\s]*", re.IGNORECASE)


def mask_secrets(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``.

    Covers ``scheme://user:password@host`` and a ``password=`` query parameter.
    """
    return _QUERY_PASSWORD.sub(r"\1***", _USERINFO_PASSWORD.sub(r"\1***@", text))


def mask_url(url: str) -> str:
    """A Redis URL fit to print or log: its password (if any) replaced by ``***``.

    >>> mask_url("redis://app:hunter2@db:6379/0")
    'redis://app:***@db:6379/0'
    """
    return mask_secrets(url)


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker process needs, as the ``durable worker`` options give it.

    Attributes:
        redis_url: The Redis to serve (resolved: never the "embedded default" placeholder).
            Left out of ``repr``: it may carry a password.
        apps: Modules defining the workflows and activities (``--app``).
        queues: Task queues to serve.
        concurrency: Activity threads.
        cache_size: Runs kept cached.
        eager: Run scheduled activities in this worker (``--eager``).
        claim_idle: Seconds a task may sit with a silent worker before another reclaims it.
        sticky_timeout: Seconds a workflow task may wait unread in a worker's private (sticky)
            stream before it goes to the shared queue (0: only when that worker's lease lapses).
        grace: Seconds a stop lets running activities finish (the process ends at the
            latest 5 s after that, whatever its workflows do).
        decision_timeout: Seconds a decision may run workflow code without yielding before
            its run is blocked and the process exits for its supervisor to restart (0: none).
        unknown_type_grace: Seconds a task of a type this worker lacks waits for a live worker of
            its queue that has the type before it is parked (``--unknown-type-grace``).
        build_id: The build id chosen with ``--build-id`` (``None``: unversioned; ``"auto"``:
            a hash of the ``--app`` sources).
        compatible: Other builds whose runs this code also decides.
        unversioned: No build id at all (the default; overrides ``build_id``).
        promote: Make the build the queues' current one at start (``--promote``).
        gc_threshold: Young-generation allocations between collector passes (0: Python's).
        log_format: ``text`` or ``json``.
        log_level: A logging level name.
        metrics_port: Serve Prometheus metrics on this port (``--metrics-port``; 0: off).
        metrics_host: The address the metrics port listens on (``--metrics-host``; default
            this host only, ``0.0.0.0``: every interface).
        embedded_dir: The data dir of the embedded Redis ``redis_url`` points at (``""``: a
            Redis of the user's): the worker starts that server again if it dies.
    """

    ENV: ClassVar[str] = "DURABLE_WORKER_CONFIG"

    redis_url: str = field(repr=False)
    apps: tuple[str, ...]
    queues: tuple[str, ...] = ("default",)
    concurrency: int = 8
    cache_size: int = 1000
    eager: bool = False
    claim_idle: float = 30.0
    sticky_timeout: float = 5.0
    grace: float = 30.0
    decision_timeout: float = 2.0
    unknown_type_grace: float = 60.0
    build_id: str | None = None
    compatible: tuple[str, ...] = ()
    unversioned: bool = False
    promote: bool = False
    gc_threshold: int = 10_000
    log_format: str = "text"
    log_level: str = "INFO"
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"  # this host only, as the operator server's --host: no token guards it
    embedded_dir: str = ""

    @property
    def claim_idle_ms(self) -> int:
        """``claim_idle`` in milliseconds."""
        return int(self.claim_idle * 1000)

    def to_env(self) -> dict[str, str]:
        """The environment entry that carries this configuration to a child process."""
        return {self.ENV: json.dumps(dataclasses.asdict(self))}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> WorkerConfig:
        """The configuration :meth:`to_env` put in ``environ``.

        Raises:
            ValueError: The entry is missing or is not a configuration.
        """
        raw = environ.get(cls.ENV)
        if not raw:
            raise ValueError(
                f"${cls.ENV} is not set: this command is started by `durable worker --processes N`"
            )
        try:
            data: dict[str, Any] = json.loads(raw)
            for name in ("apps", "queues", "compatible"):
                data[name] = tuple(data[name])
            return cls(**data)
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"${cls.ENV} holds no worker configuration ({exc})") from None
