"""``durable server``: the operator surface's HTTP API (the UI joins it later).

An optional part: it needs the ``server`` extra (``pip install -e '.[server]'`` in durable's checkout:
Starlette on uvicorn). Nothing in :mod:`durable` or the rest of :mod:`workers`
imports it.

* :mod:`~workers.server.app` -- :func:`create_app`, the JSON errors for unknown routes, the access log;
* :mod:`~workers.server.endpoint` -- a route as data, the checks and body reading around its handler;
* :mod:`~workers.server.workflow_routes`, :mod:`~workers.server.ops_routes` -- the handlers;
* :mod:`~workers.server.auth` -- bearer tokens and roles, the CSRF rule, hook signatures;
* :mod:`~workers.server.errors` -- the error codes; :mod:`~workers.server.openapi` -- the document;
* :mod:`~workers.server.serve` -- the uvicorn server, whose stop the routes that wait hear.
"""

from __future__ import annotations

from workers.server.app import ENDPOINTS, MAX_BODY, create_app
from workers.server.auth import AuthConfig, AuthFileError, load_auth, sign
from workers.server.errors import CODES, ApiError
from workers.server.serve import Server

__all__ = [
    "CODES",
    "ENDPOINTS",
    "MAX_BODY",
    "ApiError",
    "AuthConfig",
    "AuthFileError",
    "Server",
    "create_app",
    "load_auth",
    "sign",
]
