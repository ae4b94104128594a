"""A workflow whose update handler calls an activity, and the interceptors that carry a tenant
header on updates, for tests/test_update_headers.py. ``apps.tenant_worker`` registers the
worker-side interceptor (so a test process importing this module registers nothing)."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from durable import Activity, Workflow, activity, await_signal, update
from durable.interceptors import (
    ExecuteActivityInput,
    HandleUpdateInput,
    Interceptor,
    Next,
    UpdateWorkflowInput,
)

_attempt_tenant: ContextVar[Any] = ContextVar("tenant", default=None)


class TenantSeen(Activity):
    """Returns the tenant header its attempt got (set by the activity interceptor)."""

    def handle(self) -> Any:
        return _attempt_tenant.get()


class TenantCart(Workflow):
    def handle(self) -> str:
        return await_signal("done")

    @update
    def tag(self, value: str) -> dict:
        return {"value": value, "activity_tenant": activity(TenantSeen)}


class ClientTenant(Interceptor):
    """The client side: adds a tenant header to every update."""

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant

    def update_workflow(self, input: UpdateWorkflowInput, next: Next) -> Any:  # noqa: A002
        input.headers["tenant"] = self.tenant
        return next(input)


class WorkerTenant(Interceptor):
    """The worker side: updates without a tenant are rejected; the handler's result says which
    tenant it saw; an activity attempt exposes its tenant to the activity."""

    def validate_update(self, input: HandleUpdateInput, next: Next) -> Any:  # noqa: A002
        if "tenant" not in input.headers:
            raise PermissionError(f"update {input.name!r} has no tenant header")
        return next(input)

    def handle_update(self, input: HandleUpdateInput, next: Next) -> Any:  # noqa: A002
        result = next(input)
        return {**result, "handler_tenant": input.headers.get("tenant")}

    def execute_activity(self, input: ExecuteActivityInput, next: Next) -> Any:  # noqa: A002
        token = _attempt_tenant.set(input.headers.get("tenant"))
        try:
            return next(input)
        finally:
            _attempt_tenant.reset(token)
