"""Why a run's decision could not be made, in the words its blocked reason records.

A decision that raises -- for a reason in the run's own history or code (:data:`RUN_ERRORS`),
or anything unexpected -- parks the run's workflow task and blocks the run, visible, instead of
the worker stopping on it at each delivery; ``durable repair`` re-queues it after a fix. This
module words that reason and logs what the code's fixer needs.
"""

from __future__ import annotations

import logging
from typing import Any

from durable.errors import (
    HistoryCorrupt,
    NondeterminismError,
    SerializationError,
    UnknownTypeError,
    WorkflowTaskFailed,
    error_text,
)
from durable.replay import Driver

__all__ = ["RUN_ERRORS", "undecidable"]

log = logging.getLogger("durable.worker")

RUN_ERRORS = (NondeterminismError, UnknownTypeError, HistoryCorrupt, SerializationError, WorkflowTaskFailed)
"""Raised by a run's own history or code: they block that run, the worker itself is fine."""


def undecidable(
    rid: str, driver: Driver | None, exc: Exception, worker: str = "", build: str = ""
) -> tuple[str, Any]:
    """The blocked reason of run ``rid`` whose decision raised ``exc`` (a code error names the
    ``worker`` and ``build`` that decided), and the input that did
    not decode (``None``: none; ``durable repair --drop-input`` drops exactly that one). Logs an
    unexpected error with its traceback, a failed workflow task with its code's, a corrupt
    history as an ERROR."""
    if not (expected := isinstance(exc, RUN_ERRORS)):
        log.exception("deciding run %s raised; the run is parked until `durable repair`", rid)
    elif isinstance(exc, WorkflowTaskFailed):
        log.warning("%s", exc, exc_info=exc.__cause__)
    elif isinstance(exc, HistoryCorrupt):  # the data, not the code: the operator's to mend
        log.error("%s; the run is blocked", exc)
    culprit = driver.applying if driver is not None and isinstance(exc, SerializationError) else None
    reason = error_text(exc) if expected else f"unexpected error deciding: {error_text(exc)}"
    recorded = exc.__cause__ is not None or str(exc).startswith("cannot decode")
    if isinstance(exc, SerializationError) and culprit is None and driver is not None and recorded:
        # Bytes of a recorded event that are not msgpack: the history, not an input (no
        # --drop-input can take it away), and where in it.
        reason = f"HistoryCorrupt: run {rid} seq {driver.seq_at}: a recorded payload does not decode: {exc}"
    elif driver is not None and driver.undeclared_patches:
        # Code older than the run's (an old worker of a rolling deploy, none newer left live).
        reason += (
            f" (the run recorded patches {list(driver.undeclared_patches)} that this worker's "
            f"{driver.workflow_type} does not declare, and no live worker declares them: start "
            "workers with the code that does, then `durable repair`)"
        )
    if worker and isinstance(exc, NondeterminismError | WorkflowTaskFailed):
        # Which code found it: in a fleet of old and new workers, the stale one is to be found.
        reason += f" [found by worker {worker}, build {build or 'unversioned'}]"
    return reason, culprit
