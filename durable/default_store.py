"""The process-wide store: one :class:`~durable.store.redis_store.RedisStore` per Redis URL and
namespace, opened at first use by whatever needs one (a stub made without ``store=``)."""

from __future__ import annotations

import threading
import time

from .config import namespace as configured_namespace
from .store.embedded import resolve_redis_url
from .store.outage import ride_out
from .store.redis_store import RedisStore

__all__ = ["default_store"]

_stores: dict[tuple[str, str], RedisStore] = {}
_stores_lock = threading.Lock()
# The last failed opening of each store: when it failed, and why.
_open_failed: dict[tuple[str, str], tuple[float, Exception]] = {}


def default_store() -> RedisStore:
    """The process-wide store for the configured Redis (``DURABLE_REDIS_URL`` or embedded) and
    namespace (``DURABLE_NAMESPACE``)."""
    url, name = resolve_redis_url(), configured_namespace()
    arrived = time.monotonic()
    with _stores_lock:
        store = _stores.get((url, name))
        if store is None:
            failed = _open_failed.get((url, name))
            if failed is not None and failed[0] >= arrived:
                # An opening that ran while this caller waited for the lock failed: its answer is
                # this caller's too (each one riding out the outage in turn, the Nth of N callers
                # waited N x 10 s).
                raise failed[1]
            try:
                # Opening reads the deployment's settings: it rides out a short outage as the calls do.
                store = ride_out(lambda: RedisStore(url, namespace=name), url=url, what="opening the store")
            except Exception as exc:
                _open_failed[url, name] = (time.monotonic(), exc)
                raise
            _stores[url, name] = store
        return store
