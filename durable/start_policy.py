"""Start policies: what a start does with a workflow id that ran before or is running, and the
workflow timeouts a run starts with.

* **Id reuse policy** (the id's last run is closed): ``allow_duplicate`` (the default: start a
  new run), ``allow_duplicate_failed_only`` (only when the last run did not complete: failed,
  cancelled, terminated -- a timed-out run is failed), ``reject_duplicate`` (never).
* **Id conflict policy** (the id has an open run): ``fail`` (the default of ``start()``:
  :class:`~durable.errors.WorkflowAlreadyStarted`), ``use_existing`` (the default of
  ``signal_with_start()``: the open run is the stub's run), ``terminate_existing`` (terminate it,
  then start; one script, so nothing can start in between).
* **Execution timeout**: the workflow id's runs together, continue-as-new included, must close
  before the deadline set when the first run starts. **Run timeout**: each run must close within
  it of its own start. When one passes, the run closes as ``failed`` with a
  :class:`~durable.errors.WorkflowTimeout` cause naming which; its children follow their
  ``parent_close_policy``. The status words do not change (no ``timed_out`` status).

Policies are checked in the start script (``lua/start_run.lua``), atomically with the start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ConfigurationError
from .retention import retention_ms

__all__ = [
    "EXECUTION_TIMEOUT",
    "ID_CONFLICT_POLICIES",
    "ID_REUSE_POLICIES",
    "RUN_TIMEOUT",
    "StartPolicy",
]

ID_REUSE_POLICIES = ("allow_duplicate", "allow_duplicate_failed_only", "reject_duplicate")
"""Accepted values of ``id_reuse_policy`` (first: the default)."""

ID_CONFLICT_POLICIES = ("fail", "use_existing", "terminate_existing")
"""Accepted values of ``id_conflict_policy``."""

RUN_TIMEOUT = "run"
""":attr:`WorkflowTimeout.timeout` of a run timeout."""

EXECUTION_TIMEOUT = "execution"
""":attr:`WorkflowTimeout.timeout` of an execution timeout."""


def _check(value: object, valid: tuple[str, ...], what: str) -> str:
    if not isinstance(value, str) or value not in valid:
        raise ConfigurationError(f"{what} must be one of {', '.join(valid)}; got {value!r}")
    return value


def _timeout_ms(value: Any, what: str) -> int | None:
    return None if value is None else retention_ms(value, what)


@dataclass(frozen=True)
class StartPolicy:
    """How a stub starts its workflow id (see the module docs).

    Attributes:
        id_reuse_policy: One of :data:`ID_REUSE_POLICIES`.
        id_conflict_policy: One of :data:`ID_CONFLICT_POLICIES`; ``None``: ``fail`` for
            ``start()``, ``use_existing`` for ``signal_with_start()``.
        execution_timeout_ms: Deadline of the whole execution, from its first start (ms).
        run_timeout_ms: Deadline of each run, from its start (ms).
    """

    id_reuse_policy: str = "allow_duplicate"
    id_conflict_policy: str | None = None
    execution_timeout_ms: int | None = None
    run_timeout_ms: int | None = None

    @classmethod
    def of(
        cls,
        *,
        id_reuse_policy: str = "allow_duplicate",
        id_conflict_policy: str | None = None,
        execution_timeout: Any = None,
        run_timeout: Any = None,
    ) -> StartPolicy:
        """A checked policy; timeouts as seconds, a timedelta or a duration like ``"1h"``.

        Raises:
            ConfigurationError: an unknown policy name (the message lists the valid ones) or a
                timeout that is not a positive duration.
        """
        return cls(
            _check(id_reuse_policy, ID_REUSE_POLICIES, "id_reuse_policy"),
            None
            if id_conflict_policy is None
            else _check(id_conflict_policy, ID_CONFLICT_POLICIES, "id_conflict_policy"),
            _timeout_ms(execution_timeout, "execution_timeout"),
            _timeout_ms(run_timeout, "run_timeout"),
        )

    def conflict(self, *, signal: bool) -> str:
        """The conflict policy in force for a start (``signal``: a signal-with-start).

        Raises:
            ConfigurationError: ``fail`` with a signal-with-start, which delivers to an open run.
        """
        if self.id_conflict_policy is None:
            return "use_existing" if signal else "fail"
        if signal and self.id_conflict_policy == "fail":
            raise ConfigurationError(
                "signal_with_start delivers to the open run: id_conflict_policy must be "
                "use_existing or terminate_existing, not 'fail' (use start() to fail on an open run)"
            )
        return self.id_conflict_policy

    @property
    def has_timeouts(self) -> bool:
        """Whether the run gets a workflow timeout."""
        return self.execution_timeout_ms is not None or self.run_timeout_ms is not None

    def started_options(self, now_ms: int) -> dict[str, int]:
        """What the WorkflowStarted options record of the timeouts, for a first run starting
        about ``now_ms`` (continued runs copy them: the execution deadline stays)."""
        out: dict[str, int] = {}
        if self.execution_timeout_ms is not None:
            out["execution_timeout_ms"] = self.execution_timeout_ms
            out["execution_deadline"] = now_ms + self.execution_timeout_ms
        if self.run_timeout_ms is not None:
            out["run_timeout_ms"] = self.run_timeout_ms
        return out


DEFAULT = StartPolicy()
"""Today's behaviour: restart a closed id, fail on an open one, no timeouts."""


def deadlines(options: dict[str, Any]) -> list[tuple[str, int, int]]:
    """The workflow timeouts a run with these WorkflowStarted ``options`` schedules:
    ``(which, due ms or 0, ms from the run's start or 0)``."""
    out = []
    deadline = options.get("execution_deadline")
    if isinstance(deadline, int) and deadline > 0:
        out.append((EXECUTION_TIMEOUT, deadline, 0))
    run_ms = options.get("run_timeout_ms")
    if isinstance(run_ms, int) and run_ms > 0:
        out.append((RUN_TIMEOUT, 0, run_ms))
    return out
