"""Two functions behind one activity name are refused, not run in each other's place.

A tester renamed an activity as the ``unknown_type`` hint says (``@register_activity(name=
"charge")`` on the new function) but kept the old ``def charge`` beside it: the worker started
with no warning and ``activity(charge)`` ran ``charge_card``.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from waiting import wait_for

from durable import ConfigurationError
from durable.registry import activity_definition_for
from durable.store.redis_store import RedisStore
from durable.testing import TestEnvironment
from workers.cli import cli

APP = """
from durable import register_activity


def an_charge(order):
    return f"charged {order} (old body)"


@register_activity(name="an_charge")
def an_charge_card(order):
    return f"charged {order} via card (new body)"
"""


def test_a_function_behind_another_ones_registered_name_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "an_clash_app.py").write_text(textwrap.dedent(APP))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        result = CliRunner().invoke(cli, ["check", "--app", "an_clash_app"])
        assert result.exit_code == 1
        assert "two activities named 'an_charge'" in result.output, result.output
        assert "an_clash_app.an_charge_card" in result.output and "an_clash_app.an_charge;" in result.output
        module = importlib.import_module("an_clash_app")
        with pytest.raises(ConfigurationError, match="is registered to an_clash_app.an_charge_card"):
            activity_definition_for(module.an_charge)  # what activity(an_charge) in a workflow does
        assert activity_definition_for(module.an_charge_card).fn is module.an_charge_card
    finally:
        sys.modules.pop("an_clash_app", None)


CLASH_A = "def pp_send(x):\n    return 'a:' + x\n"
CLASH_B = """
from durable import Workflow, activity


def pp_send(x):
    return 'b:' + x


class PpSends(Workflow):
    def handle(self, x):
        return activity(pp_send, x)
"""


def test_a_run_calling_a_function_whose_name_another_holds_is_blocked_not_run_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: RedisStore
) -> None:
    """Two modules of one worker with a plain ``pp_send`` each: ``activity(b.pp_send)`` ran
    ``a.pp_send`` (the name's first holder). Now the run is blocked, naming both."""
    (tmp_path / "pp_a.py").write_text(CLASH_A)
    (tmp_path / "pp_b.py").write_text(CLASH_B)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        a = importlib.import_module("pp_a")
        activity_definition_for(a.pp_send)  # the name's first holder in this process
        b = importlib.import_module("pp_b")
        with TestEnvironment(store=store) as env:
            stub = env.stub(b.PpSends).start("x")
            reason = wait_for(stub.blocked, timeout=20)
        assert "is registered to pp_a.pp_send" in reason.message and "durable repair" in reason.message, (
            reason
        )
    finally:
        sys.modules.pop("pp_a", None)
        sys.modules.pop("pp_b", None)


def test_check_warns_of_two_modules_plain_functions_of_one_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`durable check --app a --app b` said OK, the worker started, then b's runs were blocked."""
    (tmp_path / "pw_a.py").write_text(CLASH_A.replace("pp_send", "pw_send"))
    (tmp_path / "pw_b.py").write_text(CLASH_B.replace("pp_send", "pw_send").replace("PpSends", "PwSends"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        result = CliRunner().invoke(cli, ["check", "--app", "pw_a", "--app", "pw_b"])
        assert result.exit_code == 0, result.output  # not a replay problem: a warning
        assert (
            "warning: activity name 'pw_send' is held by pw_a.pw_send; activity(pw_b.pw_send)"
            in result.output
        )
    finally:
        sys.modules.pop("pw_a", None)
        sys.modules.pop("pw_b", None)


def test_an_activity_class_renamed_keeps_its_old_name_with_name_in_its_body() -> None:
    """The unknown_type hint for a renamed class said `@register_activity(name=...)`, which made
    the parked task runnable and then blocked the run again: `activity(NewClass)` recorded the new
    name. `name = 'old'` in the class body is what the hint says for a class now."""
    from durable import Activity  # noqa: PLC0415

    class AnChargeCard(Activity):
        name = "AnChargeOld"

        def handle(self, order: str) -> str:
            return f"charged {order}"

    definition = activity_definition_for(AnChargeCard)  # what activity(AnChargeCard) records
    assert definition.name == "AnChargeOld"
