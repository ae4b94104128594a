"""What a type checker sees of a workflow written as the docs show it (``mypy --strict``).

The handler decorators keep the method's signature (``@update`` adds ``.validator``),
``activity()`` and ``child()`` return what the target's ``handle`` (or function) returns,
awaited for an ``async def`` one, and ``AsyncWorkflowStub.make`` checks its options as
``WorkflowStub.make`` does; ``TestEnvironment.start`` gives a typed stub too. Before, the decorators were typed ``-> Any`` (``--strict`` refused
``@add.validator`` as an untyped decorator), ``activity()`` returned ``Any`` and a misspelled
option of the async ``make`` passed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _mypy(folder: Path, snippet: str, *options: str) -> str:
    """What mypy says of ``snippet`` (as ``snippet.py``), durable read from this checkout."""
    (folder / "snippet.py").write_text(snippet)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", *options, "--follow-imports=silent"]
        + ["--cache-dir", str(folder / "cache"), "snippet.py"],
        cwd=folder,
        env={**os.environ, "MYPYPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done.stdout


SNIPPET = """
from __future__ import annotations

from durable import (
    Activity, AsyncWorkflowStub, Workflow, WorkflowStub, activity, child, query, signal, update,
)
from durable.testing import TestEnvironment


class Charge(Activity):
    def handle(self, order_id: str, cents: int) -> str:
        return f"{order_id}:{cents}"


class Fetch(Activity):
    async def handle(self, url: str) -> bytes:
        return url.encode()


def reserve(sku: str) -> int:
    return len(sku)


async def look(url: str) -> float:
    return 1.0


class Order(Workflow):
    def __init__(self) -> None:
        self.items: list[str] = []

    @query
    def progress(self) -> int:
        return len(self.items)

    @signal(name="approve")
    def approve(self, who: str) -> None:
        self.items.append(who)

    @update
    def add(self, sku: str) -> int:
        self.items.append(sku)
        return len(self.items)

    @add.validator
    def _check_add(self, sku: str) -> None:
        if not sku:
            raise ValueError("empty sku")

    @update(name="remove")
    def drop(self, sku: str) -> bool:
        return sku in self.items

    @drop.validator
    def _check_drop(self, sku: str) -> None: ...

    def handle(self, order_id: str, cents: int) -> str:
        reveal_type(self.add("pen"))
        reveal_type(self.drop("pen"))
        reveal_type(self.progress())
        reveal_type(activity(Charge, order_id, cents, start_to_close_timeout=5))
        reveal_type(activity(reserve, "pen"))
        reveal_type(activity(Fetch, "u"))
        reveal_type(activity(look, "u"))
        reveal_type(child(Order, "o", 1, workflow_id="child"))
        self.add(3)
        activity(Charge, order_id, cents, retyr=None)
        return activity(Charge, order_id, cents)


stub = AsyncWorkflowStub.make(Order, id="o-1")
reveal_type(stub)
reveal_type(WorkflowStub.make(Order))
reveal_type(WorkflowStub.load("o-1"))
AsyncWorkflowStub.make(Order, execution_timout="1h")


def in_a_test(env: TestEnvironment) -> None:
    reveal_type(env.start(Order, "o", 1).result())
"""


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is in the dev extra")
def test_handlers_activities_children_and_stubs_are_typed(tmp_path: Path) -> None:
    out = _mypy(tmp_path, SNIPPET, "--strict")
    revealed = re.findall(r'Revealed type is "([^"]+)"', out)
    assert [t.removeprefix("builtins.") for t in revealed] == [
        "int",
        "bool",
        "int",
        "str",
        "int",
        "bytes",
        "float",
        "str",
        "durable.aio.AsyncWorkflowStub[str]",
        "durable.client.WorkflowStub[str]",
        "durable.client.WorkflowStub[Any]",
        "str",
    ], out
    # The three misuses, each on its line (an overload miss adds a "No overload variant" line),
    # and nothing about the decorators or the validators.
    errors = {int(n) for n in re.findall(r"^snippet\.py:(\d+): error:", out, re.M)}
    lines = SNIPPET.splitlines()
    assert sorted(lines[n - 1].strip() for n in errors) == [
        'AsyncWorkflowStub.make(Order, execution_timout="1h")',
        "activity(Charge, order_id, cents, retyr=None)",
        "self.add(3)",
    ], out
    assert 'Argument 1 has incompatible type "int"; expected "str"' in out


STUB_SNIPPET = """
from durable import Workflow, WorkflowStub


class Order(Workflow):
    def handle(self, order_id: str, cents: int) -> dict[str, int]:
        return {order_id: cents}


stub = WorkflowStub.make(Order, id="o-1")
reveal_type(stub.start("o-1", 5).result(timeout=1))
reveal_type(WorkflowStub.make("Order").result())
reveal_type(WorkflowStub.load("o-1").result())
wrong: str = stub.result()
"""


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is in the dev extra")
def test_make_gives_a_stub_typed_by_the_workflows_handle(tmp_path: Path) -> None:
    out = _mypy(tmp_path, STUB_SNIPPET)
    assert re.search(r'Revealed type is "(builtins\.)?dict\[(builtins\.)?str, (builtins\.)?int\]"', out), out
    assert out.count('Revealed type is "Any"') == 2, out
    assert (
        'Incompatible types in assignment (expression has type "dict[str, int]", variable has type "str")'
        in out
    )
    assert "Found 1 error" in out, out
