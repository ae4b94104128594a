"""A signal whose payload does not fit its handler is a poison input, not the run's failure.

Whoever can signal a run chooses the payload (docs/security.md): one that does not convert to
the ``@signal`` handler's declared types (a pydantic field fails validation), or arguments the
handler does not take, is dropped from the run and kept as a dead letter whose reason names
the signal, the argument and the field. The run goes on; later signals apply. The drop is
decided live only: the dropped signal is never in the history, so a replay does not meet it,
and a signal that *is* in a history (recorded by older code that applied it) replays as it
was applied.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip(
    "pydantic", reason="pydantic is optional (the `pydantic` extra); install it to test models"
)

from click.testing import CliRunner  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402
from sim import START_TS, entry, inbox_item  # noqa: E402
from waiting import wait_for  # noqa: E402

from durable import SerializationError, Workflow, WorkflowStub, await_signal, codec, signal  # noqa: E402
from durable import events as ev  # noqa: E402
from durable.replay import Driver  # noqa: E402
from durable.store.redis_store import RedisStore  # noqa: E402
from durable.testing import replay_history  # noqa: E402
from workers.cli import cli  # noqa: E402

INVALID = (
    "poison: SignalReceived 'note': signal 'note' of workflow 'SpBox': argument 'item' is invalid: "
    "field 'qty': Input should be greater than 0"
)


class SpItem(BaseModel):  # allowed: this module defines a workflow
    sku: str
    qty: int = Field(gt=0)


class SpBox(Workflow):
    def __init__(self) -> None:
        self.items: list[SpItem] = []

    def handle(self) -> list[str]:
        await_signal("done")
        return [f"{i.sku}x{i.qty}" for i in self.items]

    @signal
    def note(self, item: SpItem) -> None:
        assert isinstance(item, SpItem)  # converted before the handler ran
        self.items.append(item)


def signals_in(store: RedisStore, stub: WorkflowStub) -> list[str]:
    history = store.history(store.ref(stub.id))
    return [e.event.name for e in history if isinstance(e.event, ev.SignalReceived)]


# --------------------------------------------------------------------------------------------
# A real run: dead letter, the run goes on, the history replays
# --------------------------------------------------------------------------------------------


def _without_the_code(stub: WorkflowStub) -> WorkflowStub:
    """A stub of the same run in a process without the workflow's class (`durable signal`
    without --app, another service): it sends what it is given."""
    return WorkflowStub(stub.store, "", stub.id)


def test_a_signal_that_does_not_validate_is_a_dead_letter_and_the_run_goes_on(
    worker, store: RedisStore
) -> None:
    stub = WorkflowStub.make(SpBox).start()
    wait_for(lambda: stub.status() == "suspended")
    sender = _without_the_code(stub)  # a sender that has the class refuses it before sending
    sender.signal("note", {"sku": "b", "qty": 0})
    sender.signal("note", {"sku": "a", "qty": 2})
    sender.signal("done")
    assert stub.result(timeout=10) == ["ax2"]
    letters = store.dead_letters()
    assert [(d["kind"], d["reason"]) for d in letters] == [("inbox", INVALID)]
    assert ev.decode(bytes(letters[0]["e"])).event.payload == codec.dumps(({"sku": "b", "qty": 0},))
    # Beside the history, not in it: only the signals that were applied are recorded.
    assert signals_in(store, stub) == ["note", "done"]
    assert [d["reason"] for d in stub.describe().dropped] == [INVALID]
    listed = CliRunner().invoke(cli, ["list", "--dead"])
    assert listed.exit_code == 0 and "argument 'item' is invalid" in listed.output, listed.output
    # Today's code replays the history the run left (the dropped signal is not in it).
    assert replay_history(stub).status == "completed"


def test_arguments_the_handler_does_not_take_are_a_dead_letter_too(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(SpBox).start()
    wait_for(lambda: stub.status() == "suspended")
    sender = _without_the_code(stub)
    sender.signal("note", {"sku": "a", "qty": 1}, "extra")
    sender.signal("note")
    sender.signal("note", {"sku": "c", "qty": 3})
    sender.signal("done")
    assert stub.result(timeout=10) == ["cx3"]
    reasons = [d["reason"] for d in store.dead_letters()]
    assert len(reasons) == 2, reasons
    assert reasons[0].startswith("poison: SignalReceived 'note': signal 'note' of workflow 'SpBox' takes (")
    assert "too many positional arguments" in reasons[0]
    assert "missing a required argument: 'item'" in reasons[1]
    assert replay_history(stub).status == "completed"


# --------------------------------------------------------------------------------------------
# The driver: decided live, from the event and the code; a recorded signal stays applied
# --------------------------------------------------------------------------------------------


def started() -> ev.Entry:
    event = ev.WorkflowStarted(
        workflow_type="SpBox", workflow_id="sp-1", run_id="r-sp-1", args=codec.dumps(())
    )
    return entry(1, START_TS, event)


def note(payload: Any, ts: int) -> ev.Entry:
    return inbox_item(ev.SignalReceived(name="note", payload=codec.dumps((payload,))), ts)


def driver() -> Driver:
    return Driver(run_id="r-sp-1", workflow_id="sp-1", resolve=lambda _name: SpBox)


def first_decision() -> tuple[Driver, list[ev.Entry]]:
    """A driver past the run's first decision (the wait on "done"), and the history so far."""
    live = driver().replay([started()], undecided=True)
    history = [started()]
    for raw in live.decide().events:
        history.append(ev.decode(raw, seq=len(history) + 1))
    live.committed()
    return live, history


def test_the_driver_drops_a_poison_signal_and_applies_the_rest() -> None:
    live, history = first_decision()
    bad, good = note({"sku": "b", "qty": 0}, START_TS + 1), note({"sku": "a", "qty": 1}, START_TS + 2)
    decision = live.decide([bad, good])
    assert decision.dropped == [(bad.raw, INVALID)]
    assert decision.events == [good.raw] and decision.consumed == 2
    assert decision.closing is None and decision.status == "suspended"
    # A fresh driver on the committed history (the bad signal is not in it) agrees.
    replayed = driver().replay([*history, entry(len(history) + 1, good.ts, good.event)])
    assert [i.sku for i in replayed._instance.items] == ["a"]  # type: ignore[union-attr]


def test_a_bad_signal_recorded_in_a_history_is_applied_on_replay_as_it_was() -> None:
    """Older code applied such a signal (and failed the run): its history replays unchanged,
    the signal is not dropped now."""
    _, history = first_decision()
    bad = note({"sku": "b", "qty": 0}, START_TS + 1)
    history.append(entry(len(history) + 1, bad.ts, bad.event))
    # As the older code decided it: the signal applied (its handler raised), the run failed.
    older = driver().replay(history, undecided=True)
    closing = older.decide().closing
    assert isinstance(closing, ev.WorkflowFailedEvent)
    error = codec.loads(closing.error)
    assert isinstance(error, SerializationError)
    assert str(error) == INVALID.split(": ", 2)[2]
    # What it recorded replays as it was: the signal applied, not dropped (the failure would
    # then be missing from the replay: nondeterminism).
    replayed = driver().replay([*history, entry(len(history) + 1, START_TS + 1, closing)])
    assert replayed.closed_run and replayed.status == "failed"
