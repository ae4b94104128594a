"""``NAME=VALUE`` options (``durable start --search-attribute``, ``--memo``) read into values."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import click

from durable.search import declared
from durable.store.redis_store import RedisStore
from workers.cli.core import CliError, parse_args

__all__ = ["named_values", "search_types_of"]


def named_values(
    pairs: tuple[str, ...], option: str, types: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``NAME=VALUE`` options as a dict, each value read as an argument is (JSON or a string);
    ``types``: search attribute types by name -- a keyword or text attribute keeps a value JSON
    reads as something else (``zip=02134``, ``sku=1e3``) as the string it was typed as, and a
    datetime attribute takes an ISO 8601 time or ms since the epoch, as ``--where`` does."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        name = name.strip()
        if not eq or not name:
            raise click.BadParameter(f"{pair!r}: expected NAME=VALUE, e.g. customer=acme", param_hint=option)
        kind = (types or {}).get(name)
        if kind == "datetime":
            out[name] = _moment(name, value, option)
            continue
        if kind not in ("keyword", "text"):
            out[name] = parse_args([value])[0]
            continue
        try:
            parsed = parse_args([value])[0]
        except CliError:  # "02134": not JSON, and meant as the string it is
            parsed = value
        out[name] = parsed if isinstance(parsed, str) else value
    return out


def _moment(name: str, value: str, option: str) -> datetime:
    """A datetime attribute's value: ISO 8601 (no zone: UTC) or ms since the epoch."""
    text = value.strip().strip("\"'")
    try:
        if text.isdigit():
            return datetime.fromtimestamp(int(text) / 1000, tz=UTC)
        moment = datetime.fromisoformat(text)
    except (ValueError, OverflowError, OSError):
        raise click.BadParameter(
            f"{name}={value}: {name!r} is a datetime: give an ISO 8601 time like 2026-11-01T09:30:00Z "
            "(or ms since the epoch)",
            param_hint=option,
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def search_types_of(store: RedisStore) -> dict[str, str]:
    """The search attributes' types (declared here, else published)."""
    return declared() or store.search_types()
