"""The ASGI application: :func:`create_app` puts the routes, the JSON errors and the access log
together over one store."""

from __future__ import annotations

import logging
import re
import time
from typing import Any
from urllib.parse import unquote

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route, get_route_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import durable
from durable.store.redis_store import RedisStore
from workers import metrics
from workers.server import ops_routes, workflow_routes
from workers.server.auth import LOOPBACK_ONLY, AuthConfig, loopback_host
from workers.server.endpoint import Call, Endpoint, error_response, view
from workers.server.errors import ApiError, from_exception
from workers.server.openapi import openapi_document
from workers.server.ui import ui_routes

__all__ = ["ENDPOINTS", "MAX_BODY", "create_app", "masked_path"]

MAX_BODY = 1 << 20
"""Largest request body accepted by default (1 MiB); larger ones get ``413 payload_too_large``."""

access_log = logging.getLogger("durable.server.access")
_HOOK_PATH = re.compile(r"(/api/v1/hooks/)[^/?]+")


def _openapi(call: Call) -> dict[str, Any]:
    return openapi_document(ENDPOINTS, durable.__version__)


ENDPOINTS: list[Endpoint] = [
    *ops_routes.ENDPOINTS[:1],
    Endpoint("GET", "/api/v1/openapi.json", _openapi, "public", "This OpenAPI document"),
    *workflow_routes.ENDPOINTS,
    *ops_routes.ENDPOINTS[1:],
]
"""Every route of the API."""


def masked_path(path: str) -> str:
    """``path`` fit for a log line: a hook token in it replaced by ``***``."""
    return _HOOK_PATH.sub(r"\1***", path)


class AccessLog:
    """One log line per request: method, path (hook tokens masked), status, milliseconds.

    Replaces uvicorn's access log, which would print a hook token in the path.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), [0]

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            access_log.info(
                "%s %s %d %.1fms",
                scope["method"],
                printable(masked_path(scope["path"])),
                status[0],
                (time.perf_counter() - started) * 1000,
            )


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x00``): a request's decoded path
    is the client's to choose, and a newline in it would forge a line of the access log."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class LoopbackHosts:
    """Without tokens, every route -- the pages and their static files, ``/healthz``,
    ``/metrics``, the OpenAPI document, not only the API -- answers only a loopback ``Host``:
    a page reached through DNS rebinding gets nothing from this server."""

    def __init__(self, app: ASGIApp, auth: AuthConfig) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.auth.enabled:
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if not loopback_host(host):
                await error_response(ApiError("forbidden", LOOPBACK_ONLY))(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _http_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, HTTPException) and exc.status_code == 405:
        allow = _allowed_methods(request)
        message = f"{request.method} is not allowed here" + (f"; this route takes {allow}" if allow else "")
        return error_response(
            ApiError("method_not_allowed", message, headers={"Allow": allow} if allow else None)
        )
    if isinstance(exc, HTTPException) and exc.status_code == 404:
        return error_response(ApiError("not_found", f"no route {masked_path(request.url.path)}"))
    return error_response(from_exception(exc))


def _allowed_methods(request: Request) -> str:
    """The methods the path takes (RFC 9110's ``Allow``): Starlette names only those of the
    first route matching the path, and ``GET`` and ``POST`` of a path are two routes here."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))


def _path_ids(path: str) -> str:
    return path.replace("/workflows/{id}", "/workflows/{id:path}")


class DescribeRoute(Route):
    """The describe route, ``/workflows/{id:path}``: it yields a path another route of the API
    takes (``.../u1/cancel``), whatever the method, to that route.

    Otherwise ``GET .../u1/cancel`` described a run ``u1/cancel`` (a 404 naming a made-up id)
    instead of a 405 saying the route takes POST. A run whose id itself ends so is described
    with its "/" escaped (``u1%2Fcancel``, see :class:`EncodedSlashes`).
    """

    def __init__(self, *args: Any, others: list[Route], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.others = others

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and any(o.path_regex.match(get_route_path(scope)) for o in self.others):
            return Match.NONE, {}
        return super().matches(scope)


RAW_IDS = "durable.raw_ids"
"""Set in the ASGI scope when a workflow route's path kept its ``%2F`` and ``%25`` escapes
(:class:`EncodedSlashes`); :mod:`.endpoint` then unquotes the path parameters itself."""


class EncodedSlashes:
    """Route ``/api/v1/workflows/...`` on the path with ``%2F`` still escaped.

    A workflow id may hold "/" (a child's is ``<parent>/<n>``). Decoded before routing, the id
    ``x/history`` sent as ``x%2Fhistory`` would read as the history route of run ``x``. Kept
    escaped, it matches the describe route as the one id it is; an unescaped "/" still works
    as before for ids the routes cannot mistake.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw and raw.startswith(b"/api/v1/workflows/") and re.search(rb"%2[fF]", raw):
            # Every other escape is decoded as usual; "%" itself is escaped again so that
            # unquoting the parameters afterwards is exact.
            parts = re.split(rb"%2[fF]", raw)
            path = "%2F".join(unquote(p.decode("ascii", "replace")).replace("%", "%25") for p in parts)
            scope = {**scope, "path": path, RAW_IDS: True}
        await self.app(scope, receive, send)


def _metrics_route(store: RedisStore) -> Route:
    registry = metrics.registry_for(store, None, fresh=True)

    def scrape(_request: Request) -> Response:
        body, content_type = metrics.exposition(registry)
        return Response(body, media_type=content_type)

    return Route("/metrics", scrape, methods=["GET"], name="metrics")


def create_app(store: RedisStore, auth: AuthConfig | None = None, *, max_body: int = MAX_BODY) -> Starlette:
    """The API over ``store``, and the web UI (``/``, ``/workflows/{id}``, ... see :mod:`.ui`).

    Args:
        store: The namespace's store; its client is used from Starlette's thread pool.
        auth: Tokens and hook secret (default: none -- only fit for loopback).
        max_body: Largest request body in bytes.
    """
    auth = auth or AuthConfig()
    # Workflow ids may hold "/" (a child's is "<parent>/<n>"): {id} matches it as a path, and the
    # bare describe route goes last so it does not swallow ".../history" and the actions.
    ordered = sorted(ENDPOINTS, key=lambda e: e.path.endswith("{id}"))
    specific: list[Route] = []
    routes: list[BaseRoute] = []
    for e in ordered:
        args = (_path_ids(e.path), view(e, store, auth, max_body))
        kwargs: dict[str, Any] = {"methods": [e.method], "name": e.handler.__name__}
        if e.path.endswith("/workflows/{id}"):
            routes.append(DescribeRoute(*args, others=specific, **kwargs))
        else:
            specific.append(route := Route(*args, **kwargs))
            routes.append(route)
    routes += ui_routes(auth)
    if metrics.available():  # the `metrics` extra: task queues and dead letters, read per scrape
        routes.append(_metrics_route(store))
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: _http_error, Exception: _http_error},
    )
    # A redirect to the path without its "/" builds its Location from the request's Host header
    # (a cache behind a proxy could keep one pointing elsewhere): a JSON 404 instead.
    app.router.redirect_slashes = False
    app.state.store = store
    app.state.auth = auth
    app.add_middleware(EncodedSlashes)
    app.add_middleware(LoopbackHosts, auth=auth)
    app.add_middleware(AccessLog)
    return app
