"""Issue 14 item 3: one undecodable input never blocks a run.

Each inbox item is decoded on its own; a signal or hook payload the worker cannot
decode (a class it does not allow, bytes that are not a payload) is a dead letter,
and the run goes on with the rest. ``durable repair --drop-input`` removes what
still blocks a run (e.g. an activity result this worker cannot decode).
"""

from __future__ import annotations

import sys
import time
import types
from typing import Any

import msgpack
from click.testing import CliRunner
from waiting import wait_for

from durable import Workflow, WorkflowStub, activity, await_signal, codec
from durable import events as ev
from durable.store.redis_store import RedisStore
from workers.cli import cli

FOREIGN = "durable_test_h5_foreign_mod"


class PoisonWait(Workflow):
    def handle(self) -> Any:
        first = await_signal("go")
        return first


def h5_slow() -> str:
    time.sleep(1.0)
    return "real"


class SlowStep(Workflow):
    def handle(self) -> Any:
        return activity(h5_slow)


def foreign_payload() -> bytes:
    """A payload naming a dataclass of a module the worker does not allow."""
    mod = types.ModuleType(FOREIGN)
    sys.modules[FOREIGN] = mod
    exec("from dataclasses import dataclass\n@dataclass\nclass Card:\n    number: str\n", mod.__dict__)
    try:
        return codec.dumps((mod.Card("4111"),), path="payload")
    finally:
        del sys.modules[FOREIGN]


def push_signal(store: RedisStore, stub: WorkflowStub, name: str, payload: bytes) -> None:
    store.deliver(stub.id, ev.SignalReceived(name=name, payload=payload))


def test_undecodable_signal_payload_is_a_dead_letter_and_the_run_goes_on(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(PoisonWait).start()
    wait_for(lambda: stub.status() == "suspended")
    push_signal(store, stub, "go", foreign_payload())
    stub.signal("go", "ok")
    assert stub.result(timeout=10) == "ok"
    letters = store.dead_letters()
    assert [d["kind"] for d in letters] == ["inbox"]
    assert letters[0]["reason"].startswith("poison: SignalReceived 'go'") and FOREIGN in letters[0]["reason"]


def test_invalid_utf8_in_a_signal_payload_or_envelope_is_a_dead_letter(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(PoisonWait).start()
    wait_for(lambda: stub.status() == "suspended")
    ref = store.ref(stub.id)
    push_signal(store, stub, "go", b"\x91\xa2\xff\xfe")  # (str of two bytes that are not UTF-8,)
    envelope = msgpack.packb(
        {"type": "SignalReceived", "ts": 1, "data": {"name": b"g\xff", "payload": b"\x90"}},
        use_bin_type=False,
    )
    store.redis.rpush(store.keys.inbox(ref.partition, ref.run_id), envelope)
    stub.signal("go", "ok")
    assert stub.result(timeout=10) == "ok"
    letters = store.dead_letters()
    assert [(d["kind"], d["run"]) for d in letters] == [("inbox", ref.run_id)] * 2
    reasons = sorted(d["reason"] for d in letters)
    assert reasons[0].startswith("poison: SignalReceived 'go': ")
    assert reasons[1].startswith("poison: run ") and "not valid msgpack" in reasons[1]
    assert {bytes(d["e"]) for d in letters} >= {envelope}  # the raw bytes are kept


def test_undecodable_activity_result_blocks_until_repair_drop_input(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(SlowStep).start()
    wait_for(lambda: stub.snapshot().get("pending"))
    ref = store.ref(stub.id)
    # A forged result naming a class this worker does not allow arrives before the real one.
    store.deliver(stub.id, ev.ActivityCompleted(id="1", result=foreign_payload(), attempt=1))
    blocked = wait_for(lambda: stub.snapshot()["blocked"], timeout=10)
    assert blocked.startswith("SerializationError: ") and FOREIGN in blocked
    assert store.redis.hget(store.keys.run(ref.partition, ref.run_id), "blocked_input") == b"1"
    wait_for(lambda: store.redis.llen(store.keys.inbox(ref.partition, ref.run_id)) == 2, timeout=10)
    result = CliRunner().invoke(cli, ["repair", stub.id, "--drop-input"])
    assert result.exit_code == 0, result.output
    assert "dead letter" in result.output
    assert stub.result(timeout=10) == "real"
    letters = [d for d in store.dead_letters() if d["kind"] == "inbox"]
    assert len(letters) == 1 and letters[0]["reason"].startswith(
        "dropped by durable repair: SerializationError"
    )
    listed = CliRunner().invoke(cli, ["list", "--dead"])
    assert listed.exit_code == 0 and "dropped by durable repair" in listed.output


def test_repair_drop_input_without_a_recorded_position_drops_the_first(store: RedisStore) -> None:
    stub = WorkflowStub.make(PoisonWait, store=store).start()  # no worker
    ref = store.ref(stub.id)
    stub.signal("go", "first")
    stub.signal("go", "second")
    store.repair(stub.id, drop_input=True)
    inbox = store.redis.lrange(store.keys.inbox(ref.partition, ref.run_id), 0, -1)
    assert len(inbox) == 1 and ev.decode(inbox[0]).event.payload == codec.dumps(("second",))
    assert [d["kind"] for d in store.dead_letters()] == ["inbox"]
