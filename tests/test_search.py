"""Search attributes and memo: declarations, typed values, the --where language, the index.

Unit tests for the parser and the value checks; in-process runs (``durable_env``) for upserts,
queries, paging, continue-as-new, replay and purge; real `durable worker` processes and the
real `durable` command for the end-to-end path.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest
from click.testing import CliRunner

import durable
from durable import ConfigurationError, SearchAttribute, SearchQueryError, WorkflowStub
from durable.search import encode_values, parse_where
from durable.store.retention import purge_closed_before
from durable.testing import replay_history
from tests.apps.search import SearchBadUpsert, SearchLooper, SearchOrder
from tests.procs import durable_cli, workers
from tests.waiting import wait_for
from workers.cli import cli


def _ids(rows: list[dict[str, Any]]) -> list[str]:
    return [r["workflow_id"] for r in rows]


def _start(store: Any, wid: str, *args: Any, **kwargs: Any) -> WorkflowStub:
    return WorkflowStub.make(SearchOrder, id=wid, store=store, **kwargs).start(*args)


# ------------------------------------------------------------------------ the language


@pytest.mark.parametrize(
    ("where", "position", "words"),
    [
        ("customer = ", 12, "expected a value for 'customer'"),
        ("customer = 'acme' and", 22, "expected an attribute name"),
        ("customer = 'acme' or or", 22, "expected an attribute name"),
        ("customer == 'x'", 11, "expected a value"),
        ("customer = 'ab", 12, "unterminated string"),
        ("(customer = 'a'", 16, "expected ')'"),
        ("customer > 'a'", 10, "ranges need an int, float or datetime attribute"),
        ("amount = 'x'", 10, "needs a number"),
        ("started > 'yesterday'", 11, "ISO 8601"),
        ("nope = 1", 1, "unknown search attribute 'nope'"),
        ("status = 'runing'", 10, "unknown status 'runing'"),
        ("status = 'timed_out'", 10, "is 'failed', its cause a WorkflowTimeout"),  # no such status
        ("status = 'blocked'", 10, "`durable list --status blocked` lists them"),
        ("customer in 'a'", 13, "expected '(' after 'in'"),
        ("customer = 'a' customer", 16, "expected 'and', 'or' or the end"),
        ("customer ~ 'a'", 10, "unexpected '~'"),
    ],
)
def test_where_errors_name_their_position(where: str, position: int, words: str) -> None:
    with pytest.raises(SearchQueryError) as info:
        parse_where(where)
    assert info.value.position == position, str(info.value)
    assert words in str(info.value)
    assert f"position {position}" in str(info.value)
    caret_line = str(info.value).splitlines()[-1]
    assert caret_line.index("^") - 2 == position - 1  # the caret points at it


def test_where_grammar() -> None:
    q = parse_where(
        "(customer in ('a', 'b''s') or amount >= 2.5e1) and not vip = true "
        "and status != 'open' and started > '2026-11-01' and tags not in (\"x\")"
    )
    assert q is not None and q.op == "and"
    assert parse_where("   ") is None
    assert parse_where("due <= 1700000000000").values == (1700000000000,)  # type: ignore[union-attr]
    moment = parse_where("due > '2026-11-01T09:30:00+01:00'").values[0]  # type: ignore[union-attr]
    assert moment == int(datetime(2026, 11, 1, 8, 30, tzinfo=UTC).timestamp() * 1000)
    assert parse_where("CUSTOMER = 'x'", {"CUSTOMER": "keyword"}) is not None  # names are case-sensitive


def test_values_are_checked_against_their_declared_types() -> None:
    for values, words in [
        ({"amount": "lots"}, "'amount' is a float: expected a float, got str"),
        ({"items": 1.5}, "expected an int"),
        ({"items": True}, "expected an int"),
        ({"items": 2**60}, "beyond"),
        ({"vip": 1}, "expected True or False"),
        ({"due": datetime(2026, 1, 1)}, "timezone-aware"),
        ({"tags": "one"}, "expected a list of str"),
        ({"customer": "x" * 300}, "longer than 256"),
        ({"amount": float("nan")}, "not a finite number"),
        ({"undeclared": 1}, "unknown search attribute 'undeclared'"),
    ]:
        with pytest.raises(ConfigurationError, match=words):
            encode_values(values)
    assert encode_values({"tags": ["b", "a", "b"], "due": None}) == {
        "due": None,
        "tags": ["keyword_list", ["a", "b"]],
    }
    with pytest.raises(ConfigurationError, match="already declared as 'keyword'"):
        SearchAttribute("customer", "int")
    with pytest.raises(ConfigurationError, match="reserved"):
        SearchAttribute("status", "keyword")
    with pytest.raises(ConfigurationError, match="unknown type"):
        SearchAttribute("colour", "string")


# ----------------------------------------------------------------------- in process


def test_upserts_index_and_queries(durable_env: Any) -> None:
    store = durable_env.store
    acme = _start(
        store, "o-acme", "acme", 150.0, search_attributes={"note": "Rush delivery to Berlin"}, memo={"m": 1}
    )
    assert acme.result(timeout=10) == "acme"
    globex = _start(store, "o-globex", "globex", 5.0, True)
    wait_for(lambda: globex.status() == "suspended")

    info = acme.describe().to_dict()
    assert info["search_attributes"] == {
        "note": "Rush delivery to Berlin",
        "amount": 150.0,
        "customer": "acme",
        "tags": ["acme", "paid"],
        "vip": True,
    }
    assert info["memo"] == {"m": 1, "note": "order for acme", "done": True}
    described = CliRunner().invoke(cli, ["describe", "o-acme"], catch_exceptions=False).output
    assert "search attributes" in described and "Rush delivery to Berlin" in described, described
    assert "memo" in described and "order for acme" in described
    assert acme.snapshot()["search_attributes"]["vip"] is True
    types = [e.type for e in acme.history()]
    assert types.count("SearchAttributesUpserted") == 2 and types.count("MemoUpserted") == 2

    def q(where: str) -> list[str]:
        rows = durable.list_runs(where, store=store)
        assert durable.count_runs(where, store=store) == len(rows)
        return _ids(rows)

    assert q("customer = 'acme'") == ["o-acme"]
    assert q("status = 'open'") == q("status = 'suspended'") == ["o-globex"]
    assert q("status = 'closed' and closed > '2020-01-01'") == ["o-acme"]
    assert q("customer in ('acme', 'globex') and amount > 10") == ["o-acme"]
    assert q("tags = 'paid'") == ["o-acme"]
    assert q("note = 'berlin RUSH'") == ["o-acme"] and q("note = 'paris'") == []
    assert q("amount >= 5 and not vip = true") == ["o-globex"]
    assert q("type = 'SearchOrder' and status != 'completed'") == ["o-globex"]
    assert q("queue = 'default' and (amount < 6 or customer = 'acme')") == ["o-globex", "o-acme"]
    assert q("started > '2020-01-01' and started < '2020-01-02'") == []
    assert q("due > '2020-01-01'") == ["o-globex"]  # acme removed its due on the way
    assert q("") == ["o-globex", "o-acme"]

    globex.signal("go")
    globex.result(timeout=10)
    assert q("status = 'completed'") == ["o-globex", "o-acme"]
    assert q("status = 'suspended'") == [] and q("due > 0") == []
    # Replay of a run that upserted reproduces it (no nondeterminism, same attributes).
    driver = replay_history(globex)
    assert driver.search_attributes["customer"] == ["keyword", "globex"]


def test_paging_with_before(durable_env: Any) -> None:
    store = durable_env.store
    for i in range(7):
        _start(store, f"page-{i}", "pager", float(i)).result(timeout=10)
    seen: list[str] = []
    before = None
    while True:
        page = durable.list_runs("customer = 'pager'", limit=3, before=before, store=store)
        if not page:
            break
        seen += _ids(page)
        before = page[-1]["created"]
        if len(page) < 3:
            break
    assert sorted(seen) == [f"page-{i}" for i in range(7)] and len(seen) == len(set(seen))
    assert durable.count_runs("customer = 'pager' and amount >= 3", store=store) == 4


def test_bad_upsert_raises_in_workflow_and_records_nothing(durable_env: Any) -> None:
    stub = WorkflowStub.make(SearchBadUpsert, store=durable_env.store).start()
    errors = stub.result(timeout=10)
    assert "'amount' is a float" in errors[0] and "unknown search attribute 'nope'" in errors[1]
    assert not [e for e in stub.history() if e.type == "SearchAttributesUpserted"]
    assert stub.describe().to_dict()["search_attributes"] == {}


def test_bad_start_values_write_nothing(durable_env: Any) -> None:
    store = durable_env.store
    with pytest.raises(ConfigurationError, match="'items' is an int: expected an int"):
        WorkflowStub.make(SearchOrder, id="bad", store=store, search_attributes={"items": "7"})
    with pytest.raises(ConfigurationError, match="memo must be a dict"):
        WorkflowStub.make(SearchOrder, id="bad", store=store, memo=[1])
    with pytest.raises(durable.WorkflowNotFound):
        WorkflowStub.load("bad", store=store)
    assert durable.count_runs(store=store) == 0


def test_a_start_where_the_attributes_are_not_declared_uses_the_published_ones(
    durable_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server or CLI without --app (nothing declared in its process) refused
    search_attributes= at start ("none are declared") that its --where queries accepted."""
    store = durable_env.store
    store.publish_search_types()  # as the workers do
    monkeypatch.setattr(durable.search, "declared", dict)  # this process imported no app
    stub = WorkflowStub.make("SearchOrder", id="no-app", store=store, search_attributes={"customer": "acme"})
    assert stub._search == {"customer": ["keyword", "acme"]}
    with pytest.raises(ConfigurationError, match="unknown search attribute 'nope'"):
        WorkflowStub.make("SearchOrder", store=store, search_attributes={"nope": 1})


def test_cli_start_sets_search_attributes_and_memo(durable_env: Any) -> None:
    """``durable start --search-attribute NAME=VALUE --memo NAME=VALUE``: a run started from the
    CLI can be found by its attributes before any worker ran it (there was no way to give them)."""
    store = durable_env.store

    def start(*extra: str) -> Any:
        return CliRunner().invoke(
            # A queue durable_env's worker does not serve: its upserts would replace them.
            cli,
            ["start", "SearchOrder", "acme", "1", "--app", "tests.apps.search", "--queue", "cli", *extra],
        )

    done = start(
        "--id", "cli-sa", "--search-attribute", "customer=acme", "--search-attribute", "amount=120.5"
    )
    assert done.exit_code == 0, done.output
    done = start("--id", "cli-memo", "--memo", 'note={"by": "ops"}', "--search-attribute", 'tags=["a", "b"]')
    assert done.exit_code == 0, done.output
    assert _ids(durable.list_runs("customer = 'acme' and amount > 100", store=store)) == ["cli-sa"]
    assert _ids(durable.list_runs("tags = 'b'", store=store)) == ["cli-memo"]
    assert WorkflowStub.load("cli-memo", store=store).describe()["memo"] == {"note": {"by": "ops"}}
    # A keyword typed as digits stays the string it was typed as (JSON read it as a number).
    assert start("--id", "cli-zip", "--search-attribute", "customer=02134").exit_code == 0
    assert _ids(durable.list_runs("customer = '02134'", store=store)) == ["cli-zip"]
    # A datetime in the forms --where takes (no form worked: "expected a datetime, got str").
    assert start("--id", "cli-due", "--search-attribute", "due=2026-01-01T00:00:00Z").exit_code == 0
    assert start("--id", "cli-due-ms", "--search-attribute", "due=1767225600000").exit_code == 0
    due = durable.list_runs("due = '2026-01-01T00:00:00Z'", store=store)
    assert sorted(_ids(due)) == ["cli-due", "cli-due-ms"]
    for extra, words in [
        (("--search-attribute", "due=soon"), "'due' is a datetime: give an ISO 8601 time"),
        (("--search-attribute", "amount=lots"), "amount"),
        (("--search-attribute", "nope=1"), "unknown search attribute 'nope'"),
        (("--search-attribute", "customer"), "expected NAME=VALUE"),
        (("--memo", "=1"), "expected NAME=VALUE"),
    ]:
        refused = start(*extra)
        assert refused.exit_code != 0 and words in refused.output, (extra, refused.output)


def test_continue_as_new_carries_attributes_and_memo(durable_env: Any) -> None:
    stub = WorkflowStub.make(SearchLooper, id="loop", store=durable_env.store).start()
    assert stub.result(timeout=10) == 17
    rows = durable.list_runs("items = 7", store=durable_env.store)
    assert [r["status"] for r in rows] == ["completed", "continued"]


def test_purge_removes_index_entries(durable_env: Any) -> None:
    store = durable_env.store
    _start(store, "gone", "acme", 1.0, search_attributes={"note": "bye"}).result(timeout=10)
    assert store.redis.keys(f"{store.keys.prefix}:*:sx:*")
    report = purge_closed_before(store, store.server_time_ms() + 60_000)
    assert sum(report.runs.values()) == 1
    assert store.redis.keys(f"{store.keys.prefix}:*:sx:*") == []
    assert durable.count_runs(store=store) == 0


# ----------------------------------------------------------------------- real processes


def test_cli_list_where_and_count_with_real_workers(redis_url: str, store: Any) -> None:
    with workers(redis_url, app="apps.search"):
        stubs = [
            _start(store, f"cli-{c}", c, amount, True) for c, amount in [("acme", 200.0), ("initech", 3.0)]
        ]
        wait_for(lambda: all(s.status() == "suspended" for s in stubs))
        stubs[0].signal("go")
        stubs[0].result(timeout=20)
    # Another process, without --app: the types come from what the workers published.
    where = "customer = 'acme' and status = 'completed' and started > '2020-01-01' and vip = true"
    out = durable_cli(redis_url, "list", "--where", where, "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert _ids(rows) == ["cli-acme"] and rows[0]["search_attributes"]["tags"] == ["acme", "paid"]
    assert durable_cli(redis_url, "count", "--where", "status = 'open'").stdout.strip() == "1"
    assert json.loads(durable_cli(redis_url, "count", "--json").stdout) == {"count": 2}
    out = durable_cli(redis_url, "list", "--where", "amount > 1", "--status", "suspended", "--json")
    assert _ids(json.loads(out.stdout)) == ["cli-initech"]
    # Without --where, the same rows (they were the raw records: sa as a JSON string, index fields).
    plain = {r["workflow_id"]: r for r in json.loads(durable_cli(redis_url, "list", "--json").stdout)}
    assert plain["cli-acme"]["search_attributes"]["tags"] == ["acme", "paid"]
    assert not {"sa", "sx", "sxs", "wq", "task", "memo"} & set(plain["cli-acme"]), plain["cli-acme"]
    assert set(plain["cli-acme"]) == set(rows[0]), (plain["cli-acme"], rows[0])
    bad = durable_cli(redis_url, "list", "--where", "customer = 'acme' and amount > 'x'")
    assert bad.returncode == 1 and "position 32" in bad.stderr and "^" in bad.stderr, bad.stderr
    bad = durable_cli(redis_url, "count", "--where", "customer >")
    assert bad.returncode == 1 and "position 11" in bad.stderr


# ------------------------------------------------------- paging among runs of one millisecond


def _started_in_one_ms(store: Any, count: int) -> tuple[list[tuple[int, str]], int]:
    """``count`` runs (types ``TieA``/``TieB``, never run: no worker), most of them moved into
    one millisecond ``ms`` and the others into the two around it; returns their
    ``(created, run id)`` newest first (the list's order) and ``ms``.

    A run's ``created`` is Redis's clock when start_run.lua ran, so the test sets it: the
    record's field and the run's score in every index (the runs index, every keyword set).
    """
    runs = [
        WorkflowStub.make("TieA" if i % 2 else "TieB", id=f"tie-{i:03d}", store=store).start()
        for i in range(count)
    ]
    ms = store.server_time_ms() - 60_000
    placed: list[tuple[int, str]] = []
    indexes = [k.decode() for k in store.redis.keys(f"{store.keys.prefix}:*:sx:k:*")]
    indexes += [store.keys.runs(p) for p in range(store.keys.partitions)]
    for i, stub in enumerate(runs):
        created = ms + (1 if i % 10 == 0 else -1 if i % 10 == 1 else 0)
        ref = store.ref(stub.id)
        store.redis.hset(store.keys.run(ref.partition, stub.run_id), "created", created)
        for key in indexes:
            store.redis.zadd(key, {stub.run_id: created}, xx=True)
        placed.append((created, stub.run_id))
    return sorted(placed, reverse=True), ms


_TIE_QUERIES = [
    "",
    "type = 'TieA'",  # one keyword set
    "type in ('TieA', 'TieB')",  # the `or` fast path (each set's newest, merged)
    "status = 'open'",  # the same, over the four open status sets
    "type = 'TieA' or queue = 'default'",  # an `or` built into a set
    "type = 'TieB' and queue = 'default'",  # `and`
    "not type = 'Nope'",
]


@pytest.mark.parametrize("limit", [1, 2, 7])
def test_paging_never_skips_runs_of_one_millisecond(durable_store: Any, limit: int) -> None:
    store = durable_store
    placed, ms = _started_in_one_ms(store, 60)
    windows = [f"started >= {ms}", f"started <= {ms}", f"started < {ms}", f"started > {ms - 1}"]
    for where in [*_TIE_QUERIES, *windows, f"type = 'TieA' and started <= {ms}"]:
        everything = durable.list_runs(where, limit=1000, store=store)
        expected = [(r["created"], r["run_id"]) for r in everything]
        assert expected == sorted(expected, reverse=True), where  # ms desc, then run id desc
        assert len(expected) == durable.count_runs(where, store=store), where
        assert set(expected) <= set(placed) and expected, where
        # Each page resumes after the previous page's last row: as the row, or as its cursor.
        for as_cursor in (False, True):
            seen: list[tuple[int, str]] = []
            before: Any = None
            while True:
                page = durable.list_runs(where, limit=limit, before=before, store=store)
                seen += [(r["created"], r["run_id"]) for r in page]
                if len(page) < limit:
                    break
                before = f"{page[-1]['created']}:{page[-1]['run_id']}" if as_cursor else page[-1]
            assert seen == expected, (where, as_cursor)
    # A time (ms or datetime) still means "created before it".
    assert {r["created"] for r in durable.list_runs(before=ms, limit=1000, store=store)} == {ms - 1}
    moment = datetime.fromtimestamp((ms + 1) / 1000, tz=UTC)
    assert {r["created"] for r in durable.list_runs(before=moment, limit=1000, store=store)} == {ms - 1, ms}
    assert len(durable.list_runs(before=str(ms + 1), limit=1000, store=store)) == 54
    for bad in (
        "soon",
        {"created": ms},
        1.5,
        f"x:{placed[0][1]}",
        "²",
        f"²:{placed[0][1]}",
        "9" * 5000,
        10**400,
    ):
        with pytest.raises(ConfigurationError, match="before must be"):
            durable.list_runs(before=bad, store=store)  # type: ignore[arg-type]
    for limit in (0, 1001, "10", None, 2.0, True):
        with pytest.raises(ConfigurationError, match=r"limit must be an int 1\.\.1000, not "):
            durable.list_runs(limit=limit, store=store)  # type: ignore[arg-type]


def test_search_leaves_no_temporary_keys(durable_store: Any) -> None:
    store = durable_store
    placed, ms = _started_in_one_ms(store, 12)
    for where in _TIE_QUERIES:
        durable.list_runs(where, limit=3, before=f"{ms}:{placed[5][1]}", store=store)
        durable.count_runs(where, store=store)
    assert store.redis.keys(f"{store.keys.prefix}:*:sx:tmp:*") == []


def test_runs_started_concurrently_page_exactly(durable_store: Any) -> None:
    """As a tester found it: 60 runs started from 8 threads, many in one millisecond."""
    store = durable_store
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda i: WorkflowStub.make("Burst", store=store).start().run_id, range(60)))
    for limit in (1, 2, 7):
        seen: list[str] = []
        before: Any = None
        while page := durable.list_runs("type = 'Burst'", limit=limit, before=before, store=store):
            seen += [r["run_id"] for r in page]
            before = page[-1]
        assert sorted(seen) == sorted(ids), limit


def test_cli_list_pages_with_the_hint(durable_store: Any) -> None:
    store = durable_store
    placed, _ = _started_in_one_ms(store, 30)
    for base in (["list"], ["list", "--where", "type in ('TieA', 'TieB')"]):
        seen: list[str] = []
        before: list[str] = []
        while True:
            shown = CliRunner().invoke(
                cli, [*base, "--limit", "7", "--json", *before], catch_exceptions=False
            )
            rows = json.loads(shown.stdout)
            seen += [r["run_id"] for r in rows]
            table = CliRunner().invoke(cli, [*base, "--limit", "7", *before], catch_exceptions=False).output
            hints = [line for line in table.splitlines() if line.startswith("more: --before ")]
            if len(rows) < 7:
                assert hints == [], table
                break
            assert hints == [f"more: --before {rows[-1]['created']}:{rows[-1]['run_id']}"], table
            before = ["--before", hints[0].removeprefix("more: --before ")]
        assert seen == [rid for _, rid in placed], base
    bad = CliRunner().invoke(cli, ["list", "--before", "yesterday"])
    assert bad.exit_code == 2 and "MS:RUN_ID" in bad.output


def test_a_declaration_that_disagrees_with_the_published_type_is_an_error(durable_store: Any) -> None:
    """Another process published 'customer' as int (its runs were indexed so); this one declares
    it keyword: a query typed here would silently match nothing, so it is refused, naming both."""
    store = durable_store
    store.redis.hset(store.keys.search_types(), "customer", "int")
    with pytest.raises(ConfigurationError) as info:
        durable.count_runs("customer = 'acme'", store=store)
    assert str(info.value).startswith(
        "search attribute 'customer' is declared keyword in this process but int in Redis"
    )
    store.redis.hset(store.keys.search_types(), "customer", "keyword")
    assert durable.count_runs("customer = 'acme'", store=store) == 0


def test_a_type_published_first_stays_and_a_process_declaring_another_is_refused(
    durable_store: Any, durable_clean_redis_url: str
) -> None:
    """One `durable start --app` of a module declaring 'customer' as keyword retyped an int
    attribute for every process (a plain HSET): the old worker's runs were indexed as ints, and
    every query matched nothing. Now the first type published stays; a start or a worker whose
    declaration disagrees is refused, naming both."""
    store = durable_store
    store.redis.hset(store.keys.search_types(), "customer", "int")
    with pytest.raises(ConfigurationError, match="'customer' is declared keyword in this process but int"):
        WorkflowStub.make(
            SearchOrder, id="clash-1", store=store, search_attributes={"customer": "acme"}
        ).start("acme", 1.0)
    assert store.redis.hget(store.keys.search_types(), "customer") == b"int"
    worker = durable_cli(durable_clean_redis_url, "worker", "--app", "apps.search")
    assert worker.returncode == 1
    assert "search attribute 'customer' is declared keyword in this process but int in Redis" in worker.stderr


def test_cli_list_status_pages_through_newer_runs_of_other_statuses(durable_store: Any) -> None:
    """`durable list --status pending --limit 5` printed no run (and no --before hint) when more
    than a few hundred newer runs had another status: it filtered a window of the newest records."""
    store = durable_store
    waiting = []
    for i in range(3):  # a ms apart: the list's order within one ms is not defined
        waiting.append(WorkflowStub.make("Nobody", id=f"old-{i}", queue="none-q", store=store).start().id)
        time.sleep(0.002)
    for i in range(120):
        WorkflowStub.make("Nobody", id=f"new-{i}", queue="none-q", store=store).start().terminate("x")
    shown = CliRunner().invoke(cli, ["list", "--status", "pending", "--limit", "2", "--json"])
    assert shown.exit_code == 0, shown.output
    # The two newest waiting ones.
    assert {r["workflow_id"] for r in json.loads(shown.stdout)} == set(waiting[::-1][:2])
    table = CliRunner().invoke(cli, ["list", "--status", "pending", "--limit", "2"]).output
    assert "more: --before " in table, table


def test_a_long_where_is_shown_around_its_error_only() -> None:
    # A 40 KB expression made a 40 KB error line (and a 40 KB HTTP 422 body).
    where = "(" * 20_000 + "type = 'x'" + ")" * 20_000
    with pytest.raises(SearchQueryError) as info:
        parse_where(where)
    text = str(info.value)
    assert len(text) < 400 and "nested deeper than" in text, text
    shown, caret = text.splitlines()[-2:]
    assert shown.startswith("  ...") and shown.endswith("...")
    assert shown[caret.index("^")] == "("  # still under the character it names
    with pytest.raises(SearchQueryError) as info:
        parse_where("status = " + repr("y" * 5_000))
    assert len(str(info.value)) < 600, str(info.value)
