"""Sending an update from a client, shared by the sync and the async stub: the checks made
before anything is written, the client interceptors (``update_workflow``), the delivery.

Waiting for the outcome is not here: the sync stub blocks on the run's history
(:func:`durable.store.updates.wait_update`), the async one awaits it (:mod:`durable.store.aio`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from . import codec, interceptors
from .errors import ConfigurationError, DurableError, UpdateRejected
from .ids import check_command_id, new_run_id
from .interceptors import ClientInterceptor, UpdateWorkflowInput
from .limits import check_name_length
from .registry import get_workflow
from .store.redis_store import RedisStore, RunRef
from .store.updates import deliver_update


class Delivery(NamedTuple):
    """A delivered update: its run, its id, and the history stream id to read its outcome after."""

    ref: RunRef
    update_id: str
    after: str


def check_update_name(workflow_type: str, name: str) -> None:
    """Refuse an unknown update name before writing, when this process has the class."""
    try:
        cls = get_workflow(workflow_type)
    except DurableError:
        return  # not registered here: the run's worker rejects an unknown name
    if name not in cls._updates:
        raise UpdateRejected(
            f"workflow {workflow_type!r} has no @update {name!r}; it has {sorted(cls._updates)}",
            name=name,
        )


def send_update(
    store: RedisStore,
    workflow_type: str,
    workflow_id: str,
    name: str,
    args: Sequence[Any],
    update_id: str | None,
) -> Delivery:
    """Check update ``name`` and deliver it through the client interceptors (their headers
    are recorded with the update).

    Raises:
        ConfigurationError: an empty name or a bad ``update_id``.
        UpdateRejected: this process knows the workflow class and it has no such ``@update``.
        SerializationError: an argument cannot be encoded (nothing written).
        WorkflowNotFound, WorkflowClosed, LimitExceeded: as :func:`deliver_update`.
    """
    if not isinstance(name, str) or not name:
        raise ConfigurationError("update name must be a non-empty string")
    check_name_length(name, "update")
    uid = check_command_id(update_id) if update_id is not None else f"u-{new_run_id().lower()}"
    check_update_name(workflow_type, name)

    def deliver(request: UpdateWorkflowInput) -> Delivery:
        payload = codec.dumps(tuple(request.args), path="args")
        ref, after = deliver_update(
            store, request.workflow_id, request.update_id, request.name, payload, request.headers
        )
        return Delivery(ref, request.update_id, after)

    request = UpdateWorkflowInput(workflow_id, name, tuple(args), uid)
    delivery: Delivery = interceptors.run(ClientInterceptor, "update_workflow", request, deliver)
    return delivery
