"""A client refuses to write what the decoder would refuse (docs/security.md, "Same rules both ways").

A dataclass, pydantic model or Enum member whose class is not on the allowlist is refused when
a client writes it (``codec.dumps(..., allowed_only=True)``: start, signal, update and schedule
arguments), with the decoder's reason (its module, how to allow it), and nothing is written.
A worker does write it (an activity's arguments, a result): the run that reads it is then
blocked, visibly and repairably, where an error at the write would fail it. Exceptions are
never refused: a decoder turns one it does not allow into an ``ApplicationError``.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

import msgpack
import pytest
from waiting import wait_for

from durable import (
    ApplicationError,
    SerializationError,
    Workflow,
    WorkflowStub,
    activity,
    await_signal,
    codec,
)
from durable.codec.ext import EXT_DATACLASS, EXT_ENUM
from durable.store.redis_store import RedisStore

MODELS = "durable_test_shopm.models"

SOURCE = """
from dataclasses import dataclass
from enum import Enum

@dataclass
class POrder:
    id: str

class Size(Enum):
    S = 1

class Declined(Exception):
    pass
"""


def make_module(name: str) -> types.ModuleType:
    """A models module of its own (no workflow or activity defined in it)."""
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    exec(SOURCE, mod.__dict__)
    return mod


@pytest.fixture(scope="module")
def shopm() -> Iterator[Any]:
    mod = make_module(MODELS)
    yield mod
    del sys.modules[MODELS]


def decoder_reason(code: int, name: str, body: Any) -> str:
    """What the decoder says about a payload naming ``name``, after ``cannot decode <kind> <name>: ``."""
    with pytest.raises(SerializationError) as info:
        codec.loads(msgpack.packb(msgpack.ExtType(code, msgpack.packb([name, body]))))
    return str(info.value).split(f"<{name}>: ", 1)[1]


def ae_ship(order: Any) -> str:  # not "ship": examples.order registers that name
    return "shipped"


class AeShip(Workflow):  # this test module defines a workflow: its own classes are allowed
    def handle(self, mode: str = "wait") -> str:
        if mode == "wait":
            return str(await_signal("go"))
        return activity(ae_ship, sys.modules[MODELS].POrder("o4"))


# --------------------------------------------------------------------------------------------
# dumps
# --------------------------------------------------------------------------------------------


def test_dumps_refuses_a_class_the_decoder_refuses_with_its_reason(shopm: Any) -> None:
    assert not codec.is_allowed(shopm.POrder)
    with pytest.raises(SerializationError) as info:
        codec.dumps({"orders": [shopm.POrder("o1")]}, path="args", allowed_only=True)
    reason = decoder_reason(EXT_DATACLASS, f"{MODELS}.POrder", {"id": "o1"})
    assert str(info.value) == f"cannot encode <{MODELS}.POrder> at args['orders'][0]: {reason}"
    assert reason.startswith(f"its module {MODELS!r} is not allowed to be decoded; ")
    assert f"durable.codec.allow_module({MODELS!r})" in reason
    assert info.value.type_name == f"{MODELS}.POrder" and info.value.path == "args['orders'][0]"
    with pytest.raises(SerializationError) as enum_info:
        codec.dumps(shopm.Size.S, allowed_only=True)
    assert str(enum_info.value) == f"cannot encode <{MODELS}.Size> at value: " + decoder_reason(
        EXT_ENUM, f"{MODELS}.Size", 1
    )


def test_dumps_refuses_a_pydantic_model_the_decoder_refuses() -> None:
    pydantic = pytest.importorskip("pydantic")
    name = "durable_test_shopm_pyd.models"
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    try:
        mod.BaseModel = pydantic.BaseModel
        exec("class PItem(BaseModel):\n    sku: str\n", mod.__dict__)
        with pytest.raises(SerializationError, match=rf"^cannot encode <{name}.PItem> at x: its module"):
            codec.dumps(mod.PItem(sku="a"), path="x", allowed_only=True)
        codec.allow_module(name)
        assert codec.loads(codec.dumps(mod.PItem(sku="a"))) == mod.PItem(sku="a")
    finally:
        del sys.modules[name]


def test_allowed_classes_still_encode(shopm: Any) -> None:
    assert codec.loads(codec.dumps(HTTPStatus.OK)) is HTTPStatus.OK  # a stdlib Enum
    back = codec.loads(codec.dumps(shopm.Declined("no")))  # exceptions are never refused
    assert type(back) is ApplicationError and back.type_name == f"{MODELS}.Declined"
    other = make_module("durable_test_shopm_reg.models")
    try:
        assert codec.register_type(other.POrder) is other.POrder
        assert codec.loads(codec.dumps(other.POrder("r"))) == other.POrder("r")
        with pytest.raises(SerializationError, match="not allowed"):
            codec.dumps(other.Size.S, allowed_only=True)  # registering one class allows that class only
    finally:
        del sys.modules["durable_test_shopm_reg.models"]


def test_the_verdict_follows_allow_module_and_registrations() -> None:
    name = "durable_test_shopm_late.models"
    mod = make_module(name)
    try:
        for _ in range(2):  # a refusal is not remembered
            with pytest.raises(SerializationError, match="not allowed"):
                codec.dumps(mod.POrder("x"), allowed_only=True)
        codec.allow_module("durable_test_shopm_late")  # the package: its submodules too
        assert codec.loads(codec.dumps(mod.POrder("x"))) == mod.POrder("x")
        assert codec.dumps(mod.Size.S)  # remembered now, and still encodes
    finally:
        del sys.modules[name]
    flows = make_module("durable_test_shopm_flows")
    try:
        with pytest.raises(SerializationError, match="not allowed"):
            codec.dumps(flows.POrder("y"), allowed_only=True)
        # The module then defines a workflow: registered workflows' modules are allowed.
        exec(
            "from durable import Workflow\nclass AeLate(Workflow):\n    def handle(self): ...\n",
            flows.__dict__,
        )
        assert codec.loads(codec.dumps(flows.POrder("y"))) == flows.POrder("y")
    finally:
        del sys.modules["durable_test_shopm_flows"]


# --------------------------------------------------------------------------------------------
# The call sites: start() and signal() refuse; activity() in workflow code writes
# --------------------------------------------------------------------------------------------


def test_start_with_an_argument_that_is_not_allowed_raises_and_writes_nothing(
    store: RedisStore, shopm: Any
) -> None:
    WorkflowStub.make(AeShip, store=store, id="ae-warm").start("activity")  # connection, meta keys
    before = {key: store.redis.type(key) for key in store.redis.keys("*")}
    stub = WorkflowStub.make(AeShip, store=store, id="ae-order")
    with pytest.raises(
        SerializationError, match=rf"^cannot encode <{MODELS}.POrder> at args\[0\]: its module"
    ):
        stub.start(shopm.POrder("o1"))
    assert {key: store.redis.type(key) for key in store.redis.keys("*")} == before
    sws = WorkflowStub.make(AeShip, store=store, id="ae-sws")
    with pytest.raises(SerializationError, match=r"at args\[0\]: its module"):
        sws.signal_with_start("go", shopm.POrder("o2"))
    with pytest.raises(SerializationError, match=r"at start_args\[0\]: its module"):
        sws.signal_with_start("go", start_args=[shopm.Size.S])
    assert {key: store.redis.type(key) for key in store.redis.keys("*")} == before


def test_signal_and_activity_with_an_argument_that_is_not_allowed_raise_at_the_call(
    worker, store: RedisStore, shopm: Any
) -> None:
    stub = WorkflowStub.make(AeShip).start()
    wait_for(lambda: stub.status() == "suspended")
    ref = store.ref(stub.id)
    inbox = store.keys.inbox(ref.partition, ref.run_id)
    with pytest.raises(
        SerializationError, match=rf"^cannot encode <{MODELS}.POrder> at args\[0\]: its module"
    ):
        stub.signal("go", shopm.POrder("o3"))
    assert store.redis.llen(inbox) == 0  # nothing delivered
    stub.signal("go", "fine")
    assert stub.result(timeout=10) == "fine"
    assert store.dead_letters() == []
    # Workflow code (a worker) writes it: the activity's task cannot be decoded, so the run is
    # blocked -- visibly, and repairable once the module is allowed -- not failed.
    unreadable = WorkflowStub.make(AeShip).start("activity")
    reason = wait_for(unreadable.blocked, timeout=10)
    assert f"its module {MODELS!r} is not allowed to be decoded" in reason.message, reason
    unreadable.terminate("test over")


def test_a_worker_writes_what_it_may_not_read_back_rather_than_failing(shopm: Any) -> None:
    """Without allowed_only (what workers write) the value is encoded: reading it back is
    what refuses it, and that blocks the run instead of failing it."""
    data = codec.dumps(shopm.POrder("w1"))
    with pytest.raises(SerializationError, match="is not allowed to be decoded"):
        codec.loads(data)
