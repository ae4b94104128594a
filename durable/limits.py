"""Limits every run obeys: payload size, history size, pending work, names, queue names.

They keep one run (or one careless caller) from hurting everything else on the same Redis:
a 100,000-branch ``all()`` would be one commit script that blocks every client for seconds,
10,000 signals would grow one history without bound, a 1 MB signal name would be stored
in every event that carries it. The defaults follow Temporal's:

=========================  =============  ==========================================
limit                      default        environment variable
=========================  =============  ==========================================
payload size               2 MiB          ``DURABLE_MAX_PAYLOAD_BYTES``
payload size warning       256 KiB        ``DURABLE_WARN_PAYLOAD_BYTES``
history events per run     51,200         ``DURABLE_MAX_HISTORY_EVENTS``
history bytes per run      50 MiB         ``DURABLE_MAX_HISTORY_BYTES``
pending activities/run     2,000          ``DURABLE_MAX_PENDING_ACTIVITIES``
pending children/run       2,000          ``DURABLE_MAX_PENDING_CHILDREN``
pending signals/run        2,000          ``DURABLE_MAX_PENDING_SIGNALS``
signal/query/hook names    255 chars      ``DURABLE_MAX_NAME_LENGTH``
queue names                ``[A-Za-z0-9_.-]{1,100}``  (not configurable)
=========================  =============  ==========================================

The values are read from the environment once per process, at first use; a process that
needs other values calls :func:`set_limits` (tests) or sets the variables before it starts
(workers). Every check raises :class:`~durable.errors.LimitExceeded` (or its subclass
:class:`~durable.errors.PayloadTooLarge`) naming the limit, its value and the variable
that raises it. See ``docs/operations.md`` ("Limits") for what each breach does to a run.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from dataclasses import dataclass

from .errors import ConfigurationError, LimitExceeded

__all__ = [
    "ENV",
    "LIMIT_REASON",
    "QUEUE_NAME",
    "Limits",
    "check_name_length",
    "check_queue_name",
    "current",
    "cut_reason",
    "input_bounds",
    "input_refused",
    "limit_error",
    "reset_limits",
    "set_limits",
]

#: Queue names: 1-100 of letters, digits, ``_ . -``. A leading ``@`` is reserved for a
#: worker's private queue (``store.keys.is_private``), which users never name.
QUEUE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,100}")

#: Start of the reason of a ``WorkflowTerminated`` the engine wrote because the run broke a
#: limit; replay knows from it that code past that point never ran.
LIMIT_REASON = "limit exceeded: "


@dataclass(frozen=True)
class Limits:
    """The limits of this process (see the module docstring for what each one bounds).

    Attributes:
        max_payload_bytes: Largest encoded payload (arguments, result, signal payload,
            side-effect value) in bytes; a larger one raises ``PayloadTooLarge``.
        warn_payload_bytes: Payloads above this size are logged as a warning.
        max_history_events: Events a run's history may hold; the decision that passes it
            terminates the run.
        max_history_bytes: Bytes a run's history may hold; likewise. A signal or update is
            refused at the client once the signals and updates the run took would pass it.
        max_pending_activities: Activities a run may have scheduled and not finished; the
            call that would pass it terminates the run.
        max_pending_children: Child workflows a run may have started and not finished; likewise.
        max_pending_signals: Inputs (signals, results) waiting in a run's inbox, not yet
            decided; a signal beyond it is refused at the client.
        max_name_length: Longest signal, query or hook name.
    """

    max_payload_bytes: int = 2 * 1024 * 1024
    warn_payload_bytes: int = 256 * 1024
    max_history_events: int = 51_200
    max_history_bytes: int = 50 * 1024 * 1024
    max_pending_activities: int = 2_000
    max_pending_children: int = 2_000
    max_pending_signals: int = 2_000
    max_name_length: int = 255

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigurationError(f"Limits.{field.name} must be a positive integer, not {value!r}")

    @classmethod
    def from_env(cls) -> Limits:
        """The defaults, overridden by the ``DURABLE_MAX_*`` variables that are set.

        Raises:
            ConfigurationError: A variable is not a positive integer.
        """
        given: dict[str, int] = {}
        for field, var in ENV.items():
            raw = os.environ.get(var, "").strip().replace("_", "")
            if not raw:
                continue
            try:
                given[field] = int(raw)
            except ValueError:
                raise ConfigurationError(f"{var}={raw!r} is not an integer") from None
            if given[field] <= 0:
                raise ConfigurationError(f"{var} must be positive, not {given[field]}")
        return cls(**given)


#: The environment variable of each limit.
ENV: dict[str, str] = {f.name: f"DURABLE_{f.name.upper()}" for f in dataclasses.fields(Limits)}

_current: Limits | None = None
_lock = threading.Lock()


def current() -> Limits:
    """This process's limits: :func:`set_limits`'s, else read from the environment once."""
    global _current
    limits = _current
    if limits is None:
        with _lock:
            if _current is None:
                _current = Limits.from_env()
            limits = _current
    return limits


def set_limits(limits: Limits | None) -> None:
    """Use ``limits`` in this process from now on; ``None``: read the environment again."""
    global _current
    with _lock:
        _current = limits


def reset_limits() -> None:
    """Forget the limits in use: the next check reads the environment again."""
    set_limits(None)


def limit_error(field: str, what: str, actual: int | None = None) -> LimitExceeded:
    """A :class:`LimitExceeded` for ``field`` of :class:`Limits`: what broke it, the value, the cure."""
    value = getattr(current(), field)
    shown = f"{actual:,} > {value:,}" if actual is not None else f"{value:,}"
    return LimitExceeded(
        f"{what}: limit {field} exceeded ({shown}); raise it with {ENV[field]} if this is intended",
        limit=field,
        value=value,
        actual=actual,
    )


def input_bounds() -> list[int]:
    """The limits a run takes a client's input (signal, update) within, in the order the scripts
    read them (``take_input`` in ``_lib.lua``): most inputs waiting, most history events, most
    bytes of client inputs (all of them go into its history, so ``max_history_bytes``)."""
    limits = current()
    return [limits.max_pending_signals, limits.max_history_events, limits.max_history_bytes]


_REFUSED_AT = {
    "max_pending_signals": "inputs waiting to be decided",
    "max_history_events": "history events",
    "max_history_bytes": "bytes of the signals and updates it took (each goes into its history)",
}


def input_refused(limit: str, what: str, count: int) -> LimitExceeded:
    """The error for a client's input a run refused at ``limit`` (``count``: what the script
    counted: items or events before this input, bytes with it)."""
    actual = count if limit == "max_history_bytes" else count + 1
    return limit_error(limit, f"{what}: {_REFUSED_AT.get(limit, limit)}", actual)


#: Longest cancel or terminate reason kept, in characters (as an error message is cut).
MAX_REASON = 2_000


def cut_reason(reason: str) -> str:
    """A cancel or terminate reason as it is kept: its first :data:`MAX_REASON` characters,
    marked when cut. A 20 MB reason was stored whole, in the history, the runs list and every
    ``result()`` error, past every payload and history budget."""
    if len(reason) <= MAX_REASON:
        return reason
    return f"{reason[:MAX_REASON]}... [reason of {len(reason):,} characters cut]"


def check_name_length(name: str, what: str) -> str:
    """Refuse a signal, query or hook name longer than ``max_name_length``, or holding a control
    character (a newline would forge a line of every log that names it).

    Raises:
        LimitExceeded: The name is too long (the message shows its start, not all of it).
        ConfigurationError: The name holds a control character.
    """
    if len(name) > current().max_name_length:
        raise limit_error("max_name_length", f"{what} name {name[:40]!r}... is too long", len(name))
    if not name.isprintable():
        raise ConfigurationError(f"{what} name {name[:40]!r} holds a control character: use printable text")
    return name


def check_queue_name(queue: str, what: str = "queue") -> str:
    """Refuse a queue name outside ``[A-Za-z0-9_.-]{1,100}``.

    Raises:
        ConfigurationError: The name is not a string or breaks the format.
    """
    if not isinstance(queue, str) or QUEUE_NAME.fullmatch(queue) is None:
        shown = (
            repr(queue[:40]) + ("..." if len(queue) > 40 else "") if isinstance(queue, str) else repr(queue)
        )
        raise ConfigurationError(
            f"invalid {what} name {shown}: use 1-100 characters from letters, digits, _ . - "
            "(a leading '@' is reserved for workers' private queues)"
        )
    return queue
