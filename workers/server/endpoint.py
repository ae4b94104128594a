"""One API route as data: its method, path, role and handler, plus what the OpenAPI document says.

Handlers are plain synchronous functions of a :class:`Call` (the durable client
blocks on Redis): :func:`view` does the checks and body reading on the event loop,
then runs the handler in Starlette's thread pool and answers its value as JSON.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import difflib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, unquote_to_bytes

from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from durable.store.key_types import is_wrong_type
from durable.store.redis_store import RedisStore
from durable.untrusted import NestedTooDeeply, decimal, json_loads
from workers.cli.render import to_json
from workers.server.auth import AuthConfig, check_browser_rules
from workers.server.errors import ApiError, from_exception

__all__ = ["STOPPING", "Call", "Endpoint", "Param", "json_response", "view"]

STOPPING = threading.Event()
"""Set when the server begins to stop (SIGTERM, a deploy): routes that wait (an update's
outcome) answer at once, as at their timeout, rather than be cut off with no answer."""

_NEEDS = {"read": ("read", "operator"), "operator": ("operator",)}


@dataclass(frozen=True)
class Param:
    """A query parameter: name, JSON-schema type, description."""

    name: str
    type: str
    description: str


@dataclass
class Call:
    """What a handler gets: the store, the path and query parameters, the parsed body."""

    store: RedisStore
    path: Mapping[str, str]
    query: Mapping[str, str]
    body: Any
    raw: bytes
    headers: Mapping[str, str]
    role: str
    gone: threading.Event = field(default_factory=threading.Event)
    """Set once the client has hung up (watched only while a route that waits runs: :attr:`Endpoint.waits`)."""

    def arg(self, name: str, kind: type = str, default: Any = None) -> Any:
        """Query parameter ``name`` as ``kind`` (``str`` or ``int``), or ``default``.

        Raises:
            ApiError: ``invalid_argument`` for a value that is not a ``kind``.
        """
        value = self.query.get(name)
        if value is None or value == "":
            return default
        if kind is int:
            # ASCII digits only, with an optional "-": int() also took "1_0", "+5" and other scripts' digits.
            number = decimal(value.removeprefix("-"))
            if number is None:
                raise ApiError("invalid_argument", f"query parameter {name!r} must be an integer") from None
            return -number if value.startswith("-") else number
        return value

    def time_arg(self, name: str) -> int | None:
        """Query parameter ``name`` as UTC ms: an integer, or an ISO 8601 time (no zone: UTC)."""
        value = self.query.get(name)
        if not value:
            return None
        if (ms := decimal(value.removeprefix("-"))) is not None:
            return -ms if value.startswith("-") else ms
        try:
            when = _dt.datetime.fromisoformat(value)
        except ValueError:
            raise ApiError(
                "invalid_argument", f"query parameter {name!r} must be UTC ms or an ISO 8601 time"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=_dt.UTC)
        return int(when.timestamp() * 1000)

    def field(self, name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        """Body field ``name`` (the body must be an object), checked to be a ``kind``.

        Raises:
            ApiError: ``invalid_argument`` for a body that is not an object or a wrong type.
        """
        body = self.body if self.body is not None else {}
        if not isinstance(body, dict):
            raise ApiError("invalid_argument", "the body must be a JSON object")
        value = body.get(name, default)
        if value is not default and not isinstance(value, kind):
            names = " or ".join(
                _TYPE_NAMES.get(k, k.__name__) for k in (kind if isinstance(kind, tuple) else (kind,))
            )
            raise ApiError("invalid_argument", f"body field {name!r} must be {names}")
        return value

    def args(self) -> list[Any]:
        """The body's ``args``: a JSON array (default: no arguments)."""
        return list(self.field("args", list, []))


_TYPE_NAMES = {
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    dict: "an object",
}


@dataclass(frozen=True)
class Endpoint:
    """One route: ``role`` is ``public``, ``read``, ``operator`` or ``hook`` (the path's token is
    the credential; the body may have to be signed)."""

    method: str
    path: str
    handler: Callable[[Call], Any]
    role: str
    summary: str
    status: int = 200
    params: tuple[Param, ...] = ()
    body: str | None = None
    tags: tuple[str, ...] = field(default=())
    fields: tuple[str, ...] | None = None
    """The body fields the route reads (``None``: no check); any other one is refused, so that
    a misspelt field is an error instead of an option silently left at its default."""
    waits: bool = False
    """The handler may wait a while (an update): :attr:`Call.gone` says when its client left."""


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """``data`` as a JSON response (payload values through the CLI's JSON rendering)."""
    return Response(to_json(data), status_code=status, headers=headers, media_type="application/json")


def error_response(err: ApiError) -> Response:
    return json_response(err.body(), err.status, err.headers)


def view(endpoint: Endpoint, store: RedisStore, auth: AuthConfig, max_body: int) -> Callable[..., Any]:
    """The Starlette endpoint function of ``endpoint``."""

    async def serve(request: Request) -> Response:
        try:
            call = await _prepare(request, endpoint, store, auth, max_body)
            watch = asyncio.create_task(_watch_client(request, call.gone)) if endpoint.waits else None
            try:
                result = await run_in_threadpool(endpoint.handler, call)
            finally:
                if watch is not None:
                    watch.cancel()
        except Exception as exc:  # noqa: BLE001 - every failure becomes the API's JSON error
            if is_wrong_type(exc):  # Redis's error names no key: which one (read now)
                workflow_id = _path_params(request).get("id") if "/workflows/" in endpoint.path else None
                exc = await run_in_threadpool(_named, store, exc, workflow_id)
            return error_response(from_exception(exc))
        if isinstance(result, Response):
            return result
        return json_response(result, endpoint.status)

    serve.__name__ = endpoint.handler.__name__
    return serve


async def _watch_client(request: Request, gone: threading.Event) -> None:
    """Set ``gone`` when the client hangs up (polled: the ASGI server says so only when asked)."""
    while not await request.is_disconnected():
        await asyncio.sleep(0.25)
    gone.set()


async def _prepare(
    request: Request, endpoint: Endpoint, store: RedisStore, auth: AuthConfig, max_body: int
) -> Call:
    headers = request.headers
    role = "operator"
    if endpoint.role in ("read", "operator"):
        check_browser_rules(auth, request.method, headers)
        role = auth.role_of(headers)[0]
        if role not in _NEEDS[endpoint.role]:
            raise ApiError(
                "forbidden", f"a {role} token may not {endpoint.summary[0].lower()}{endpoint.summary[1:]}"
            )
    raw = await read_body(request, max_body) if request.method == "POST" else b""
    if endpoint.role == "hook":
        auth.check_signature(headers, raw)
    body = None if endpoint.role == "hook" else parse_json(raw, headers.get("content-type", ""))
    if endpoint.role != "hook" and raw.strip() and not isinstance(body, dict):  # `null` too: not "no body"
        raise ApiError("invalid_argument", "the body must be a JSON object (or no body at all)")
    if endpoint.fields is not None and isinstance(body, dict):
        _check_fields(body, endpoint.fields)
    if endpoint.role in ("read", "operator"):  # `?statuss=failed` listed every run
        _check_fields(request.query_params, tuple(p.name for p in endpoint.params), "query parameter")
    return Call(
        store=store,
        path=_path_params(request),
        query=dict(request.query_params),
        # A webhook's body is the hook's payload, whatever its media type (see hook_payload).
        body=body,
        raw=raw,
        headers=headers,
        role=role,
    )


def _check_fields(body: Mapping[str, Any], known: tuple[str, ...], what: str = "body field") -> None:
    for name in body:
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            takes = ", ".join(known) if known else f"no {what}s"
            raise ApiError("invalid_argument", f"unknown {what} {name!r}{hint}; this route takes: {takes}")


def _path_params(request: Request) -> dict[str, str]:
    raw = request.scope.get("raw_path")
    if isinstance(raw, bytes):
        try:
            unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            # Decoded with replacement, a signal named "\ufffd\ufffd" went to the run: a name the
            # client never sent.
            raise ApiError(
                "invalid_argument",
                "the path is not valid UTF-8: its percent-escapes encode bytes that are not UTF-8 text "
                "(an id or a name is percent-encoded UTF-8)",
            ) from None
    params = dict(request.path_params)
    if request.scope.get("durable.raw_ids"):  # app.EncodedSlashes kept %2F and %25 escaped
        params = {name: unquote(value) for name, value in params.items()}
    return params


async def read_body(request: Request, cap: int) -> bytes:
    """The request body, refused past ``cap`` bytes (before reading it when it says its length).

    Raises:
        ApiError: ``payload_too_large``.
    """
    too_large = ApiError("payload_too_large", f"the body is larger than this server's cap of {cap} bytes")
    declared = request.headers.get("content-length")
    if declared and (decimal(declared) or 0) > cap:
        raise too_large
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:  # the client's doing, not the server's: no error line with a traceback
        raise ApiError("bad_request", "the client closed the connection before its body was read") from None
    return b"".join(chunks)


def parse_json(raw: bytes, content_type: str) -> Any:
    """The body as JSON (``None`` when empty).

    Raises:
        ApiError: ``unsupported_media_type`` for a non-JSON content type, ``bad_request`` for
            bytes that are not JSON.
    """
    if not raw.strip():
        return None
    media = content_type.split(";")[0].strip().lower()
    if media and media != "application/json" and not media.endswith("+json"):
        raise ApiError("unsupported_media_type", f"the body must be application/json, not {media}")
    try:
        return json_loads(raw, standard=True)
    except NestedTooDeeply:
        raise ApiError("bad_request", "the body's JSON is nested too deeply to read") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError("bad_request", f"the body is not valid JSON: {exc}") from None


def _named(store: RedisStore, exc: Exception, workflow_id: str | None) -> Exception:
    """The error naming the key of the wrong kind ``exc`` (``WRONGTYPE``) met, if it can be read:
    the workflow's own (a route of one), else the namespace's."""
    try:
        if workflow_id:
            named = store.cannot_write(f"workflow {workflow_id!r}", workflow_id, exc)
            if named.wrong:
                return named
        return store.wrong_type_error(exc)
    except Exception:  # noqa: BLE001 - the error met is what is answered then
        return exc
