"""``durable worker --app apps.tenant --app apps.tenant_worker``: apps.tenant's worker-side
interceptor, registered in the worker process only."""

from apps.tenant import WorkerTenant
from durable import interceptors

interceptors.register(WorkerTenant())
