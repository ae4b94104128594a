"""Supervisors whose worker processes die before they join: said where the views look.

``durable worker --processes N`` restarts a worker process that dies, for ever once one has
joined. When the code on disk no longer imports (a bad deploy, a missing dependency), every
restart dies before joining: no worker of its queues is live, and the views said only "no live
worker serves queue 'q': start one" -- another one would fail the same way, and the import
error was only in the supervisor's log on its machine. The supervisor says it here
(:meth:`StartFailures.say_start_failure`, renewed at each failed start, expiring on its own),
and ``why_blocked`` / ``durable workers`` name it.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass

from .base import StoreBase
from .connect import CommandRefused
from .records import text

__all__ = ["START_FAILURE_TTL_MS", "StartFailure", "StartFailures"]


@dataclass(frozen=True)
class StartFailure:
    """A supervisor (``durable worker --processes N``) whose worker processes die before they
    join the registry (the code on disk does not import, say): it restarts them for ever, and
    no worker of its queues is live meanwhile; this says why.

    Attributes:
        supervisor: ``host:pid`` of the supervisor.
        queues: The queues its workers serve.
        error: The last child's ``error: ...`` line (or how it ended).
        retry_s: The delay before its next restart, in seconds.
    """

    supervisor: str
    queues: tuple[str, ...]
    error: str
    retry_s: float

    def words(self) -> str:
        """``supervisor vm:123 (queues q) cannot start its worker processes: error: ...; ...``."""
        return (
            f"supervisor {self.supervisor} (queues {', '.join(self.queues)}) cannot start its worker "
            f"processes: {self.error}; it restarts them every {self.retry_s:g} s (see its log)"
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> StartFailure | None:
        try:
            data = json.loads(raw)
            return cls(
                str(data["supervisor"]),
                tuple(map(str, data["queues"])),
                str(data["error"]),
                float(data["retry_s"]),
            )
        except (ValueError, TypeError, KeyError):
            return None


START_FAILURE_TTL_MS = 120_000
"""How long a supervisor's :class:`StartFailure` is shown unless said again (its longest
restart delay is 30 s: one that stopped, or succeeded, is not shown for long)."""


class StartFailures(StoreBase):
    """The supervisors' :class:`StartFailure` notes."""

    def say_start_failure(self, failure: StartFailure) -> None:
        """Note (for :data:`START_FAILURE_TTL_MS`) that ``failure.supervisor``'s workers die
        before joining: the views name it where they say no live worker serves its queues."""
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self.keys.start_failure(failure.supervisor), failure.to_json(), px=START_FAILURE_TTL_MS)
            pipe.sadd(self.keys.start_failures(), failure.supervisor)
            pipe.execute()

    def clear_start_failure(self, supervisor: str) -> None:
        """A worker process of ``supervisor`` joined (or it stops): nothing more to say."""
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.delete(self.keys.start_failure(supervisor))
            pipe.srem(self.keys.start_failures(), supervisor)
            pipe.execute()

    def start_failures(self) -> list[StartFailure]:
        """The supervisors whose worker processes die before joining, as they last said it."""
        names = sorted(text(n) for n in self.redis.smembers(self.keys.start_failures()))
        if not names:
            return []
        keys = [self.keys.start_failure(n) for n in names]
        raw = self.redis.mget_nonatomic(keys) if self.cluster else self.redis.mget(keys)
        found = [StartFailure.from_json(value) if value is not None else None for value in raw]
        gone = [name for name, failure in zip(names, found, strict=True) if failure is None]
        if gone:
            with contextlib.suppress(CommandRefused):
                self.redis.srem(self.keys.start_failures(), *gone)
        return [failure for failure in found if failure is not None]
