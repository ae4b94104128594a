"""Riding out a Redis outage: back off, log it once, carry on.

A worker never gives up on Redis: a stall longer than the socket timeout, a
script running past ``lua-time-limit`` (BUSY), a restart loading its dataset
(LOADING), ``maxmemory`` reached under ``noeviction`` (OOM) all end, and every
write of durable's is safe to send again. So each part of a worker (its loop,
its scheduler, the threads recording activity results) retries for as long as
the outage lasts, waiting a little longer each time (:class:`Backoff`), and
reports the outage as one **incident** (:class:`Incident`): a WARNING when it
starts, naming the error, and an INFO when it ends, with its duration -- not a
line per retry. Which errors count is :func:`~durable.store.connect.is_transient`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis import exceptions as rexc

from ..errors import ConfigurationError, RedisUnavailable
from .connect import (
    MAX_CLIENTS_FIX,
    first_line,
    is_redis_error,
    login_refused,
    masked_url,
    not_redis,
    unavailable_kind,
)

T = TypeVar("T")

FIRST_DELAY_S = 0.1
"""The first wait after a failure."""

MAX_DELAY_S = 5.0
"""The longest wait between two tries (an outage's end is noticed within about this)."""

CLIENT_RIDE_S = 10.0
"""How long a client call (``start``, ``signal``, ``query``, ``status`` ...) rides out Redis
being unavailable before it raises :class:`~durable.errors.RedisUnavailable` (about as long as
Temporal's clients retry an RPC): a restart or a failover takes seconds, and a web handler
starting a run should neither fail on it nor hang for minutes. ``RedisStore(client_ride_s=)``
sets it per store (the CLI and the HTTP server use 0: an operator wants the answer now)."""

log = logging.getLogger("durable.client")


class Backoff:
    """Capped exponential backoff with jitter: ``first``, doubling up to ``cap`` seconds, each
    delay drawn from its upper half (so many workers do not retry in step).

    Args:
        first: The first delay, in seconds.
        cap: The longest delay, in seconds.
    """

    def __init__(self, first: float = FIRST_DELAY_S, cap: float = MAX_DELAY_S) -> None:
        self.first = first
        self.cap = cap
        self._tries = 0

    def next(self) -> float:
        """The delay before the next try (longer each call, up to the cap)."""
        delay = min(self.cap, self.first * 2 ** min(self._tries, 30))
        self._tries += 1
        return delay * random.uniform(0.5, 1.0)

    def reset(self) -> None:
        """Start from the first delay again (call after a success)."""
        self._tries = 0


class Incident:
    """One part of a worker's view of Redis outages, logged once each (thread-safe).

    :meth:`failed` on every transient error (the first one of an outage logs a WARNING
    naming it) returns how long to wait; :meth:`recovered` on every success (the first one
    after an outage logs an INFO line with its duration, tries and error kinds).

    Args:
        log: Where to log.
        what: Which part of the worker retries (``"worker loop"``, ``"scheduler"``...).
        settle: A success only ends the incident once no failure came for this many
            seconds (a loop whose reads still work while its writes are refused would
            otherwise report an outage per write); ``0``: at the first success.
        cap: The longest wait between two tries, in seconds.
        until: How long it retries, in words (the WARNING's end).
    """

    def __init__(
        self,
        log: logging.Logger,
        what: str,
        *,
        settle: float = 0.0,
        cap: float = MAX_DELAY_S,
        until: str = "until it answers, no work is lost meanwhile",
    ) -> None:
        self.log = log
        self.what = what
        self.until = until
        self.settle = settle
        self.backoff = Backoff(cap=cap)
        self._lock = threading.Lock()
        self._started: float | None = None
        self._last_failure = 0.0
        self._ok_since: float | None = None  # the first success after the last failure
        self._tries = 0
        self._kinds: list[str] = []

    @property
    def active(self) -> bool:
        """Whether an outage is going on (a failure not yet followed by a settled success)."""
        return self._started is not None

    @property
    def lasted(self) -> float:
        """Seconds since the outage going on started (``0.0``: none is)."""
        started, now = self._started, time.monotonic()
        return 0.0 if started is None or self._settled(now) else now - started

    def _settled(self, now: float) -> bool:
        """Whether a success came and no failure for ``settle`` seconds: the outage is over,
        whether or not a later success has said so yet (the calls that saw it may have ended)."""
        return self._ok_since is not None and now - self._last_failure >= self.settle

    def failed(self, exc: BaseException) -> float:
        """Note a transient failure; returns the seconds to wait before trying again."""
        kind = unavailable_kind(exc) or type(exc).__name__
        now = time.monotonic()
        with self._lock:
            if self._started is not None and self._settled(now):
                self._started = None  # the last outage ended unsaid: this failure starts a new one
            first = self._started is None
            if first:
                self._started = now
                self._tries = 0
                self._kinds = []
                self.backoff.reset()
            self._last_failure = now
            self._ok_since = None
            self._tries += 1
            if kind not in self._kinds:
                self._kinds.append(kind)
            delay = self.backoff.next()
        if first:
            self.log.warning(
                "redis unavailable (%s: %s); the %s retries with backoff (%.1f s up to %.0f s) %s",
                kind,
                first_line(exc),
                self.what,
                self.backoff.first,
                self.backoff.cap,
                self.until,
            )
        return delay

    def recovered(self) -> bool:
        """Note a success: ends the incident (once settled), logging its duration.

        Returns whether it is the first success since a failure: Redis answers again, settled
        or not, and what lapsed or was lost meanwhile (a worker's registry entry) can be
        written again now. A success within ``settle`` of the last failure leaves a timer that
        says the outage is over once it settled, should no later call come to say so.
        """
        if self._started is None:
            return False
        now = time.monotonic()
        with self._lock:
            if self._started is None:
                return False
            back = self._ok_since is None
            if back:
                self._ok_since = now
            wait = self.settle - (now - self._last_failure)
            if wait > 0:
                if back:  # one timer per answer after failures: a failure meanwhile voids it
                    timer = threading.Timer(wait + 0.05, self._over_if_settled)
                    timer.daemon = True
                    timer.start()
                return back
            ended = self._end()
        self._say_over(*ended)
        return back

    def _over_if_settled(self) -> None:
        """The settle timer: the outage is over if no failure came since the answer."""
        with self._lock:
            if self._started is None or not self._settled(time.monotonic()):
                return
            ended = self._end()
        self._say_over(*ended)

    def _end(self) -> tuple[float, int, str]:
        """End the incident (the lock held): its duration, failed tries and error kinds."""
        assert self._started is not None and self._ok_since is not None
        ended = (self._ok_since - self._started, self._tries, ", ".join(self._kinds))
        self._started = None
        self.backoff.reset()
        return ended

    def _say_over(self, duration: float, tries: int, kinds: str) -> None:
        self.log.info(
            "redis available again: the %s carries on after %.1f s of outage (%s; %d failed tries)",
            self.what,
            duration,
            kinds,
            tries,
        )


def retry_transient(call: Callable[[], T], incident: Incident, *, stop: threading.Event | None = None) -> T:
    """``call()``, tried again after each transient Redis error (for as long as the outage
    lasts), waiting as ``incident`` says; any other error is raised, and so is a transient
    one once ``stop`` is set."""
    while True:
        try:
            result = call()
        except Exception as exc:
            if unavailable_kind(exc) is None or (stop is not None and stop.is_set()):
                raise
            delay = incident.failed(exc)
            if stop is not None:
                stop.wait(delay)
            else:
                time.sleep(delay)
            continue
        incident.recovered()
        return result


def client_incident() -> Incident:
    """A client's outage log: one per store (``RedisStore.client_outage``), which its calls riding
    an outage out and its ``result()`` and ``update()`` waits share, so an outage is one WARNING,
    not one per call. A success only ends it after a second without failures, so that calls and
    waits failing and answering in turn as Redis goes down or comes back do not log it twice."""
    return Incident(
        log,
        "client of this process",
        settle=1.0,
        cap=2.0,
        until=(
            "(its calls for up to RedisStore.client_ride_s, 10 s; its result() and update() "
            "waits for up to 60 s), then raises RedisUnavailable"
        ),
    )


_opening = client_incident()
"""The outage log of the calls made before a store exists (opening the default one)."""


def unavailable_error(
    exc: BaseException, url: str | None, what: str, seconds: float, *, writes: str = ""
) -> RedisUnavailable:
    """The :class:`~durable.errors.RedisUnavailable` ending ``what`` (``"start()"``...) after
    ``seconds`` of ``exc``; ``writes``: the workflow id a write of the call went to, if any."""
    from .memory import REFUSALS, write_refusal  # (memory.py's store base imports this module)

    kind = unavailable_kind(exc) or type(exc).__name__
    where = masked_url(url or "redis")
    down = kind in ("connection lost", "timeout", "cluster reconfiguring")
    refusal = REFUSALS.get(write_refusal(exc) or "")
    head = f"cannot reach Redis at {where}" if down else f"Redis at {where} refuses commands for now"
    if refusal is not None:  # out of memory, or cannot persist: says so, with its remedy
        head = f"{refusal.headline} at {where}: it refuses writes"
    tried = f" for {seconds:.0f} s, so {what} gave up" if seconds >= 0.5 else ""
    fix = (
        "check that it runs and is the Redis the workers use (DURABLE_REDIS_URL, --redis)"
        if down
        else refusal.remedy
        if refusal is not None
        else f"it has as many connections as its maxclients allows: {MAX_CLIENTS_FIX}"
        if kind == "maxclients"
        else "see `durable workers` and Redis's log"
    )
    landed = (
        f"; it may have landed before the outage: look with `durable status {writes}` before sending it again"
        if writes and refusal is None  # a refused write (its first) wrote nothing
        else ""
    )
    error = RedisUnavailable(
        f"{head} ({kind}: {first_line(exc)}){tried}: {fix}{landed}", url=where, kind=kind, seconds=seconds
    )
    error.__cause__ = exc  # also where it is handed to a waiting caller rather than raised here
    return error


class _Ride:
    """One client call's ride through an outage: how long to wait before each try, until
    ``within`` seconds have passed since it began (see :func:`ride_out`)."""

    def __init__(
        self, url: str | None, what: str, within: float, writes: str, outage: Incident | None
    ) -> None:
        self.url, self.what, self.within, self.writes = url, what, within, writes
        self.started = time.monotonic()
        self.outage = outage or _opening
        self.failing = False  # a try failed: the next success is noted in the outage log

    def wait_after(self, exc: Exception) -> float:
        """Seconds to wait before the next try; raises ``exc`` when it is no outage, and
        :class:`~durable.errors.RedisUnavailable` once ``within`` has passed."""
        if isinstance(exc, rexc.AuthenticationError):  # stays refused: no outage to wait out
            raise ConfigurationError(login_refused(self.url, exc)) from exc
        if isinstance(exc, rexc.InvalidResponse):
            raise ConfigurationError(not_redis(self.url, exc)) from exc
        # Only Redis's own errors: a builtin TimeoutError is a wait's deadline, not an outage.
        if not is_redis_error(exc) or unavailable_kind(exc) is None:
            raise exc
        spent = time.monotonic() - self.started
        if spent >= self.within:  # a last try at ``within``: the end of a restart is not missed
            raise unavailable_error(exc, self.url, self.what, spent, writes=self.writes) from exc
        self.failing = True
        return min(self.outage.failed(exc), self.within - spent)

    def done(self) -> None:
        if self.failing:
            self.outage.recovered()


def ride_out(
    call: Callable[[], T],
    *,
    url: str | None,
    what: str,
    within: float = CLIENT_RIDE_S,
    writes: str = "",
    outage: Incident | None = None,
    resend: Callable[[], T] | None = None,
) -> T:
    """``call()``, tried again through a Redis outage for up to ``within`` seconds, then
    :class:`~durable.errors.RedisUnavailable` (:func:`unavailable_error`). Other errors are
    raised as they are. ``call`` must be safe to repeat: a timed-out send may have run.
    ``resend``: what the tries after a failed one run instead (a write whose first try may
    have landed takes finding its own work done for success). ``outage``: where the outage
    is logged (default: that of the calls made before a store exists)."""
    ride = _Ride(url, what, within, writes, outage)
    attempt = call
    while True:
        try:
            result = attempt()
        except Exception as exc:  # noqa: BLE001 - wait_after raises what is no outage
            time.sleep(ride.wait_after(exc))
            attempt = resend or call
            continue
        ride.done()
        return result


async def ride_out_async(
    call: Callable[[], Awaitable[T]],
    *,
    url: str | None,
    what: str,
    within: float = CLIENT_RIDE_S,
    writes: str = "",
    outage: Incident | None = None,
) -> T:
    """:func:`ride_out` for a coroutine function (the event loop sleeps between the tries)."""
    ride = _Ride(url, what, within, writes, outage)
    while True:
        try:
            result = await call()
        except Exception as exc:  # noqa: BLE001 - wait_after raises what is no outage
            await asyncio.sleep(ride.wait_after(exc))
            continue
        ride.done()
        return result
