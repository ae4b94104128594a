"""The workflow logger: log lines from workflow code, once per live decision, none on replay.

Workflow code re-runs from the start whenever its run is replayed (a worker's
cache missed it, a worker restarted). A plain ``logging`` call in ``handle()``
would then repeat every line already logged. :data:`logger` (also
``durable.workflow_logger()``) drops records while the driver deciding on this
thread re-runs code for history that an earlier decision already made, and adds
the run's ``workflow_id``, ``run_id`` and ``workflow_type`` to each record it
lets through (the worker's text and JSON log formats show them).

The driver marks itself active on its thread for the length of each
:meth:`~durable.replay.Driver.replay` and :meth:`~durable.replay.Driver.decide`,
so the logger also works in signal handlers and ``@update`` handlers, which run
outside the workflow's branch greenlets.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from ..active_driver import active_driver

__all__ = ["WorkflowLogger", "active_driver", "logger", "workflow_logger"]

DEFAULT_NAME = "durable.workflow.code"
"""The logger workflow code's records go to (a child of ``durable.workflow``)."""


class WorkflowLogger(logging.LoggerAdapter):  # type: ignore[type-arg,unused-ignore]
    """A :class:`logging.LoggerAdapter` for workflow code, silent while its run is replayed.

    Outside workflow code (activities, scripts) it logs like the logger it wraps.
    """

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 - the logging API's name
        driver = active_driver()
        if driver is not None and driver.is_replaying:
            return False
        return self.logger.isEnabledFor(level)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        driver = active_driver()
        if driver is not None:
            extra = dict(kwargs.get("extra") or {})
            extra.setdefault("workflow_id", driver.workflow_id)
            extra.setdefault("run_id", driver.run_id)
            extra.setdefault("workflow_type", driver.workflow_type)
            kwargs["extra"] = extra
        return msg, kwargs


def workflow_logger(name: str = DEFAULT_NAME) -> WorkflowLogger:
    """A logger for workflow code: one line per live decision, nothing while the run replays.

    Args:
        name: The :mod:`logging` logger the records go to.

    Example::

        log = durable.workflow_logger()

        class Order(durable.Workflow):
            def handle(self, order_id):
                log.info("charging %s", order_id)   # once, even if the run is replayed
                durable.activity(Charge, order_id)
    """
    return WorkflowLogger(logging.getLogger(name), {})


logger = workflow_logger()
"""The default :class:`WorkflowLogger` (records go to ``durable.workflow.code``)."""
