"""The OpenAPI 3.1 document of ``/api/v1``, built from the routes' own metadata."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from workers.server.endpoint import Endpoint
from workers.server.errors import CODES

__all__ = ["openapi_document"]

_ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string", "enum": sorted(CODES)},
                "message": {"type": "string"},
            },
        }
    },
}


def _operation(endpoint: Endpoint) -> dict[str, Any]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"{(\w+)}", endpoint.path)
    ]
    params += [
        {
            "name": p.name,
            "in": "query",
            "required": False,
            "schema": {"type": p.type},
            "description": p.description,
        }
        for p in endpoint.params
    ]
    error = {
        "description": "error",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    op: dict[str, Any] = {
        "summary": endpoint.summary,
        "operationId": endpoint.handler.__name__,
        "parameters": params,
        "responses": {
            str(endpoint.status): {"description": "success", "content": {"application/json": {}}},
            "default": error,
        },
        "x-durable-role": endpoint.role,
    }
    if endpoint.role in ("read", "operator"):
        op["security"] = [{"bearer": []}]
    elif endpoint.role in ("public", "hook"):
        op["security"] = []
    if endpoint.body is not None:
        op["requestBody"] = {
            "required": False,
            "description": endpoint.body,
            "content": {"application/json": {"schema": {}}},
        }
    return op


def openapi_document(endpoints: Sequence[Endpoint], version: str) -> dict[str, Any]:
    """The document: every route, its parameters, role (``x-durable-role``) and error codes."""
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(endpoint)
    codes = "\n".join(f"* `{code}` ({status}): {what}" for code, (status, what) in CODES.items())
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "durable operator API",
            "version": version,
            "description": "Runs, histories and actions of a durable namespace. Errors are "
            '`{"error": {"code", "message"}}` with these codes:\n\n' + codes,
        },
        "paths": paths,
        "components": {
            "schemas": {"Error": _ERROR_SCHEMA},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
