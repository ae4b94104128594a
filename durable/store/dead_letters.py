"""Dead letters: the tasks parked because they cannot run (an unknown type, an undecodable body,
a decision that crashed its worker), each partition's in its own stream, with the reason; read
back for ``durable list --dead`` and the API.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import codec
from ..codec.sealed import open_text
from .base import StoreBase
from .records import text

__all__ = ["DeadLetters"]


class DeadLetters(StoreBase):
    """Reading the dead-letter streams (parking is :meth:`~durable.store.queues.QueueStore.park`)."""

    def dead_letter_count(self) -> int:
        """How many tasks are parked in every partition together (one round trip)."""
        with self.redis.pipeline(transaction=False) as pipe:
            for p in range(self.keys.partitions):
                pipe.xlen(self.keys.dead(p))
            return sum(int(n) for n in pipe.execute())

    def dead_letters(self, count: int = 100) -> list[dict[str, Any]]:
        """The newest ``count`` parked tasks of every partition together, newest last; each with
        its run's ``workflow_id`` (``None`` once the run is purged) so that an operator can go to
        the run, and its ``run_status`` (a closed run's letter needs no repair any more)."""
        newest: list[tuple[tuple[int, int], int, Any, Any]] = []
        for p in range(self.keys.partitions):
            for entry_id, fields in self.redis.xrevrange(self.keys.dead(p), count=count):
                ms, _, seq = text(entry_id).partition("-")
                newest.append(((int(ms), int(seq or 0)), p, entry_id, fields))
        # Each partition's newest: the oldest of one partition's first `count` were shown instead,
        # `count` of each (`list --dead --limit 1` printed one a partition).
        newest.sort(key=lambda row: row[0])
        out = [
            _letter(p, entry_id, fields) for _, p, entry_id, fields in (newest[-count:] if count > 0 else [])
        ]
        with self.redis.pipeline(transaction=False) as pipe:
            for item in out:
                pipe.hmget(self.keys.run(item["partition"], item.get("run") or "-"), "workflow_id", "status")
            owners = pipe.execute() if out else []
        for item, (owner, status) in zip(out, owners, strict=True):
            item["workflow_id"] = text(owner) if owner else None
            # Closed since (terminated, say): nothing to repair, the letter only tells what happened.
            item["run_status"] = text(status) if status else None
        return out


def _letter(p: int, entry_id: Any, fields: Mapping[Any, Any]) -> dict[str, Any]:
    """One dead letter of partition ``p`` as read back: its fields as text, its task decoded
    when it decodes (else its raw bytes: shown rather than hidden)."""
    item = {text(k): v for k, v in fields.items()}
    for key in ("kind", "stream", "entry", "run"):
        if key in item:
            item[key] = text(item[key])
    if "ts" in item:
        item["ts"] = int(item["ts"]) if text(item["ts"]).isdigit() else text(item["ts"])
    if "reason" in item:
        item["reason"] = open_text(item["reason"])
    if "task" in item:
        try:
            item["task"] = codec.unpack(item["task"])
        except Exception:  # noqa: BLE001 - show raw bytes rather than hide the letter
            pass
    item["id"] = text(entry_id)
    item["partition"] = p
    return item
