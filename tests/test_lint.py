"""`durable check`: the determinism lint (workers/lint.py)."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from workers.cli import cli
from workers.lint import check_source

BAD = """\
import datetime as dt
import os
import random
import threading
import time
import uuid
from datetime import date, datetime
from pathlib import Path

import requests

from durable import Workflow, activity, now, query, signal, side_effect, timer, uuid4
from durable import all as all_
from durable import random as durable_random


def fetch(url):  # an activity: free to do I/O
    return requests.get(url).text


class {name}(Workflow):
    def handle(self, url):
        started = time.time()                       # line 23
        when = datetime.now()                       # line 24
        today = date.today()                        # line 25
        stamp = dt.datetime.utcnow()                # line 26
        pick = random.choice([1, 2])                # line 27
        ident = uuid.uuid4()                        # line 28
        home = os.environ["HOME"]                   # line 29
        user = os.getenv("USER")                    # line 30
        page = requests.get(url)                    # line 31
        text = open("/etc/hosts").read()            # line 32
        conf = Path("/etc/hosts").read_text()       # line 33
        threading.Thread(target=print).start()      # line 34
        time.sleep(1)                               # line 35
        all_([lambda: random.random()])             # line 36
        ok = os.urandom(4)  # durable: ignore
        return activity(fetch, url)

    @signal
    def poke(self, value):
        self.seen = time.monotonic()                # line 42

    @query
    def state(self):
        return os.environ.get("X")                  # line 46


class {name}Good(Workflow):
    def handle(self, url):
        t = now()
        r = durable_random()
        u = uuid4()
        s = side_effect(lambda: random.random())
        timer(5)
        return activity(fetch, url)


class NotAWorkflow:
    def run(self):
        return time.time()
"""


def _write(tmp_path: Path, module: str, name: str) -> Path:
    path = tmp_path / f"{module}.py"
    path.write_text(BAD.replace("{name}", name))
    return path


@pytest.fixture
def bad_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    try:
        import requests  # noqa: F401 - the app imports it; `durable check` imports the app
    except ImportError:  # not a dependency: a stand-in lets the app import (the lint reads names)
        (tmp_path / "requests.py").write_text("def get(url):\n    raise NotImplementedError\n")
    _write(tmp_path, "lint_bad_app", "LintBad")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "lint_bad_app"
    sys.modules.pop("lint_bad_app", None)


def test_check_source_flags_every_category(tmp_path: Path) -> None:
    source = BAD.replace("{name}", "LintSrc")
    findings = check_source(source, "bad.py")
    by_line = {f.line: f for f in findings}
    expected = {
        23: ("wall clock", "durable.now()"),
        24: ("wall clock", "durable.now()"),
        25: ("wall clock", "durable.now()"),
        26: ("wall clock", "durable.now()"),
        27: ("randomness", "durable.random()"),
        28: ("randomness", "durable.uuid4()"),
        29: ("environment", "argument"),
        30: ("environment", "argument"),
        31: ("network", "activity"),
        32: ("file I/O", "activity"),
        33: ("file I/O", "activity"),
        34: ("threads/processes", "durable.all"),
        35: ("sleep", "durable.timer"),
        36: ("randomness", "durable.random()"),
        42: ("wall clock", "durable.now()"),
        46: ("environment", "argument"),
    }
    for line, (category, fix) in expected.items():
        assert line in by_line, f"line {line} not flagged: {source.splitlines()[line - 1]}"
        assert by_line[line].category == category, (line, by_line[line])
        assert fix in by_line[line].fix, (line, by_line[line])
    flagged = {f.line for f in findings}
    # fetch() is an activity, the Good workflow uses durable's calls, NotAWorkflow is no workflow
    # (check_source without names looks at every class, so restrict to workflow classes):
    only = check_source(source, "bad.py", ["LintSrcGood"])
    assert only == []
    assert 37 not in flagged and 38 not in flagged  # `# durable: ignore`
    assert by_line[42].method == "poke" and by_line[46].method == "state"
    assert by_line[23].location == "bad.py:23"


def test_cli_check_reports_and_exits_1(bad_module: str) -> None:
    # Wide enough that no cell wraps, however long this run's temporary path is.
    result = CliRunner(env={"COLUMNS": "400"}).invoke(cli, ["check", "--app", bad_module])
    assert result.exit_code == 1, result.output
    assert "lint_bad_app.py:23" in result.output
    assert "durable.now()" in result.output
    assert "LintBad.handle" in result.output
    assert "NotAWorkflow" not in result.output
    assert "LintBadGood" not in result.output


def test_cli_check_json(bad_module: str) -> None:
    result = CliRunner().invoke(cli, ["check", "--app", bad_module, "--json"])
    assert result.exit_code == 1
    rows = json.loads(result.stdout)
    assert {r["category"] for r in rows} >= {"wall clock", "randomness", "network", "file I/O", "sleep"}
    assert all(r["workflow"] == "LintBad" for r in rows)


def test_cli_check_clean_module_exits_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "lint_good_app.py").write_text(
        textwrap.dedent(
            """
            import time
            from durable import Workflow, activity, now, timer

            def slow(x):
                time.sleep(0.01)  # fine: an activity
                return x

            class LintGood(Workflow):
                def handle(self, x):
                    timer(1)
                    return activity(slow, x), now().isoformat()
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        result = CliRunner().invoke(cli, ["check", "--app", "lint_good_app"])
    finally:
        sys.modules.pop("lint_good_app", None)
    assert result.exit_code == 0, result.output
    assert "OK: no determinism problems in 1 workflow class" in result.output


def test_cli_check_examples_are_clean() -> None:
    result = CliRunner().invoke(cli, ["check", "--app", "examples.order"])
    assert result.exit_code == 0, result.output


def test_cli_check_unknown_module() -> None:
    result = CliRunner().invoke(cli, ["check", "--app", "no_such_module_xyz"])
    assert result.exit_code == 1
    assert "cannot import app module" in result.output


def test_cli_check_flags_a_patch_the_class_does_not_declare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``patched("x")`` without ``x`` in ``patches`` answered False in every run: `durable
    check` said OK (a tester met it, coming from Temporal, where no declaration is needed)."""
    (tmp_path / "lint_patch_app.py").write_text(
        textwrap.dedent(
            """
            from durable import Workflow, patched

            class LintPatched(Workflow):
                patches = ("send-email",)

                def handle(self):
                    if patched("send-sms"):      # line 8: not declared
                        return "sms"
                    return "email" if patched("send-email") else "none"
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        result = CliRunner().invoke(cli, ["check", "--app", "lint_patch_app", "--json"])
    finally:
        sys.modules.pop("lint_patch_app", None)
    assert result.exit_code == 1, result.output
    [row] = json.loads(result.stdout)
    assert row["category"] == "undeclared patch" and row["line"] == 8 and "'send-sms'" in row["fix"], row


READ_ONLY = """
from durable import Workflow, await_signal, query, update


class {name}(Workflow):
    def __init__(self):
        self.items = []
        self.seen = 0

    def handle(self):
        self.items.append("started")
        return await_signal("go")

    @update
    def add(self, item):
        self.items.append(item)
        return len(self.items)

    @add.validator
    def check_add(self, item):
        self.items.append("validated-" + item)
        self.seen += 1
        self.last = item
        if not item:
            raise ValueError("empty item")

    @query
    def count(self):
        self.seen = self.seen + 1
        del self.items[0]
        return len(self.items)

    @query("peek")
    def peek_items(self):
        return list(self.items)
"""


def test_a_validator_or_a_query_that_changes_state_is_flagged() -> None:
    # A validator and a query run only when asked, never on replay: state they change differs
    # after a worker restarts (a tester's validator appended to a list: items vanished).
    source = READ_ONLY.format(name="LintReadOnly")
    findings = check_source(source, "ro.py")
    lines = source.splitlines()

    def line(text: str) -> int:
        return next(n for n, code in enumerate(lines, 1) if code.strip() == text)

    got = {(f.line, f.method, f.category) for f in findings}
    assert got == {
        (line('self.items.append("validated-" + item)'), "check_add", "validator changes state"),
        (line("self.seen += 1"), "check_add", "validator changes state"),
        (line("self.last = item"), "check_add", "validator changes state"),
        (line("self.seen = self.seen + 1"), "count", "query changes state"),
        (line("del self.items[0]"), "count", "query changes state"),
    }, findings
    [first] = [f for f in findings if f.line == line('self.items.append("validated-" + item)')]
    assert first.call == "self.items.append()" and "never on replay" in first.fix


def test_a_model_built_in_workflow_code_with_a_clock_or_random_default_factory_is_flagged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `Order()` in handle() with `id: str = Field(default_factory=uuid4)` gets a new id at every
    # replay: documented, and `durable check` said OK. The models live in their own module here.
    (tmp_path / "lint_models.py").write_text(
        textwrap.dedent(
            """
            import uuid
            from dataclasses import dataclass, field
            from datetime import datetime
            from uuid import uuid4
            from pydantic import BaseModel, Field

            class Order(BaseModel):
                id: str = Field(default_factory=lambda: str(uuid4()))
                at: datetime = Field(default_factory=datetime.now)
                tags: list[str] = Field(default_factory=list)

            @dataclass
            class Line:
                key: str = field(default_factory=lambda: uuid.uuid4().hex)
                n: int = 0
            """
        )
    )
    (tmp_path / "lint_factory_app.py").write_text(
        textwrap.dedent(
            """
            import lint_models
            from lint_models import Order
            from durable import Workflow, now, uuid4

            def made_in_an_activity():
                return Order()  # fine: an activity, recorded once

            class Shop(Workflow):
                def handle(self):
                    a = Order()
                    b = Order(id=str(uuid4()), at=now())
                    c = lint_models.Line(n=3)
                    d = Order(**{"id": "x"})
                    return a, b, c, d
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        result = CliRunner().invoke(cli, ["check", "--app", "lint_factory_app", "--json"])
    finally:
        sys.modules.pop("lint_factory_app", None)
        sys.modules.pop("lint_models", None)
    assert result.exit_code == 1, result.output
    rows = {(r["line"], r["call"], r["category"]) for r in json.loads(result.stdout)}
    assert rows == {
        (
            11,
            "Order() leaves id (default_factory uuid.uuid4()), at (default_factory datetime.datetime.now())",
            "randomness",
        ),
        (13, "lint_models.Line() leaves key (default_factory uuid.uuid4())", "randomness"),
    }, rows
    # The usual package layout, relative imports: `from .models import Order` was not followed.
    package = tmp_path / "lint_shop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text((tmp_path / "lint_models.py").read_text())
    (package / "flows.py").write_text(
        textwrap.dedent(
            """
            from . import models as m
            from .models import Order
            from durable import Workflow

            class RelShop(Workflow):
                def handle(self):
                    return Order(), m.Line()
            """
        )
    )
    try:
        result = CliRunner().invoke(cli, ["check", "--app", "lint_shop.flows", "--json"])
    finally:
        for name in ("lint_shop", "lint_shop.flows", "lint_shop.models"):
            sys.modules.pop(name, None)
    assert result.exit_code == 1, result.output
    assert {r["call"].split(" leaves")[0] for r in json.loads(result.stdout)} == {"Order()", "m.Line()"}


def test_cli_check_of_modules_that_define_no_workflow_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "OK: no determinism problems in 0 workflow class(es)", exit 0: read as a pass.
    (tmp_path / "lint_empty_pkg").mkdir()
    (tmp_path / "lint_empty_pkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        result = CliRunner().invoke(cli, ["check", "--app", "lint_empty_pkg"])
    finally:
        sys.modules.pop("lint_empty_pkg", None)
    assert result.exit_code == 1 and "defines no Workflow subclass" in result.output, result.output
