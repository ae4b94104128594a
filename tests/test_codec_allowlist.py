"""The payload never chooses what code runs: only allowed classes are built, dataclasses
go through ``__init__``, exceptions keep their type and attributes."""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import sys
import types
from http import HTTPStatus
from typing import Any

import greenlet
import msgpack
import pytest
from apps.payments import Checkout, PaymentDeclined

from durable import WorkflowStub, codec
from durable.codec import allowlist
from durable.errors import ApplicationError, SerializationError

ALLOWED = "durable_test_allowed_mod"
OTHER = "durable_test_other_mod"

SOURCE = """
from dataclasses import dataclass, field
from enum import Enum

CALLS = []

@dataclass(frozen=True)
class Money:
    amount: int
    currency: str = "EUR"
    seen: list = field(init=False, default_factory=list)

    def __post_init__(self):
        CALLS.append(("Money", self.amount))
        if self.amount < 0:
            raise ValueError("amount must be >= 0")

class Color(Enum):
    RED = 1

class Boom(Exception):
    def __init__(self, code, message):
        CALLS.append(("Boom.__init__", code))
        super().__init__(message)
        self.code = code
        self._detail = "private"

class Stop(BaseException):
    pass
"""


def make_module(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    exec(SOURCE, mod.__dict__)
    return mod


@pytest.fixture(scope="module")
def allowed() -> Any:
    mod = make_module(ALLOWED)
    codec.allow_module(ALLOWED)
    yield mod
    del sys.modules[ALLOWED]


@pytest.fixture(scope="module")
def other() -> Any:
    mod = make_module(OTHER)
    yield mod
    del sys.modules[OTHER]


def ext(code: int, body: Any) -> bytes:
    return msgpack.packb(msgpack.ExtType(code, msgpack.packb(body)))


# --------------------------------------------------------------------------------------------
# Which classes
# --------------------------------------------------------------------------------------------


def test_types_of_a_module_nobody_allowed_are_refused(other: Any) -> None:
    data = codec.dumps(other.Money(5))
    with pytest.raises(SerializationError) as info:
        codec.loads(data)
    msg = str(info.value)
    assert f"<{OTHER}.Money>" in msg and "not allowed" in msg
    assert f"durable.codec.allow_module({OTHER!r})" in msg and "register_type" in msg
    assert info.value.type_name == f"{OTHER}.Money"
    with pytest.raises(SerializationError, match="not allowed"):
        codec.loads(codec.dumps(other.Color.RED))


def test_allow_module_and_register_type(allowed: Any, other: Any) -> None:
    assert codec.loads(codec.dumps(allowed.Money(5))) == allowed.Money(5)
    assert codec.loads(codec.dumps(allowed.Color.RED)) is allowed.Color.RED
    assert codec.register_type(other.Color) is other.Color
    assert codec.loads(codec.dumps(other.Color.RED)) is other.Color.RED
    assert codec.is_allowed(other.Color) and not codec.is_allowed(other.Money)
    with pytest.raises(SerializationError):
        codec.loads(codec.dumps(other.Money(1)))


def test_allow_module_covers_submodules() -> None:
    name = "durable_test_pkg.models"
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    try:
        exec("from dataclasses import dataclass\n@dataclass\nclass A:\n    x: int\n", mod.__dict__)
        codec.allow_module("durable_test_pkg")
        assert codec.loads(codec.dumps(mod.A(1))) == mod.A(1)
    finally:
        del sys.modules[name]
    with pytest.raises(ValueError):
        codec.allow_module("")


def test_modules_of_registered_workflows_are_allowed_by_default() -> None:
    assert codec.is_allowed(PaymentDeclined)  # apps.payments defines Checkout, a Workflow
    assert codec.is_allowed(ApplicationError)  # durable's own
    assert codec.is_allowed(HTTPStatus) and codec.is_allowed(json.JSONDecodeError)  # stdlib Enum/exception


def test_stdlib_enum_and_exception_round_trip() -> None:
    assert codec.loads(codec.dumps(HTTPStatus.NOT_FOUND)) is HTTPStatus.NOT_FOUND
    try:
        json.loads("{oops")
    except json.JSONDecodeError as exc:
        back = codec.loads(codec.dumps(exc))
    assert type(back) is json.JSONDecodeError
    assert (back.pos, back.lineno, back.colno) == (1, 1, 2)


def test_a_class_re_exported_by_an_allowed_module_is_checked_where_it_is_defined(allowed: Any) -> None:
    allowed.Popen = __import__("subprocess").Popen  # reachable as durable_test_allowed_mod.Popen
    try:
        with pytest.raises(SerializationError, match="its module 'subprocess' is not allowed"):
            codec.loads(ext(11, [f"{ALLOWED}.Popen", {"args": ["true"]}]))
    finally:
        del allowed.Popen


def test_a_class_that_moved_decodes_through_its_old_modules_re_export(allowed: Any) -> None:
    """A payload recorded as ``old.Money`` after ``Money`` moved to another (allowed) module
    whose old module re-exports it: the run was blocked ("not loaded", though it was)."""
    old = types.ModuleType("durable_test_old_place")
    sys.modules[old.__name__] = old
    try:
        recorded = ext(11, [f"{old.__name__}.Money", {"amount": 3, "currency": "EUR"}])
        with pytest.raises(
            SerializationError, match="module 'durable_test_old_place' is loaded but has no 'Money'"
        ):
            codec.loads(recorded)
        old.Money = allowed.Money  # the old module keeps the name: `from new_place import Money`
        assert codec.loads(recorded) == allowed.Money(3)
    finally:
        del sys.modules[old.__name__]


def test_decoding_never_imports_nor_runs_module_getattr() -> None:
    lazy = types.ModuleType("durable_test_lazy_mod")
    calls: list[str] = []

    def module_getattr(name: str) -> Any:
        calls.append(name)
        raise AttributeError(name)

    lazy.__getattr__ = module_getattr  # type: ignore[method-assign]
    sys.modules[lazy.__name__] = lazy
    codec.allow_module(lazy.__name__)
    try:
        with pytest.raises(SerializationError, match="'durable_test_lazy_mod' is loaded but has no 'Thing'"):
            codec.loads(ext(11, ["durable_test_lazy_mod.Thing", {}]))
        assert calls == []
    finally:
        del sys.modules[lazy.__name__]
    with pytest.raises(SerializationError, match="not loaded"):
        codec.loads(ext(11, ["durable_test_never_imported.Thing", {}]))
    assert "durable_test_never_imported" not in sys.modules


# --------------------------------------------------------------------------------------------
# Dataclasses go through __init__
# --------------------------------------------------------------------------------------------


def test_dataclass_is_built_through_init(allowed: Any) -> None:
    allowed.CALLS.clear()
    m = allowed.Money(5, "USD")
    m.seen.append("x")  # an init=False field: restored, not recomputed
    back = codec.loads(codec.dumps(m))
    assert back == m and back.seen == ["x"]
    assert allowed.CALLS == [("Money", 5), ("Money", 5)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.amount = 1


def test_dataclass_validation_runs_on_decode(allowed: Any) -> None:
    with pytest.raises(SerializationError, match=r"Money\(\.\.\.\) raised ValueError: amount must be >= 0"):
        codec.loads(ext(11, [f"{ALLOWED}.Money", {"amount": -1}]))


def test_dataclass_unknown_and_missing_fields(allowed: Any) -> None:
    with pytest.raises(SerializationError, match=r"has no field\(s\) '__class__', 'admin'"):
        codec.loads(ext(11, [f"{ALLOWED}.Money", {"amount": 1, "admin": True, "__class__": 1}]))
    with pytest.raises(SerializationError, match="missing 1 required positional argument"):
        codec.loads(ext(11, [f"{ALLOWED}.Money", {}]))
    # A field added later with a default: older payloads still decode.
    assert codec.loads(ext(11, [f"{ALLOWED}.Money", {"amount": 3}])) == allowed.Money(3)


# --------------------------------------------------------------------------------------------
# Exceptions
# --------------------------------------------------------------------------------------------


def test_custom_exception_keeps_type_and_attributes(allowed: Any) -> None:
    allowed.CALLS.clear()
    back = codec.loads(codec.dumps(allowed.Boom(402, "card declined")))
    assert type(back) is allowed.Boom
    assert (back.code, back._detail, str(back), back.args) == (
        402,
        "private",
        "card declined",
        ("card declined",),
    )
    assert allowed.CALLS == [("Boom.__init__", 402)]  # at construction only, not on decode


def test_payment_declined_round_trips() -> None:
    back = codec.loads(codec.dumps(PaymentDeclined(402, "card declined")))
    assert isinstance(back, PaymentDeclined)
    assert back.code == 402 and str(back) == "card declined"


def test_disallowed_exception_becomes_application_error_naming_it(other: Any) -> None:
    back = codec.loads(codec.dumps(other.Boom(1, "nope")))
    assert type(back) is ApplicationError
    assert back.type_name == f"{OTHER}.Boom" and str(back) == "nope"
    assert any("allow_module" in note for note in back.__notes__)


@pytest.mark.parametrize(
    "exc",
    [KeyboardInterrupt("stop"), SystemExit(3), GeneratorExit(), greenlet.GreenletExit("bye")],
    ids=["KeyboardInterrupt", "SystemExit", "GeneratorExit", "GreenletExit"],
)
def test_base_exceptions_never_come_back_as_themselves(exc: BaseException) -> None:
    back = codec.loads(codec.dumps(exc))
    assert type(back) is ApplicationError
    assert back.type_name == f"{type(exc).__module__}.{type(exc).__qualname__}"
    assert "not an Exception" in back.__notes__[0]


def test_base_exception_of_an_allowed_module_is_not_rebuilt(allowed: Any) -> None:
    back = codec.loads(codec.dumps(allowed.Stop("x")))
    assert type(back) is ApplicationError and back.type_name == f"{ALLOWED}.Stop"


def test_os_errors_keep_errno_and_filename() -> None:
    back = codec.loads(codec.dumps(FileNotFoundError(errno.ENOENT, "No such file", "/x")))
    assert type(back) is FileNotFoundError
    assert (back.errno, back.filename, back.args) == (errno.ENOENT, "/x", (errno.ENOENT, "No such file"))


def test_exception_payload_cannot_set_dunder_attributes(allowed: Any) -> None:
    body = {
        "type": f"{ALLOWED}.Boom",
        "message": "m",
        "args": [msgpack.packb("m")],
        "traceback": "",
        "cause": None,
        "attrs": {"__class__": msgpack.packb(1), "__dict__": msgpack.packb({}), "code": msgpack.packb(7)},
    }
    back = codec.loads(ext(12, body))
    assert type(back) is allowed.Boom and back.code == 7


# --------------------------------------------------------------------------------------------
# End to end: an activity raises a custom exception, the workflow inspects it
# --------------------------------------------------------------------------------------------


def test_activity_exception_reaches_the_workflow_with_its_type(worker: Any) -> None:
    result = WorkflowStub.make(Checkout).start("4000-0000").result(timeout=15)
    assert result == {
        "type": "PaymentDeclined",
        "is_payment_declined": True,
        "code": 402,
        "message": "card declined",
        "original_type": None,
    }


def test_activity_exception_of_a_disallowed_module_names_its_type(worker: Any) -> None:
    result = WorkflowStub.make(Checkout).start("5555").result(timeout=15)
    assert result == {
        "type": "ApplicationError",
        "is_payment_declined": False,
        "code": None,
        "message": "gateway acme is down",
        "original_type": "apps.payment_errors.GatewayDown",
    }


def test_the_hint_names_the_module_a_missing_class_was_recorded_in(monkeypatch: pytest.MonkeyPatch) -> None:
    # A class recorded as pkg.models.Ticket whose module went in a deploy: the hint said to put a
    # re-export "in 'pkg'" (which cannot hold 'models.Ticket'); one recorded from a script's
    # __main__ said to put it in __main__ (the worker's entry script).
    monkeypatch.setattr(allowlist, "_modules", set(allowlist._modules))  # allowed here only
    pkg = types.ModuleType("durable_test_pkg")
    sys.modules[pkg.__name__] = pkg
    codec.allow_module(pkg.__name__)
    try:
        with pytest.raises(
            SerializationError,
            match=r"module 'durable_test_pkg\.models' is not loaded \(package 'durable_test_pkg' has no "
            r"'models'\): import it from the --app modules; if the class moved or was renamed, keep a "
            r"module 'durable_test_pkg\.models' re-exporting it",
        ):
            codec.loads(ext(11, ["durable_test_pkg.models.Ticket", {}]))
    finally:
        del sys.modules[pkg.__name__]
    codec.allow_module("__main__")  # (restored with _modules)
    with pytest.raises(
        SerializationError, match=r"defined in the script that wrote it \(__main__\), which no other"
    ):
        codec.loads(ext(11, ["__main__.NoSuchItem", {}]))


def test_a_client_encoding_a_class_of_its_script_is_warned(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A class of __main__ given to a start reads back in this process (a TestEnvironment beside
    # it) but not in a worker elsewhere, whose run is then blocked: said once, at the client.
    main = sys.modules["__main__"]
    Local = dataclasses.make_dataclass("Local", [("n", int)])  # noqa: N806
    Local.__module__ = "__main__"
    main.Local = Local
    monkeypatch.setattr(allowlist, "_modules", set(allowlist._modules))  # allowed here only
    codec.allow_module("__main__")
    try:
        with caplog.at_level(logging.WARNING, logger="durable.codec"):
            codec.dumps(Local(1), allowed_only=True)
            codec.dumps(Local(2), allowed_only=True)
        said = [
            r.getMessage()
            for r in caplog.records
            if "__main__.Local is defined in the script" in r.getMessage()
        ]
        assert len(said) == 1 and "move it to a module both import" in said[0], said
    finally:
        delattr(main, "Local")
