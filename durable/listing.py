"""Listing and counting runs by a ``--where`` expression over their search attributes.

The grammar and the attributes are in docs/search.md; the index lives in the store
(:mod:`durable.store.search`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeGuard

from .client import default_store
from .errors import ConfigurationError
from .search import parse_where
from .store.redis_store import RedisStore
from .untrusted import decimal

__all__ = ["count_runs", "list_runs"]


def list_runs(
    where: str = "",
    *,
    limit: int = 50,
    before: int | datetime | str | Mapping[str, Any] | None = None,
    store: RedisStore | None = None,
) -> list[dict[str, Any]]:
    """Runs matching a ``--where`` expression, newest first (what ``durable list --where`` shows).

    Runs created in the same millisecond come in ``run_id`` order (descending), so a page
    ends at an exact place: passing its last row as ``before`` resumes right after it.

    Example:
        ```python
        page = durable.list_runs("customer = 'acme' and status = 'open'", limit=20)
        more = durable.list_runs("customer = 'acme' and status = 'open'", before=page[-1])
        ```

    Args:
        where: e.g. ``customer = 'acme' and status = 'open' and started > '2026-11-01'``
            (grammar and attributes: docs/search.md); empty: every run.
        limit: At most this many rows (1..1000).
        before: Where the page starts: the last row of the previous page (a dict with
            ``created`` and ``run_id``), or its cursor ``"<created ms>:<run id>"``: runs
            after it, none skipped or repeated. Or a time (UTC ms, as an int or a string
            of digits, or a datetime): the runs created before it -- runs sharing the last
            row's millisecond are then skipped, so prefer the row.

    Returns:
        One dict per run: its record's fields (``workflow_id``, ``run_id``, ``type``,
        ``status``, ``queue``, ``created``, ``closed``...) and ``search_attributes``.

    Raises:
        SearchQueryError: a syntax error or a wrong type in ``where`` (with its position).
        ConfigurationError: a ``before`` that is none of the above.
    """
    store = store or default_store()
    before_ms, before_run_id = _cursor(before)

    def search() -> list[dict[str, Any]]:
        query = parse_where(where, store.search_types())
        return store.search_runs(query, limit=limit, before_ms=before_ms, before_run_id=before_run_id)

    return store.ride("list_runs()", search)  # through a short outage, as the stubs' calls


def _is_ms(value: Any) -> TypeGuard[int]:
    """An int a Redis score can hold (ms); beyond it the index read raised OverflowError."""
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**53


def _cursor(before: int | datetime | str | Mapping[str, Any] | None) -> tuple[int | None, str | None]:
    """``(created ms, run id)`` of a ``before`` value (run id ``None``: a time)."""
    if before is None:
        return None, None
    if isinstance(before, datetime):
        return int(before.timestamp() * 1000), None
    if _is_ms(before):
        return before, None
    if isinstance(before, Mapping):
        created, rid = before.get("created"), before.get("run_id")
        if _is_ms(created) and isinstance(rid, str) and rid:
            return created, rid
    if isinstance(before, str):
        ms, _, rid = before.strip().partition(":")
        if (created := decimal(ms)) is not None:
            return created, rid or None
    raise ConfigurationError(
        f"before must be the previous page's last row, its cursor '<created ms>:<run id>', "
        f"or a time (ms or a datetime); not {before!r}"
    )


def count_runs(where: str = "", *, store: RedisStore | None = None) -> int:
    """How many runs match a ``--where`` expression (see :func:`list_runs`).

    Raises:
        SearchQueryError: a syntax error or a wrong type in ``where`` (with its position).
    """
    store = store or default_store()
    return store.ride("count_runs()", lambda: store.count_runs(parse_where(where, store.search_types())))
