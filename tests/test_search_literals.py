"""``--where`` literals checked against what their attribute can hold (a tester's findings).

Each literal that no stored value could equal, or that overflowed a conversion, used to crash
(``started > 1e400``: OverflowError), match every run (``note = ''``) or silently match none
(``cnt = 1.5``); now each is a :class:`SearchQueryError` pointing at it. Parse-level tests are
pure (``parse_where`` with a types dict); the end-to-end ones go through ``durable.count_runs``
on the test Redis, as ``durable count --where`` does.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from click.testing import CliRunner

import durable
from durable import ConfigurationError, SearchQueryError, WorkflowStub
from durable.search import MAX_KEYWORD, MAX_SAFE_INT, MS_RANGE, Comparison, encode_values, parse_where
from durable.store.search import MAX_LEAVES, compile_query
from tests.apps.search import SearchOrder
from workers.cli import cli

TYPES = {
    "cnt": "int",
    "amount": "float",
    "when": "datetime",
    "note": "text",
    "customer": "keyword",
    "tags": "keyword_list",
    "vip": "bool",
}


def _refused(where: str, position: int, *words: str) -> SearchQueryError:
    """``where`` is refused at ``position``, the caret under it and ``words`` in the message."""
    with pytest.raises(SearchQueryError) as info:
        parse_where(where, TYPES)
    message = str(info.value)
    assert info.value.position == position, message
    assert f"position {position}" in message, message
    for word in words:
        assert word in message, message
    assert message.splitlines()[-1].index("^") - 2 == position - 1, message
    return info.value


# ------------------------------------------------------------- 1. numbers beyond a float


@pytest.mark.parametrize(
    ("where", "position"),
    [
        ("started > 1e400", 11),
        ("when > 1e400", 8),
        ("closed < -1e400", 10),
        ("when = " + "9" * 5000, 8),  # beyond int()'s digit limit too
        ("started > 99999999999999999999", 11),
        (f"when >= {MS_RANGE[1] + 1}", 9),
        (f"when <= {MS_RANGE[0] - 1}", 9),
    ],
)
def test_datetime_ms_beyond_a_datetime_is_refused(where: str, position: int) -> None:
    _refused(where, position, "is a datetime", "within years 1 to 9999")


def test_datetime_ms_must_be_whole_and_may_be_written_in_any_notation() -> None:
    _refused("when > 1.5", 8, "a whole number of ms")
    assert parse_where("when > 1.7e12", TYPES) == Comparison("when", "datetime", ">", (1_700_000_000_000,))
    for ms in MS_RANGE:
        assert parse_where(f"started >= {ms}", TYPES) == Comparison("started", "datetime", ">=", (ms,))


@pytest.mark.parametrize("literal", ["1e400", "-1e400", "9" * 400, "-" + "9" * 5000])
def test_float_beyond_a_float_is_refused(literal: str) -> None:
    _refused(f"amount > {literal}", 10, "'amount' is a float", "a finite number")


def test_float_literals_within_range_are_floats() -> None:
    assert parse_where("amount >= 5", TYPES) == Comparison("amount", "float", ">=", (5.0,))
    assert parse_where("amount < 1e308", TYPES) == Comparison("amount", "float", "<", (1e308,))
    assert parse_where("amount = 99999999999999999999", TYPES).values == (1e20,)  # type: ignore[union-attr]


def test_nan_and_inf_are_no_literals() -> None:
    _refused("amount = nan", 10, "expected a value for 'amount'")
    _refused("amount > inf", 10, "expected a value for 'amount'")
    _refused("amount = 'nan'", 10, "'amount' is a float", "needs a number, not 'nan'")
    _refused("cnt = 'inf'", 7, "'cnt' is an int", "needs a number")
    _refused("when = 'nan'", 8, "ISO 8601")


def test_huge_numbers_no_longer_crash_count_runs(durable_store: Any) -> None:
    """As the tester found it: ``durable count --where "started > 1e400"`` raised OverflowError."""
    for where in ("started > 1e400", "due > 1e400", "amount > 1e400", "items < -1e400"):
        with pytest.raises(SearchQueryError, match="position"):
            durable.count_runs(where, store=durable_store)
        with pytest.raises(SearchQueryError, match="position"):
            durable.list_runs(where, store=durable_store)


@pytest.mark.parametrize("command", ["count", "list"])
def test_cli_where_with_a_huge_number_is_one_error(durable_store: Any, command: str) -> None:
    shown = CliRunner().invoke(cli, [command, "--where", "started > 1e400"])
    assert shown.exit_code == 1, shown.output
    assert "position 11" in shown.output and "^" in shown.output, shown.output
    assert "Traceback" not in shown.output and "OverflowError" not in shown.output


def test_huge_ints_for_a_float_attribute_are_refused_where_set() -> None:
    with pytest.raises(ConfigurationError, match="not a finite number"):
        encode_values({"amount": 10**400})  # was: OverflowError from math.isfinite


# ------------------------------------------------------------ 2. text without a word


@pytest.mark.parametrize(
    ("where", "position"),
    [
        ("note = ''", 8),
        ("note = '!!!'", 8),
        ("note = '   '", 8),
        ("note != ''", 9),
        ("note in ('rush', '--')", 18),
        ("note not in ('')", 14),
        ("customer = 'a' and note = '.'", 27),
    ],
)
def test_text_match_without_a_word_is_refused(where: str, position: int) -> None:
    _refused(where, position, "a text match needs at least one word", "'note'")


def test_text_match_with_a_word_is_fine() -> None:
    assert parse_where("note = ' Rush! '", TYPES) == Comparison("note", "text", "=", (" Rush! ",))
    assert parse_where("customer = ''", TYPES) == Comparison("customer", "keyword", "=", ("",))


def test_compiling_a_wordless_text_match_is_refused_too() -> None:
    with pytest.raises(ConfigurationError, match="at least one word"):
        compile_query(Comparison("note", "text", "=", ("!!!",)))


# ------------------------------------------------ 3. int and keyword literals out of range


@pytest.mark.parametrize("literal", ["1.5", "-0.25", "1e-3", "2.000001"])
def test_int_needs_a_whole_number(literal: str) -> None:
    _refused(f"cnt = {literal}", 7, "'cnt' is an int", "needs a whole number")


@pytest.mark.parametrize("literal", ["99999999999999999999", str(MAX_SAFE_INT + 1), "-1e16", "1e400"])
def test_int_beyond_what_is_indexable_is_refused(literal: str) -> None:
    _refused(f"cnt > {literal}", 7, "'cnt' is an int", "within ±2**53")


def test_int_literals_within_range() -> None:
    for literal, value in [("7", 7), ("7.0", 7), ("7e3", 7000), (str(MAX_SAFE_INT), MAX_SAFE_INT), ("-0", 0)]:
        got = parse_where(f"cnt = {literal}", TYPES)
        assert got == Comparison("cnt", "int", "=", (value,)) and type(got.values[0]) is int  # type: ignore[union-attr]
    assert parse_where(f"cnt in (1, -{MAX_SAFE_INT})", TYPES).values == (1, -MAX_SAFE_INT)  # type: ignore[union-attr]


def test_keyword_longer_than_a_keyword_can_be_is_refused() -> None:
    longest = "x" * MAX_KEYWORD
    assert parse_where(f"customer = '{longest}'", TYPES) is not None
    assert parse_where(f"tags = '{longest}'", TYPES) is not None
    _refused(f"customer = '{longest}y'", 12, "'customer' is a keyword", f"at most {MAX_KEYWORD}", "has 257")
    _refused(f"tags in ('a', '{longest}y')", 15, "'tags' is a keyword_list", f"at most {MAX_KEYWORD}")
    # Upserting it is refused with the same limit.
    with pytest.raises(ConfigurationError, match=f"longer than {MAX_KEYWORD}"):
        encode_values({"customer": longest + "y"})


def test_out_of_range_literals_end_to_end(durable_env: Any) -> None:
    """``count_runs`` refuses what used to count 0 (or every run) without a word."""
    store = durable_env.store
    stub = WorkflowStub.make(SearchOrder, id="lit-1", store=store, search_attributes={"note": "rush"})
    stub.start("acme", 3.0).result(timeout=10)
    WorkflowStub.make(SearchOrder, id="lit-2", store=store).start("globex", 4.0).result(timeout=10)
    assert durable.count_runs("", store=store) == 2
    assert durable.count_runs("note = 'RUSH!'", store=store) == 1
    assert durable.count_runs("note != 'rush'", store=store) == 1
    # The extremes that are accepted reach Redis as valid scores.
    assert durable.count_runs("amount < 1e308 and amount > -1.7e308", store=store) == 2
    assert durable.count_runs(f"items < {MAX_SAFE_INT} or items >= -{MAX_SAFE_INT}", store=store) == 0
    assert durable.count_runs(f"started >= {MS_RANGE[0]} and started <= {MS_RANGE[1]}", store=store) == 2
    assert durable.count_runs("amount = 3e0 and started > 1.7e12", store=store) == 1
    for where, words in [
        ("note = ''", "at least one word"),
        ("note = '!!!'", "at least one word"),
        ("note != '   '", "at least one word"),
        ("items = 1.5", "needs a whole number"),
        ("items = 99999999999999999999", "within ±2**53"),
        (f"customer = '{'x' * (MAX_KEYWORD + 1)}'", f"at most {MAX_KEYWORD} characters"),
        ("started > 1e400", "within years 1 to 9999"),
    ]:
        with pytest.raises(SearchQueryError, match=re.escape(words)) as info:
            durable.count_runs(where, store=store)
        assert info.value.position > 0 and "^" in str(info.value)


# ------------------------------------------------------------ 4. the lookups hint


def test_too_many_lookups_names_comparisons_and_in_lists() -> None:
    many_ors = " or ".join(f"customer = 'c{i}'" for i in range(3000))
    with pytest.raises(ConfigurationError) as info:
        compile_query(parse_where(many_ors, TYPES))
    message = str(info.value)
    assert f"needs 3000 index lookups; at most {MAX_LEAVES}" in message
    assert "fewer comparisons" in message and "in (...) lists" in message
    many_in = "customer in (" + ", ".join(f"'c{i}'" for i in range(MAX_LEAVES + 1)) + ")"
    with pytest.raises(ConfigurationError, match="fewer comparisons, or shorter in"):
        compile_query(parse_where(many_in, TYPES))


def test_too_many_lookups_end_to_end(durable_store: Any) -> None:
    where = " or ".join(f"type = 'T{i}'" for i in range(MAX_LEAVES + 1))
    with pytest.raises(ConfigurationError, match="fewer comparisons"):
        durable.count_runs(where, store=durable_store)


# -------------------------------------------------------------- 5. articles


def test_messages_use_the_right_article() -> None:
    _refused("cnt = 'x'", 7, "'cnt' is an int, so position 7 needs a number, not 'x'")
    _refused("amount = 'x'", 10, "'amount' is a float, so")
    _refused("when = true", 8, "'when' is a datetime, so")
    _refused("customer = 1", 12, "'customer' is a keyword, so")
    _refused("vip > true", 5, "compares 'vip', a bool")
    with pytest.raises(ConfigurationError) as info:
        encode_values({"items": "7"})
    assert "search attribute 'items' is an int: expected an int, got str '7'" in str(info.value)
    assert " a int" not in str(info.value)
    with pytest.raises(ConfigurationError, match="'amount' is a float: expected a float"):
        encode_values({"amount": "lots"})


# --------------------------------------------------------------- 6. built-in names


@pytest.mark.parametrize("name", ["status", "started", "type", "queue", "closed", "build_id", "schedule_id"])
def test_setting_a_built_in_says_it_is_built_in(name: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        encode_values({name: "x"})
    message = str(info.value)
    assert f"search attribute {name!r} is a built-in attribute" in message
    assert "workflow code cannot set it" in message
    assert "declare it first" not in message
    with pytest.raises(ConfigurationError, match="reserved"):
        durable.SearchAttribute(name, "keyword")  # which is why "declare it first" was wrong


def test_setting_a_query_word_says_it_cannot_be_a_name() -> None:
    with pytest.raises(ConfigurationError, match="'AND' is a query word") as info:
        encode_values({"AND": 1})
    assert "declare it first" not in str(info.value)


def test_undeclared_names_still_say_declare_it_first() -> None:
    with pytest.raises(ConfigurationError, match=r"declare it first with durable.SearchAttribute\('nope'"):
        encode_values({"nope": 1})


class SetsStatus(durable.Workflow):
    """Tries to set the built-in ``status``; returns the error it got."""

    name = "SearchLiteralsSetsStatus"

    def handle(self) -> str:
        try:
            durable.upsert_search_attributes({"status": "done"})
        except ConfigurationError as exc:
            return str(exc)
        return ""


def test_built_in_at_start_and_in_workflow_code(durable_env: Any) -> None:
    store = durable_env.store
    with pytest.raises(ConfigurationError, match="'status' is a built-in attribute"):
        WorkflowStub.make(SearchOrder, id="bi", store=store, search_attributes={"status": "done"})
    assert durable.count_runs(store=store) == 0
    stub = WorkflowStub.make(SetsStatus, store=store).start()
    assert "'status' is a built-in attribute" in stub.result(timeout=10)
    assert not [e for e in stub.history() if e.type == "SearchAttributesUpserted"]
    assert durable.count_runs("status = 'completed'", store=store) == 1
