"""Keys that hold the wrong kind of value: made by hand, or by another program sharing the
database. Every command on such a key fails with ``WRONGTYPE``, which names no key; without a
name, a worker died on it and restarted into it again, every run of its queue stopped. These
find which keys they are, so the one task, run or stream can be set aside, said by name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..errors import DurableError, HistoryCorrupt
from .base import StoreBase
from .connect import is_wrong_type
from .records import text

__all__ = ["KeyTypes", "WrongKindOfKey", "is_wrong_type"]

#: What to do about a key of the wrong kind, said after its name.
REMEDY = (
    "(made by hand, or by another program sharing the database): rename it aside or delete it, and "
    "durable makes it anew (restore it from a backup to keep what it held)"
)

#: What to do about a run's own key of the wrong kind (its record, history, inbox...): it holds the
#: run's state, which nothing makes again; deleted as the message once said, the run was lost, and
#: its workflow id stayed taken by a run no command could reach.
RUN_REMEDY = (
    "put the key back as it was (rename the original back, or restore it from a backup): it holds the "
    "run's state, which durable does not make again; if that is lost, the run is too: delete the key, "
    "and `durable start` the workflow id again with --id-conflict-policy terminate_existing"
)

# The key a pipelined command names in redis-py's error: "Command # 2 (SADD durable:workers w1) of
# pipeline caused error: WRONGTYPE ...".
_PIPELINED_KEY = re.compile(r"Command # \d+ \(\w+ ([^\s)]+)")


class WrongKindOfKey(DurableError):
    """A command failed on a key of the namespace holding another kind of value (made by hand,
    or by another program sharing the database): the message names the key and what to do.

    Attributes:
        wrong: The keys found of the wrong kind, in words (``"K is a string, not a set"``);
            empty when none could be named.
    """

    def __init__(self, message: str, wrong: list[str] | None = None) -> None:
        super().__init__(message)
        self.wrong = wrong or []


class KeyTypes(StoreBase):
    """Reading what kind of value keys hold."""

    def wrong_types(self, expected: Mapping[str, str]) -> list[str]:
        """Of ``expected`` (``{key: kind}``: ``"stream"``, ``"hash"``, ``"list"``, ``"zset"``,
        ``"string"``), the keys that hold another kind, in words (``"K is a string, not a
        stream"``); a missing key is none of them. One pipelined round trip (on a cluster, one
        per key's node)."""
        return [
            f"{key} is a {kind}, not a {expected[key]}" for key, kind in self.wrong_kinds(expected).items()
        ]

    def run_wrong_types(self, p: int, run_id: str) -> list[str]:
        """:meth:`wrong_types` of the keys a decision of run ``run_id`` (partition ``p``) reads
        and writes: its own, and its partition's it shares with the other runs there."""
        k = self.keys
        return self.wrong_types(
            {
                k.run(p, run_id): "hash",
                k.history(p, run_id): "stream",
                k.inbox(p, run_id): "list",
                k.activities(p, run_id): "hash",
                k.log(p, run_id): "stream",
                k.updates(p, run_id): "hash",
                k.timers(p): "zset",
                k.running(p): "zset",
                k.outbox(p): "stream",
                k.dead(p): "stream",
                k.runs(p): "zset",
            }
        )

    def wrong_kind_error(self, p: int, run_id: str, exc: BaseException) -> HistoryCorrupt:
        """Run ``run_id`` cannot be loaded or committed: ``exc`` (``WRONGTYPE``) said a key holds
        another kind of value; which keys (read now), and what to do."""
        found = self.run_wrong_types(p, run_id)
        wrong = "; ".join(found) or str(exc)
        # Deleted, a run's own key is gone with the run's state (its history: the run).
        remedy = RUN_REMEDY if any(f":{run_id} " in w for w in found) else "delete or rename the key"
        return HistoryCorrupt(
            f"run {run_id}: its keys hold the wrong kind of value: {wrong} (made by hand, or by another "
            f"program sharing the database): {remedy}, then `durable repair` the run",
            run_id=run_id,
        )

    def cannot_write(self, doing: str, workflow_id: str, exc: BaseException) -> WrongKindOfKey:
        """The error of a client call (``doing``: ``"signal() of workflow 'x'"``) that met a key of
        ``workflow_id`` holding another kind of value (``exc``, a ``WRONGTYPE``): which keys."""
        k = self.keys
        p = k.partition(workflow_id)
        instance = k.instance(p, workflow_id)
        wrong = self.wrong_types({instance: "hash"})
        run_id = ""
        if not wrong:
            run_id = text(self.redis.hget(instance, "run") or b"")
            wrong = self.run_wrong_types(p, run_id) if run_id else []
        own = any(w.startswith(instance) or (run_id and f":{run_id} " in w) for w in wrong)
        wrong = wrong or self.namespace_wrong_types(exc)
        # A run's own keys are its state: deleted, nothing makes them again (the run is lost).
        remedy = RUN_REMEDY if own else "delete or rename the key (durable makes it again), then try again"
        return WrongKindOfKey(
            f"{doing} failed: {'; '.join(wrong) or exc} (made by hand, or by another program sharing the "
            f"database); {remedy}",
            wrong,
        )

    def namespace_wrong_types(self, exc: BaseException | None = None) -> list[str]:
        """:meth:`wrong_types` of the keys the namespace and its partitions hold once
        (``Keys.fixed_kinds``: the worker registry, the partitions' timers, runs index ...),
        and of the key a pipelined command ``exc`` failed on names, whatever it is: a value of
        another kind in one of those stops every run, and ``WRONGTYPE`` names no key."""
        expected = self.keys.fixed_kinds()
        wrong = self.wrong_types(expected)
        named = _PIPELINED_KEY.search(str(exc)) if exc is not None else None
        if named and named[1] not in expected:
            kind = text(self.redis.type(named[1]))
            if kind != "none":
                wrong.append(f"{named[1]} is a {kind}, not the kind durable keeps there")
        return wrong

    def wrong_kind_warnings(self) -> list[str]:
        """:meth:`namespace_wrong_types`, each with what to do: what ``durable workers`` and the
        API's health warn of (a partition's timers or origin of the wrong kind stops only some
        things, and no command fails to say it)."""
        return [f"Redis key {wrong} {REMEDY}" for wrong in self.namespace_wrong_types()]

    def wrong_type_error(self, exc: BaseException, doing: str = "") -> WrongKindOfKey:
        """The error of ``doing`` (``"durable list"``; may be empty) failing on ``exc``, a
        ``WRONGTYPE`` no caller could tie to one run: which of the namespace's keys
        (:meth:`namespace_wrong_types`) holds another kind, and what to do."""
        wrong = self.namespace_wrong_types(exc)
        said = (
            f"Redis key{'s' if len(wrong) > 1 else ''} {'; '.join(wrong)} {REMEDY}"
            if wrong
            else f"{str(exc).splitlines()[0]} (a key durable uses holds another kind of value)"
        )
        return WrongKindOfKey(f"{doing} failed: {said}" if doing else said, wrong)

    def wrong_kinds(self, expected: Mapping[str, str]) -> dict[str, str]:
        """:meth:`wrong_types` as ``{key: the kind it holds}``."""
        keys = list(expected)
        if not keys:
            return {}
        with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.type(key)
            kinds = [text(kind) for kind in pipe.execute()]
        return {
            key: kind for key, kind in zip(keys, kinds, strict=True) if kind not in ("none", expected[key])
        }
