"""Search attributes: their declared types, typed values, and the ``--where`` query language.

A search attribute is a typed, indexed value on a run (``customer = 'acme'``); a **memo** is an
unindexed map shown by ``describe``. Workflow code sets both with
:func:`durable.upsert_search_attributes` / :func:`durable.upsert_memo` (recorded in history),
a client at start with ``WorkflowStub.make(..., search_attributes=..., memo=...)``.

Names are **declared** before use, with a type (``SearchAttribute("customer", "keyword")``):
an undeclared name or a value of the wrong type is refused where it is set, before anything
is written. Declaring in code keeps the type next to the workflow that uses it; the store
publishes the declarations so ``durable list --where`` in another process knows them too.

Types: ``keyword`` (exact string), ``text`` (words; ``=`` matches runs whose text holds every
word of the literal), ``int``, ``float``, ``bool``, ``datetime`` (timezone-aware),
``keyword_list`` (``=`` matches a list holding the value). Built-in attributes every run has:
``type``, ``status`` (a status word, or ``open`` / ``closed``), ``queue``, ``build_id``,
``schedule_id``, ``started`` and ``closed`` (datetimes).

This module is pure: it parses and checks; :mod:`durable.store.search` turns a checked query
into index lookups.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from .errors import ConfigurationError

__all__ = [
    "BUILTINS",
    "TYPES",
    "Comparison",
    "Query",
    "SearchAttribute",
    "SearchQueryError",
    "declared",
    "decode_values",
    "encode_values",
    "parse_where",
]

TYPES = ("keyword", "text", "int", "float", "bool", "datetime", "keyword_list")
"""The search attribute types."""

#: Built-in attributes: name -> type. Kept by the store from the run record, never upserted.
BUILTINS: dict[str, str] = {
    "type": "keyword",
    "status": "keyword",
    "queue": "keyword",
    "build_id": "keyword",
    "schedule_id": "keyword",
    "started": "datetime",
    "closed": "datetime",
}

OPEN_STATUSES = ("pending", "running", "suspended", "cancelling")
CLOSED_STATUSES = ("completed", "failed", "cancelled", "terminated", "continued")
#: ``status`` values a query may name: the status words plus the two groups.
STATUS_WORDS = (*OPEN_STATUSES, *CLOSED_STATUSES, "open", "closed")
#: Words users try that are not statuses, with where the state they mean is found.
NOT_A_STATUS = {
    "blocked": " (a blocked run is open: `durable list --status blocked` lists them, with why)",
    "timed_out": " (a run whose execution or run timeout passed is 'failed', its cause a WorkflowTimeout)",
}

MAX_ATTRIBUTES = 64
"""Search attributes one run may hold (each costs index entries)."""
MAX_KEYWORD = 256
"""Characters of a keyword (or of one keyword-list item): it is part of an index key name."""
MAX_TEXT = 2048
"""Characters of a text value."""
MAX_LIST = 64
"""Items of a keyword list."""
MAX_SAFE_INT = 2**53
"""Integers are indexed as zset scores (doubles): beyond this they lose precision."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The epoch ms of the first and last datetimes (years 1 and 9999): what a datetime can hold.
MS_RANGE = (
    (datetime.min.replace(tzinfo=UTC) - _EPOCH) // timedelta(milliseconds=1),
    (datetime.max.replace(tzinfo=UTC) - _EPOCH) // timedelta(milliseconds=1),
)

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
_WORD = re.compile(r"\w+")


class SearchQueryError(ConfigurationError):
    """A ``--where`` expression that does not parse or does not type-check.

    Attributes:
        position: 1-based character position of the problem in the expression.
    """

    def __init__(self, message: str, where: str = "", position: int = 0) -> None:
        self.position = position
        if where:  # around the position only: a 40 KB expression was a 40 KB error line
            at, start = max(position - 1, 0), max(position - 61, 0)
            head, tail = "..." if start else "", "..." if at + 40 < len(where) else ""
            caret = " " * (len(head) + at - start)
            message = f"{message}\n  {head}{where[start : at + 40]}{tail}\n  {caret}^"
        super().__init__(message)


@dataclass(frozen=True)
class SearchAttribute:
    """A declared search attribute. Creating one registers it for this process.

    Example:
        ```python
        CUSTOMER = durable.SearchAttribute("customer", "keyword")
        AMOUNT = durable.SearchAttribute("amount", "float")
        ```

    Attributes:
        name: ``[A-Za-z_][A-Za-z0-9_]*``, at most 64 characters, not a built-in name.
        type: One of :data:`TYPES`.

    Raises:
        ConfigurationError: a bad name or type, or the name declared before with another type.
    """

    name: str
    type: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ConfigurationError(
                f"search attribute name {self.name!r} is invalid: use letters, digits and _ "
                "(not first), at most 64 characters"
            )
        if self.name in BUILTINS or self.name.lower() in _KEYWORDS:
            raise ConfigurationError(
                f"search attribute name {self.name!r} is reserved (built-ins: {sorted(BUILTINS)}; "
                "query words: and, or, not, in, true, false)"
            )
        if self.type not in TYPES:
            raise ConfigurationError(
                f"search attribute {self.name!r}: unknown type {self.type!r}; use one of {list(TYPES)}"
            )
        with _lock:
            known = _declared.get(self.name)
            if known is not None and known != self.type:
                raise ConfigurationError(
                    f"search attribute {self.name!r} is already declared as {known!r}, not {self.type!r}"
                )
            _declared[self.name] = self.type


_declared: dict[str, str] = {}
_lock = threading.Lock()


def declared() -> dict[str, str]:
    """The search attributes declared in this process: name -> type."""
    with _lock:
        return dict(_declared)


# ------------------------------------------------------------------------- values


def encode_values(
    values: Any, what: str = "search attribute", types: Mapping[str, str] | None = None
) -> dict[str, list[Any] | None]:
    """Check ``values`` (name -> value) against the declarations (``types``; default: this
    process's) and encode them.

    Returns name -> ``[type, stored value]`` (datetimes as UTC ms; lists sorted, without
    duplicates), or ``None`` for a name whose value is ``None`` (it is removed).

    Raises:
        ConfigurationError: not a mapping, an undeclared name, or a value of the wrong type.
    """
    if not isinstance(values, dict):
        raise ConfigurationError(f"{what}s must be a dict of name -> value, not {type(values).__name__}")
    if len(values) > MAX_ATTRIBUTES:
        raise ConfigurationError(f"{len(values)} {what}s in one call; at most {MAX_ATTRIBUTES} per run")
    types = declared() if types is None else types
    out: dict[str, list[Any] | None] = {}
    for name in sorted(values, key=str):
        if isinstance(name, str) and (name in BUILTINS or name.lower() in _KEYWORDS):
            raise ConfigurationError(
                f"{what} {name!r} is a built-in attribute, kept by the store from the run record: "
                "workflow code cannot set it (nor can search_attributes= at start)"
                if name in BUILTINS
                else f"{what} name {name!r} is a query word (and, or, not, in, true, false): it cannot "
                "be declared or set"
            )
        if not isinstance(name, str) or name not in types:
            hint = f"declared: {sorted(types)}" if types else "none are declared"
            raise ConfigurationError(
                f"unknown {what} {name!r}: declare it first with durable.SearchAttribute({name!r}, TYPE) "
                f"({hint})"
            )
        value = values[name]
        out[name] = None if value is None else [types[name], _encode(name, types[name], value)]
    return out


def start_attributes(values: Any, published: Callable[[], Mapping[str, str]]) -> dict[str, list[Any]]:
    """:func:`encode_values` of a start's ``search_attributes=`` (``None`` values left out). A
    name this process does not declare is looked up in ``published``: the types the workers
    published (a server or CLI without --app imports no declarations; its queries use those)."""
    types = declared()
    if values and isinstance(values, dict) and not set(values) <= set(types):
        types = dict(published())
    return {k: v for k, v in encode_values(values or {}, types=types).items() if v is not None}


def _encode(name: str, kind: str, value: Any) -> Any:
    def wrong(expected: str) -> ConfigurationError:
        return ConfigurationError(
            f"search attribute {name!r} is {_a(kind)}: expected {expected}, got {type(value).__name__} "
            f"{_short(value)}"
        )

    if kind == "keyword":
        if not isinstance(value, str):
            raise wrong("a str")
        return _keyword(name, value)
    if kind == "text":
        if not isinstance(value, str):
            raise wrong("a str")
        if len(value) > MAX_TEXT:
            raise ConfigurationError(f"search attribute {name!r}: text longer than {MAX_TEXT} characters")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise wrong("True or False")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("an int")
        if abs(value) > MAX_SAFE_INT:
            raise ConfigurationError(f"search attribute {name!r}: {value} is beyond ±2**53 (not indexable)")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise wrong("a float")
        number = _float(value)
        if not math.isfinite(number):
            raise ConfigurationError(f"search attribute {name!r}: {_short(value)} is not a finite number")
        return number
    if kind == "datetime":
        if not isinstance(value, datetime):
            raise wrong("a datetime")
        if value.tzinfo is None:
            raise ConfigurationError(
                f"search attribute {name!r}: give a timezone-aware datetime (e.g. durable.now()), not a "
                "naive one"
            )
        return int(value.timestamp() * 1000)
    if not isinstance(value, list | tuple | set | frozenset) or not all(isinstance(v, str) for v in value):
        raise wrong("a list of str")
    items = sorted({_keyword(name, v) for v in value})
    if len(items) > MAX_LIST:
        raise ConfigurationError(f"search attribute {name!r}: more than {MAX_LIST} keywords in the list")
    return items


def _keyword(name: str, value: str) -> str:
    if len(value) > MAX_KEYWORD:
        raise ConfigurationError(f"search attribute {name!r}: keyword longer than {MAX_KEYWORD} characters")
    return value


def _short(value: Any) -> str:
    return _clip(repr(value))


def _clip(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _float(value: int | float | Decimal) -> float:
    """``value`` as a float; infinite when its magnitude is beyond a float's (a huge int)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _a(word: str) -> str:
    """``word`` with its indefinite article: ``a float``, ``an int``."""
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def decode_values(stored: dict[str, Any] | None) -> dict[str, Any]:
    """Stored ``{name: [type, value]}`` as Python values (datetimes back as UTC datetimes)."""
    out: dict[str, Any] = {}
    for name, item in (stored or {}).items():
        if not isinstance(item, list | tuple) or len(item) != 2:
            continue
        kind, value = item
        out[name] = datetime.fromtimestamp(value / 1000, tz=UTC) if kind == "datetime" else value
    return out


def text_words(value: str) -> list[str]:
    """The indexed words of a text value: lower-cased runs of letters and digits, deduplicated."""
    return sorted(set(_WORD.findall(value.lower())))


# -------------------------------------------------------------------------- query


@dataclass(frozen=True)
class Comparison:
    """One checked comparison: ``attribute op values`` (values encoded like stored ones).

    ``op`` is ``=``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``in`` or ``not in``; ``kind`` the
    attribute's type.
    """

    attribute: str
    kind: str
    op: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Query:
    """A parsed ``--where`` tree: ``op`` is ``and`` / ``or`` / ``not`` over ``items``."""

    op: str
    items: tuple[Query | Comparison, ...]


_KEYWORDS = {"and", "or", "not", "in", "true", "false"}
_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\")|(?P<num>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
    r"|(?P<op><=|>=|!=|<>|=|<|>|\(|\)|,)|(?P<name>[A-Za-z_][A-Za-z0-9_]*))"
)


@dataclass(frozen=True)
class _Tok:
    kind: str  # str, num, op, name, word (a keyword), end
    text: str
    value: Any
    pos: int  # 1-based


def _tokens(where: str) -> list[_Tok]:
    out, i = [], 0
    while True:
        while i < len(where) and where[i].isspace():
            i += 1
        if i >= len(where):
            out.append(_Tok("end", "", None, len(where) + 1))
            return out
        m = _TOKEN.match(where, i)
        if m is None or m.end() == i:
            ch = where[i]
            hint = " (an unterminated string?)" if ch in "'\"" else ""
            raise SearchQueryError(
                f"--where syntax error at position {i + 1}: unexpected {ch!r}{hint}", where, i + 1
            )
        pos = m.start(m.lastgroup or 0) + 1
        text = m.group(m.lastgroup or 0)
        if m.lastgroup == "str":
            q = text[0]
            out.append(_Tok("str", text, text[1:-1].replace(q + q, q), pos))
        elif m.lastgroup == "num":  # exact, whatever its size: literal() checks it for its attribute
            out.append(_Tok("num", text, Decimal(text), pos))
        elif m.lastgroup == "name" and text.lower() in _KEYWORDS:
            word = text.lower()
            kind = "bool" if word in ("true", "false") else "word"
            out.append(_Tok(kind, word, word == "true", pos))
        else:
            out.append(_Tok(m.lastgroup or "op", "!=" if text == "<>" else text, text, pos))
        i = m.end()


MAX_NESTING = 64
"""Most levels of ``not`` and parentheses a ``--where`` expression may nest."""


class _Parser:
    """Recursive descent over :func:`_tokens`: or > and > not > comparison / parentheses."""

    def __init__(self, where: str, types: dict[str, str]) -> None:
        self.where = where
        self.types = types
        self.toks = _tokens(where)
        self.i = 0
        self.depth = 0

    def error(self, message: str, tok: _Tok) -> SearchQueryError:
        got = "end of input" if tok.kind == "end" else _short(tok.text)
        return SearchQueryError(
            f"--where syntax error at position {tok.pos}: {message} (got {got})", self.where, tok.pos
        )

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def accept(self, kind: str, text: str) -> bool:
        tok = self.peek()
        if tok.kind == kind and tok.text == text:
            self.i += 1
            return True
        return False

    def parse(self) -> Query | Comparison:
        node = self.disjunction()
        if self.peek().kind != "end":
            raise self.error("expected 'and', 'or' or the end", self.peek())
        return node

    def disjunction(self) -> Query | Comparison:
        items = [self.conjunction()]
        while self.accept("word", "or"):
            items.append(self.conjunction())
        return items[0] if len(items) == 1 else Query("or", tuple(items))

    def conjunction(self) -> Query | Comparison:
        items = [self.negation()]
        while self.accept("word", "and"):
            items.append(self.negation())
        return items[0] if len(items) == 1 else Query("and", tuple(items))

    def negation(self) -> Query | Comparison:
        tok = self.peek()
        if (tok.kind, tok.text) in (("word", "not"), ("op", "(")):
            # Each level is a Python frame here and in the query's compilation: a bound keeps
            # an absurd expression a clear error instead of a RecursionError.
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise self.error(f"nested deeper than {MAX_NESTING} levels of 'not' and parentheses", tok)
        if self.accept("word", "not"):
            node: Query | Comparison = Query("not", (self.negation(),))
        elif self.accept("op", "("):
            node = self.disjunction()
            if not self.accept("op", ")"):
                raise self.error("expected ')'", self.peek())
        else:
            return self.comparison()
        self.depth -= 1
        return node

    def comparison(self) -> Comparison:
        tok = self.take()
        if tok.kind != "name":
            raise self.error("expected an attribute name", tok)
        kind = self.types.get(tok.text)
        if kind is None:
            known = sorted(self.types)
            raise SearchQueryError(
                f"--where: unknown search attribute {_clip(repr(tok.text))} at position {tok.pos}; known: {known}",
                self.where,
                tok.pos,
            )
        op_tok = self.take()
        if op_tok.kind == "word" and op_tok.text == "not":
            if not self.accept("word", "in"):
                raise self.error("expected 'in' after 'not'", self.peek())
            op = "not in"
        elif op_tok.kind == "word" and op_tok.text == "in":
            op = "in"
        elif op_tok.kind == "op" and op_tok.text in ("=", "!=", "<", "<=", ">", ">="):
            op = op_tok.text
        else:
            raise self.error(f"expected a comparison (=, !=, <, <=, >, >=, in) after {tok.text!r}", op_tok)
        if op in ("in", "not in"):
            if not self.accept("op", "("):
                raise self.error(f"expected '(' after {op!r}", self.peek())
            values = [self.literal(tok.text, kind)]
            while self.accept("op", ","):
                values.append(self.literal(tok.text, kind))
            if not self.accept("op", ")"):
                raise self.error("expected ',' or ')'", self.peek())
        else:
            values = [self.literal(tok.text, kind)]
        if op in ("<", "<=", ">", ">=") and kind not in ("int", "float", "datetime"):
            raise SearchQueryError(
                f"--where: {op!r} at position {op_tok.pos} compares {tok.text!r}, {_a(kind)}; ranges need an "
                "int, float or datetime attribute (use =, != or in)",
                self.where,
                op_tok.pos,
            )
        return Comparison(tok.text, kind, op, tuple(values))

    def literal(self, name: str, kind: str) -> Any:
        tok = self.take()
        if tok.kind not in ("str", "num", "bool"):
            raise self.error(f"expected a value for {name!r}", tok)
        if kind in ("keyword", "keyword_list", "text"):
            return self.string(tok, name, kind)
        if kind == "bool":
            if tok.kind == "bool":
                return tok.value
            if tok.kind == "str" and tok.value.lower() in ("true", "false"):
                return tok.value.lower() == "true"
            raise self.wrong(tok, name, kind, "true or false")
        if tok.kind == "num":
            return self.number(tok, name, kind)
        if kind != "datetime":
            raise self.wrong(tok, name, kind, "a number")
        if tok.kind != "str":
            raise self.wrong(tok, name, kind, "a quoted ISO 8601 date or time (or ms since the epoch)")
        try:
            moment = datetime.fromisoformat(tok.value)
        except ValueError:
            raise self.wrong(
                tok, name, kind, "an ISO 8601 date or time like '2026-11-01' or '2026-11-01T09:30:00Z'"
            ) from None
        if moment.tzinfo is None:  # a date or naive time is taken as UTC
            moment = moment.replace(tzinfo=UTC)
        return int(moment.timestamp() * 1000)

    def wrong(self, tok: _Tok, name: str, kind: str, expected: str) -> SearchQueryError:
        return SearchQueryError(
            f"--where: {name!r} is {_a(kind)}, so position {tok.pos} needs {expected}, not {_clip(tok.text)}",
            self.where,
            tok.pos,
        )

    def string(self, tok: _Tok, name: str, kind: str) -> str:
        """A keyword, keyword-list item or text literal, checked as a stored value would be."""
        if tok.kind != "str":
            raise self.wrong(tok, name, kind, "a quoted string")
        value: str = tok.value
        if name == "status" and value not in STATUS_WORDS:
            raise SearchQueryError(
                f"--where: unknown status {_short(value)} at position {tok.pos}; use one of {list(STATUS_WORDS)}"
                + NOT_A_STATUS.get(value, ""),
                self.where,
                tok.pos,
            )
        if kind == "text" and not text_words(value):
            raise SearchQueryError(
                f"--where: a text match needs at least one word (letters or digits); the string at "
                f"position {tok.pos} for {name!r} has none",
                self.where,
                tok.pos,
            )
        if kind != "text" and name not in BUILTINS and len(value) > MAX_KEYWORD:
            raise SearchQueryError(
                f"--where: {name!r} is {_a(kind)}, whose values are at most {MAX_KEYWORD} characters; the "
                f"string at position {tok.pos} has {len(value)} (no run can match it)",
                self.where,
                tok.pos,
            )
        return value

    def number(self, tok: _Tok, name: str, kind: str) -> int | float:
        """A number literal for an int, float or datetime (ms) attribute, in the range its
        stored values can have (no conversion overflows, and no such literal matches nothing
        because of its type)."""
        value: Decimal = tok.value
        if kind == "float":
            number = _float(value)
            if not math.isfinite(number):
                raise self.wrong(tok, name, kind, "a finite number (within a float's range)")
            return number
        if value != value.to_integral_value():
            raise self.wrong(tok, name, kind, "a whole number" + (" of ms" if kind == "datetime" else ""))
        if kind == "int" and value.copy_abs() > MAX_SAFE_INT:
            raise self.wrong(tok, name, kind, "a whole number within ±2**53 (what is indexable)")
        if kind == "datetime" and not MS_RANGE[0] <= value <= MS_RANGE[1]:
            raise self.wrong(
                tok, name, kind, f"ms since the epoch within years 1 to 9999 ({MS_RANGE[0]} to {MS_RANGE[1]})"
            )
        return int(value)


def parse_where(where: str, types: dict[str, str] | None = None) -> Query | Comparison | None:
    """Parse and type-check a ``--where`` expression (``None`` for an empty one).

    Args:
        where: e.g. ``customer = 'acme' and status = 'open' and started > '2026-11-01'``.
        types: name -> type of the custom attributes (default: this process's declarations);
            the built-ins are always known.

    Raises:
        SearchQueryError: a syntax error, an unknown attribute, a value of the wrong type or
            beyond what the attribute can hold (an int beyond ±2**53 or not whole, a float
            beyond a float's range, epoch ms beyond years 1..9999, a keyword over
            :data:`MAX_KEYWORD` characters), or a text literal without a word (the message gives
            the position and points at it).
    """
    if not isinstance(where, str):
        raise SearchQueryError(f"--where must be a string, not {type(where).__name__}")
    if not where.strip():
        return None
    known = {**(declared() if types is None else types), **BUILTINS}
    return _Parser(where, known).parse()
