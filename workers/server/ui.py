"""The web UI: pages served from the package (Jinja2 templates, plain JavaScript and CSS).

The pages hold no run data: their scripts read and act through ``/api/v1`` under the same
rules as any client (a bearer token the operator pastes, kept in the tab's sessionStorage,
or none on a loopback server without tokens; every ``POST`` carries ``X-Durable-Request``).
A page therefore needs no credential to load and shows nothing to whoever lacks one. Every
asset comes from the package: the UI works offline, with no CDN and no build step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

import durable
from workers.server.auth import AuthConfig

__all__ = ["PAGES", "SECURITY_HEADERS", "ui_routes"]

_HERE = Path(__file__).parent

PAGES = (
    ("/", "runs.html", "Runs"),
    ("/workflows/{id:path}", "run.html", "Run"),
    ("/workers", "workers.html", "Workers"),
    ("/schedules", "schedules.html", "Schedules"),
    ("/dead-letters", "dead_letters.html", "Dead letters"),
    ("/start", "start.html", "Start a run"),
)
"""Each page: its path, its template, its title."""

SECURITY_HEADERS = {
    # Scripts and styles only from this server: an injected payload value cannot run.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    # The action buttons must not be clickable through another site's frame.
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
}
"""Headers of every page."""


def ui_routes(auth: AuthConfig) -> list[BaseRoute]:
    """The pages and ``/static`` (templates and assets from the package)."""
    templates = Jinja2Templates(directory=str(_HERE / "templates"))

    def page(template: str, title: str) -> Any:
        async def render(request: Request) -> Response:
            context = {
                "title": title,
                "auth_enabled": auth.enabled,
                "version": durable.__version__,
                "workflow_id": request.path_params.get("id", ""),
                "path": request.url.path,
            }
            response = templates.TemplateResponse(request, template, context)
            response.headers.update(SECURITY_HEADERS)
            return response

        render.__name__ = "page_" + template.split(".")[0]
        return render

    routes: list[BaseRoute] = [Route(path, page(t, title), methods=["GET"]) for path, t, title in PAGES]
    routes.append(Mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static"))
    return routes
