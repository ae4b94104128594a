"""The search index in Redis: postings of a run's attributes, and queries over them.

Every partition keeps its own index (keys in its hash tag, so every script is one slot):

* ``T:sx:k:<attr>:<value>`` -- zset, created ms -> run id: the runs whose keyword-like
  attribute has this value (keywords, bools, each keyword-list item, each text word, and the
  built-ins ``type``, ``queue``, ``status``, ``build_id``, ``schedule_id``);
* ``T:sx:n:<attr>`` -- zset, value -> run id: numbers, datetimes (UTC ms) and ``closed``;
* ``T:runs`` -- the existing runs index by created ms, which is ``started``.

The scripts that start, commit, close and purge runs keep it (``sx_*`` in ``lua/_lib.lua``).
A query is compiled once (:func:`compile_query`) and evaluated by ``lua/search.lua`` on every
partition; the client merges the partitions' newest rows. Efficient shapes: equality (and
``in``) on keywords, and ``and`` of them, cost the size of the smallest set named; a range on
``started`` at the top level is a window on the result (free); other ranges and ``not``/``!=``
materialise the matching runs of the partition (linear in them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import msgpack

from .. import codec
from ..errors import ConfigurationError
from ..search import CLOSED_STATUSES, OPEN_STATUSES, Comparison, Query, declared, decode_values, text_words
from .base import StoreBase
from .keys import keyword_posting, number_posting
from .records import decode_run, text

MAX_LIMIT = 1000
"""Rows one list call returns at most."""
MAX_LEAVES = 128
"""Index lookups one query may make: each comparison counts one, an ``in`` list each value, a
text match each word, ``status = 'open'``/``'closed'`` each status of the group."""

Bound = tuple[float, bool]  # (value, exclusive)


def _score(value: int | float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def postings(values: dict[str, Any]) -> list[list[str]]:
    """The index entries of encoded search attributes (``{name: [type, value]}``): ``[suffix]``
    for a keyword-like entry (scored by created), ``[suffix, score]`` for a number or time."""
    out: list[list[str]] = []
    for name in sorted(values):
        kind, value = values[name]
        if kind == "keyword":
            out.append([keyword_posting(name, value)])
        elif kind == "bool":
            out.append([keyword_posting(name, "true" if value else "false")])
        elif kind == "keyword_list":
            out += [[keyword_posting(name, item)] for item in value]
        elif kind == "text":
            out += [[keyword_posting(name, word)] for word in text_words(value)]
        else:  # int, float, datetime (ms)
            out.append([number_posting(name), _score(value)])
    return out


def attribute_args(values: dict[str, Any]) -> list[str]:
    """``[values JSON, postings JSON]``: what the scripts store for a run's search attributes."""
    return [
        json.dumps(values, ensure_ascii=False, separators=(",", ":")),
        json.dumps(postings(values), ensure_ascii=False, separators=(",", ":")),
    ]


def start_index(started: dict[str, Any]) -> dict[str, Any] | None:
    """What ``sx_start`` indexes for a new run, from its WorkflowStarted data (``None``: only
    the built-ins of the record)."""
    sched = (started.get("options") or {}).get("schedule_id") or ""
    values = started.get("search_attributes") or {}
    memo = started.get("memo") or b""
    if not (sched or values or memo):
        return None
    out: dict[str, Any] = {"sched": str(sched), "memo": memo}
    if values:
        out["sa"], out["sx"] = attribute_args(values)
    return out


def pack_index(index: dict[str, Any] | None) -> bytes:
    """``start_run.lua``'s search argument (raw strings: Lua's cmsgpack has no bin type)."""
    if index is None:
        return b""
    packed: bytes = msgpack.packb(index, use_bin_type=False)
    return packed


# -------------------------------------------------------------------------- queries


def compile_query(query: Query | Comparison | None, before_ms: int | None = None) -> tuple[Any, str, str]:
    """``(plan, window min, window max)`` for ``lua/search.lua``.

    ``started`` ranges at the top level of the query become the window (no set is built
    for them); ``before_ms`` (paging) narrows it further.

    Raises:
        ConfigurationError: more than :data:`MAX_LEAVES` index lookups.
    """
    plan, low, high = _compile(query)
    if before_ms is not None:
        high = min(high, (float(before_ms), True), key=_high_key)
    return plan, _bound(low), _bound(high)


def _compile(query: Query | Comparison | None) -> tuple[Any, Bound, Bound]:
    """:func:`compile_query` with the window's bounds as :data:`Bound` values (no paging)."""
    low: Bound = (float("-inf"), False)
    high: Bound = (float("inf"), False)
    rest: list[Query | Comparison] = []
    items = query.items if isinstance(query, Query) and query.op == "and" else (query,) if query else ()
    for item in items:
        if (
            isinstance(item, Comparison)
            and item.attribute == "started"
            and item.op in ("<", "<=", ">", ">=", "=")
        ):
            lo, hi = _range(item.op, item.values[0])
            low, high = max(low, lo, key=_low_key), min(high, hi, key=_high_key)
        else:
            rest.append(item)
    leaves = [0]
    if not rest:
        plan: Any = ["all"]
    elif len(rest) == 1:
        plan = _node(rest[0], leaves)
    else:
        plan = ["and", *(_node(item, leaves) for item in rest)]
    if leaves[0] > MAX_LEAVES:
        raise ConfigurationError(
            f"--where needs {leaves[0]} index lookups; at most {MAX_LEAVES} (use fewer comparisons, or "
            "shorter in (...) lists)"
        )
    return plan, low, high


def _inside(value: float, low: Bound, high: Bound) -> bool:
    """Whether ``value`` is within the window ``low``..``high``."""
    above = value > low[0] if low[1] else value >= low[0]
    below = value < high[0] if high[1] else value <= high[0]
    return above and below


def _low_key(bound: Bound) -> tuple[float, bool]:
    return bound  # larger value, then exclusive, is tighter


def _high_key(bound: Bound) -> tuple[float, bool]:
    return (bound[0], not bound[1])  # smaller value, then exclusive, is tighter


def _bound(bound: Bound) -> str:
    value, exclusive = bound
    if value == float("inf"):
        return "+inf"
    if value == float("-inf"):
        return "-inf"
    return ("(" if exclusive else "") + _score(int(value) if value.is_integer() else value)


def _range(op: str, value: int | float) -> tuple[Bound, Bound]:
    v = float(value)
    inf = float("inf")
    return {
        "=": ((v, False), (v, False)),
        ">": ((v, True), (inf, False)),
        ">=": ((v, False), (inf, False)),
        "<": ((-inf, False), (v, True)),
        "<=": ((-inf, False), (v, False)),
    }[op]


def _node(item: Query | Comparison, leaves: list[int]) -> Any:
    if isinstance(item, Query):
        children = [_node(child, leaves) for child in item.items]
        return ["not", children[0]] if item.op == "not" else [item.op, *children]
    if item.op == "!=":
        return ["not", _node(Comparison(item.attribute, item.kind, "=", item.values), leaves)]
    if item.op == "not in":
        return ["not", _node(Comparison(item.attribute, item.kind, "in", item.values), leaves)]
    if item.op == "in":
        options = [_node(Comparison(item.attribute, item.kind, "=", (v,)), leaves) for v in item.values]
        return options[0] if len(options) == 1 else ["or", *options]
    leaves[0] += 1
    if item.kind in ("int", "float", "datetime"):
        lo, hi = _range(item.op, item.values[0])
        if item.attribute == "started":
            return ["r", _bound(lo), _bound(hi)]
        return ["n", number_posting(item.attribute), _bound(lo), _bound(hi)]
    return _equal(item.attribute, item.kind, item.values[0], leaves)


def _equal(attribute: str, kind: str, value: Any, leaves: list[int]) -> Any:
    if attribute == "status" and value in ("open", "closed"):
        statuses = OPEN_STATUSES if value == "open" else CLOSED_STATUSES
        leaves[0] += len(statuses) - 1
        return ["or", *(["k", keyword_posting("status", w)] for w in statuses)]
    if kind == "bool":
        return ["k", keyword_posting(attribute, "true" if value else "false")]
    if kind == "text":
        words = text_words(value)
        if not words:  # the parser refuses it; matching every run (or none, with !=) would be wrong
            raise ConfigurationError(f"--where: a text match needs at least one word; {value!r} has none")
        leaves[0] += len(words) - 1
        nodes = [["k", keyword_posting(attribute, w)] for w in words]
        return nodes[0] if len(nodes) == 1 else ["and", *nodes]
    return ["k", keyword_posting(attribute, value)]


class SearchStore(StoreBase):
    """Listing and counting runs by a ``--where`` query; the published attribute types."""

    _published: frozenset[str] = frozenset()

    def publish_search_types(self, names: Sequence[str] = (), *, strict: bool = True) -> None:
        """Record the declared types of ``names`` (default: all declared here) in Redis, so
        ``durable list --where`` in a process that did not import them knows them too. The
        first type published for a name stays: runs were indexed by it.

        Args:
            names: The attributes to publish.
            strict: Raise on a clash every time; else once (a worker's commits: the values are
                indexed all the same, the worker says it once).

        Raises:
            ConfigurationError: Redis has another type for one of them (nothing of it is
                changed): a process declaring ``cnt`` as keyword retyped an int attribute for
                every process, and queries matched nothing.
        """
        types = declared()
        wanted = {n: types[n] for n in (names or types) if n in types and n not in self._published}
        if not wanted:
            return
        key = self.keys.search_types()
        with self.redis.pipeline(transaction=False) as pipe:
            for name, kind in wanted.items():
                pipe.hsetnx(key, name, kind)
            pipe.hmget(key, list(wanted))
            stored = pipe.execute()[-1]
        clash = {
            n: text(v) for (n, kind), v in zip(wanted.items(), stored, strict=True) if v and text(v) != kind
        }
        self._published = self._published | (frozenset(wanted) - frozenset(() if not strict else clash))
        if clash:
            name = sorted(clash)[0]
            raise ConfigurationError(
                f"search attribute {name!r} is declared {wanted[name]} in this process but {clash[name]} in "
                "Redis (published first; the runs are indexed that way): make the declarations agree"
            )

    def search_types(self) -> dict[str, str]:
        """Custom attribute types: those published in Redis and this process's declarations.

        Raises:
            ConfigurationError: this process declares an attribute with another type than the
                one published (the runs were indexed by that one: a query typed by this
                process's would silently match nothing, or refuse right values).
        """
        stored = {text(k): text(v) for k, v in self.redis.hgetall(self.keys.search_types()).items()}
        mine = declared()
        for name, kind in sorted(mine.items()):
            if stored.get(name, kind) != kind:
                raise ConfigurationError(
                    f"search attribute {name!r} is declared {kind} in this process but {stored[name]} in "
                    "Redis (published by the processes that start and run workflows; runs are indexed "
                    "that way): make the declarations agree"
                )
        return {**stored, **mine}

    def search_runs(
        self,
        query: Query | Comparison | None,
        *,
        limit: int = 50,
        before_ms: int | None = None,
        before_run_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """Runs matching ``query`` over every partition, newest first: ``created`` desc, then
        ``run_id`` desc among runs of the same millisecond.

        Page with ``before_ms`` and ``before_run_id`` = the ``created`` and ``run_id`` of the
        last row of the previous page (a cursor: no run is skipped or repeated, even among
        runs created in one millisecond). ``before_ms`` alone lists the runs created before
        that time.

        Raises:
            ConfigurationError: ``limit`` out of 1..:data:`MAX_LIMIT`, ``before_run_id``
                without ``before_ms``, or a query of too many index lookups.
        """
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
            raise ConfigurationError(f"limit must be an int 1..{MAX_LIMIT}, not {limit!r}")
        if before_run_id and before_ms is None:
            raise ConfigurationError("before_run_id needs before_ms (the created ms of that run)")
        plan, window_low, window_high = _compile(query)
        cursor = ["", ""]
        if before_ms is not None:
            # The cursor's own ms, when the window holds it, is read apart (ids below the
            # cursor's); the window then ends before that ms.
            if before_run_id and _inside(float(before_ms), window_low, window_high):
                cursor = [str(int(before_ms)), before_run_id]
            window_high = min(window_high, (float(before_ms), True), key=_high_key)
        packed = msgpack.packb(plan, use_bin_type=False)
        args = [packed, "list", _bound(window_low), _bound(window_high), limit, *cursor]
        calls = [([self.keys.runs(p)], args) for p in range(self.keys.partitions)]
        replies = self._script_many("search", calls, raise_on_error=True)
        rows: list[tuple[int, str, int]] = []
        for p, reply in enumerate(replies):
            rows += [(int(float(reply[i + 1])), text(reply[i]), p) for i in range(0, len(reply), 2)]
        # (ms, run id) descending is the index's own order for equal scores (members by
        # bytes, which is str order for run ids), so the next page's cursor resumes exactly.
        rows.sort(reverse=True)
        rows = rows[:limit]
        with self.redis.pipeline(transaction=False) as pipe:
            for _, rid, p in rows:
                pipe.hgetall(self.keys.run(p, rid))
            records = pipe.execute()
        out = []
        for (created, rid, p), raw in zip(rows, records, strict=True):
            if raw:  # purged between the query and the read
                out.append(run_summary(decode_run(raw), rid, p, created))
        return out

    def count_runs(self, query: Query | Comparison | None) -> int:
        """How many runs match ``query`` over every partition."""
        plan, low, high = compile_query(query)
        packed = msgpack.packb(plan, use_bin_type=False)
        calls = [([self.keys.runs(p)], [packed, "count", low, high, 0]) for p in range(self.keys.partitions)]
        return sum(int(n) for n in self._script_many("search", calls, raise_on_error=True))

    def count_pinned_open(self, builds: Iterable[str], queues: Iterable[str]) -> int:
        """How many open runs of ``queues`` are pinned to one of ``builds`` (a draining worker's
        work left: see :meth:`workers.membership.Membership.drain`)."""
        builds, queues = sorted(set(builds) - {""}), sorted(set(queues))
        if not builds or not queues:
            return 0
        query = Query(
            "and",
            (
                Comparison("build_id", "keyword", "in", tuple(builds)),
                Comparison("queue", "keyword", "in", tuple(queues)),
                Comparison("status", "keyword", "=", ("open",)),
            ),
        )
        return self.count_runs(query)


def run_summary(record: dict[str, Any], run_id: str, partition: int, created: int) -> dict[str, Any]:
    """A listed run: its record's plain fields, its search attributes decoded, no index fields."""
    for name in ("sx", "sxs", "memo"):
        record.pop(name, None)
    record["search_attributes"] = stored_attributes(record.pop("sa", None))
    record.update(run_id=run_id, partition=partition, created=created)
    return record


def stored_attributes(raw: Any) -> dict[str, Any]:
    """A run record's ``sa`` field (JSON) as Python values."""
    if not raw:
        return {}
    try:
        return decode_values(json.loads(raw))
    except ValueError:
        return {}


def stored_memo(raw: Any) -> dict[str, Any]:
    """A run record's ``memo`` field (a codec payload) as a dict (``{}`` when absent)."""
    if not raw:
        return {}
    value = codec.loads(raw if isinstance(raw, bytes) else str(raw).encode())
    return value if isinstance(value, dict) else {}
