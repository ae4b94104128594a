"""Listing and counting runs by a ``--where`` expression over their search attributes.

The grammar and the attributes are in docs/search.md; the index lives in the store
(:mod:`durable.store.search`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .client import default_store
from .search import parse_where
from .store.redis_store import RedisStore

__all__ = ["count_runs", "list_runs"]


def list_runs(
    where: str = "",
    *,
    limit: int = 50,
    before: int | datetime | None = None,
    store: RedisStore | None = None,
) -> list[dict[str, Any]]:
    """Runs matching a ``--where`` expression, newest first (what ``durable list --where`` shows).

    Example:
        ```python
        page = durable.list_runs("customer = 'acme' and status = 'open'", limit=20)
        more = durable.list_runs("customer = 'acme' and status = 'open'", before=page[-1]["created"])
        ```

    Args:
        where: e.g. ``customer = 'acme' and status = 'running' and started > '2026-11-01'``
            (grammar and attributes: docs/search.md); empty: every run.
        limit: At most this many rows (1..1000).
        before: Only runs created before this (ms or a datetime): the ``created`` of the last
            row of the previous page.

    Returns:
        One dict per run: its record's fields (``workflow_id``, ``run_id``, ``type``,
        ``status``, ``queue``, ``created``, ``closed``...) and ``search_attributes``.

    Raises:
        SearchQueryError: a syntax error or a wrong type in ``where`` (with its position).
    """
    store = store or default_store()
    query = parse_where(where, store.search_types())
    before_ms = int(before.timestamp() * 1000) if isinstance(before, datetime) else before
    return store.search_runs(query, limit=limit, before_ms=before_ms)


def count_runs(where: str = "", *, store: RedisStore | None = None) -> int:
    """How many runs match a ``--where`` expression (see :func:`list_runs`).

    Raises:
        SearchQueryError: a syntax error or a wrong type in ``where`` (with its position).
    """
    store = store or default_store()
    return store.count_runs(parse_where(where, store.search_types()))
