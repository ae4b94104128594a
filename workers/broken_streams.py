"""Task streams whose key holds another kind of value, set aside from the worker's reads; and
any other key of the wrong kind a pass of the worker meets, said without stopping the worker.

One ``XREADGROUP`` reads all of a worker's streams; a stream made a string by hand (or by
another program sharing the database) failed that read with ``WRONGTYPE``, naming no key, and
the worker exited -- and every worker started after it -- so every queue stopped, not only
that stream's. The worker finds which streams are of the wrong kind, says so by name once,
reads the others, and looks again every :data:`RECHECK_S` (a key deleted or renamed is made
again as a stream, and read again).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from durable.quiet import Quiet
from durable.store.key_types import is_wrong_type
from durable.store.redis_store import RedisStore

log = logging.getLogger("durable.worker")

RECHECK_S = 5.0
"""How often the streams set aside are looked at again (one TYPE each): a run repaired once its
stream was mended waited up to 30 s more, status saying only that a worker would take it."""


class BrokenStreams:
    """The streams a worker does not read for now, because their key holds another kind."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._aside: dict[str, str] = {}  # stream -> the kind its key held
        self._next_check = 0.0

    def usable(self, streams: list[str]) -> list[str]:
        """``streams`` but those set aside (looked at again every :data:`RECHECK_S`)."""
        if not self._aside:
            return streams  # every pass: nothing to do, nothing copied
        if time.monotonic() >= self._next_check:
            self._next_check = time.monotonic() + RECHECK_S
            still = self.store.wrong_kinds(dict.fromkeys(self._aside, "stream"))
            for stream in set(self._aside) - set(still):
                log.info("task stream %s is a stream again: reading it", stream)
            self._aside = still
        return [s for s in streams if s not in self._aside]

    def set_aside(self, exc: BaseException, streams: Sequence[str]) -> bool:
        """After ``exc`` failed a read of ``streams``: set aside those of the wrong kind, each
        said once as an ERROR; whether any was (else ``exc`` is not about them)."""
        if not is_wrong_type(exc):
            return False
        found = self.store.wrong_kinds(dict.fromkeys(streams, "stream"))
        for stream, kind in found.items():
            log.error(
                "task stream %s is a %s, not a stream (made by hand, or by another program sharing the "
                "database): its tasks are not read until it is one again; delete or rename the key "
                "(durable makes it again) -- the other streams are read meanwhile",
                stream,
                kind,
            )
        self._aside.update(found)
        self._next_check = time.monotonic() + RECHECK_S
        return bool(found)

    def met(self, exc: BaseException) -> bool:
        """After ``exc`` cut a pass short: whether it is a key of the wrong kind (a child's start
        the key refused, say: the outbox message stays pending and is tried again), said at most
        once a minute per error, the pass tried again a second later. It stopped the worker, and
        every worker that met the key after it."""
        if not said_wrong_kind(self.store, exc, "a pass of this worker (it goes on)"):
            return False
        time.sleep(1.0)
        return True


def said_wrong_kind(store: RedisStore, exc: BaseException, doing: str) -> bool:
    """Whether ``exc`` is a key of the wrong kind (``WRONGTYPE``), which ``doing`` met; if so,
    logged as an ERROR naming the key (read now: Redis's error names none), each key at most
    once a minute in this process, whatever met it. A WARNING with the bare error, every
    heartbeat, named nothing to fix."""
    if not is_wrong_type(exc):
        return False
    try:
        error = store.wrong_type_error(exc, doing)
        said, named = str(error), tuple(error.wrong)
    except Exception:  # noqa: BLE001 - reading the kinds failed too: say what is known
        said = f"{doing} failed: {str(exc).splitlines()[0][:300]}"
        named = ()
    if _said.due(named or doing):
        log.error("%s", said)
    return True


_said = Quiet()  # the keys of the wrong kind said (by the keys, else by what met them)
