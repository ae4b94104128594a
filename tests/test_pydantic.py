"""Pydantic models as payloads (issue 18 item 2): encoded by the codec, converted by the
handlers' annotations, validation errors naming the field, the allowlist applied."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import uuid4

import pytest

pytest.importorskip(
    "pydantic", reason="pydantic is optional (the `pydantic` extra); install it to test models"
)

from apps.typed import (  # noqa: E402
    Account,
    BadActivityArgs,
    Doubled,
    EchoModel,
    Hidden,
    Item,
    Kind,
    Login,
    Note,
    Order,
    Payment,
    PriceOrder,
    Quote,
    Session,
    ShipParcel,
)
from apps.typed_models import Dimensions, Envelope, Parcel, Size, Slot, Unnamed  # noqa: E402
from procs import durable_cli, workers  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from durable import (
    ConfigurationError,
    SerializationError,
    UnknownTypeError,
    UpdateRejected,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowStub,
    client_updates,  # noqa: E402
    codec,
)  # noqa: E402


class Local(BaseModel):  # this test module is not on the codec's allowlist
    x: int


def test_models_round_trip_and_respect_the_allowlist() -> None:
    order = Order(id="o1", items=[Item(sku="a", qty=2)])
    assert codec.loads(codec.dumps(order, path="x")) == order
    assert codec.loads(codec.dumps([Note("n"), order], path="x")) == [Note("n"), order]
    payload = codec.dumps(Local(x=1), path="x")
    with pytest.raises(SerializationError, match="test_pydantic.*not allowed to be decoded.*allow_module"):
        codec.loads(payload)


def test_a_validator_can_pass_a_value_read_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A validator's verdict that changes with time ("must be in the future") refused the run's
    own recorded argument at a replay, and blocked it for good: a value read back is validated
    with the context {"durable": "decode"}, which such a validator checks."""
    codec.register_type(Slot)
    slot = Slot(at=datetime.now(UTC) + timedelta(milliseconds=50))
    stored = codec.dumps(slot, path="x")
    time.sleep(0.1)
    assert codec.loads(stored) == slot  # in the past now: passed, as it was written
    with pytest.raises(ValueError, match="must be in the future"):
        Slot(at=slot.at)  # given now, it is refused


def test_a_model_whose_any_field_would_come_back_another_type_is_refused() -> None:
    """A datetime in a dict[str, Any] field came back a str, silently: the activity given it
    failed on ``+ timedelta`` (and retried for ever). Refused when written, naming the field."""
    codec.register_type(Envelope)
    when = datetime(2026, 1, 1, tzinfo=UTC)
    with pytest.raises(
        SerializationError,
        match=r"field 'data\.when': datetime datetime\.datetime\(2026.* comes back as str '2026-01-01T00:00:00Z'.*"
        r"give the field the type it holds",
    ):
        codec.dumps(Envelope(kind="booked", data={"n": 1, "when": when}), path="x")
    plain = Envelope(kind="booked", data={"n": 1, "who": ["a", "b"]})  # JSON's own types: fine
    assert codec.loads(codec.dumps(plain, path="x")) == plain


def _payment() -> Payment:
    return Payment(
        when=datetime(2026, 12, 7, 5, 0, tzinfo=UTC), uid=uuid4(), amount=Decimal("1.50"), kind=Kind.CARD
    )


def test_aliased_strict_and_computed_models_come_back_equal() -> None:
    """Stored as pydantic writes JSON (by alias, without computed fields), read as it reads JSON:
    an aliased model failed ("field 'userId': Field required"), a strict one's datetime, UUID,
    Decimal and enum fields failed, and a computed field beside extra="forbid" was refused."""
    for model in (Account(userId=5), _payment(), Doubled(n=2)):
        assert codec.loads(codec.dumps(model, path="x")) == model


def test_a_model_that_would_not_come_back_is_refused_when_encoded() -> None:
    # A secret pydantic writes as '**********': it reached the activity as that string.
    with pytest.raises(
        SerializationError, match=r"at args\[0\]: field 'login.password' is a pydantic secret"
    ):
        codec.dumps([Session(login=Login(user="u", password="hunter2"))], path="args")
    with pytest.raises(SerializationError, match=r"field 'password' is a pydantic secret"):
        codec.dumps(Login(user="u", password="hunter2"), path="x")
    # A required field left out of what pydantic writes: it could never be read back.
    with pytest.raises(
        SerializationError, match=r"pydantic cannot rebuild it .*field 'token': Field required"
    ):
        codec.dumps(Hidden(token="t"), path="x")


def test_models_a_handler_names_are_allowed_wherever_they_are_defined() -> None:
    """A project's models.py beside its workflows: the classes the registered handlers'
    annotations name (and those their fields name) decode with no allow_module; others do not."""
    parcel = Parcel(ref="p", dims=[Dimensions(size=Size.LARGE, grams=5)])
    assert codec.loads(codec.dumps(parcel, path="x")) == parcel
    assert codec.loads(codec.dumps(Size.SMALL, path="x")) is Size.SMALL
    payload = codec.dumps(Unnamed(x=1), path="x")
    with pytest.raises(SerializationError, match=r"'apps.typed_models' is not allowed to be decoded"):
        codec.loads(payload)


def test_a_bad_model_payload_names_the_field() -> None:
    payload = codec.dumps(Order(id="o", items=[Item(sku="a", qty=1)]), path="x")
    tampered = payload.replace(b"\xa3qty\x01", b"\xa3qty\x00")  # qty=0 violates gt=0
    assert tampered != payload
    with pytest.raises(SerializationError, match=r"apps.typed.Order.*field 'items.0.qty'.*greater than 0"):
        codec.loads(tampered)


def _without_the_code(name: str) -> type:
    """``get_workflow`` of a process that does not import the app."""
    raise UnknownTypeError(f"workflow type {name!r} is not registered")


def test_workflows_and_activities_take_and_return_models(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with workers(redis_url, app="apps.typed"):
        order = Order(id="o1", items=[Item(sku="a", qty=2), Item(sku="b", qty=1)])
        assert WorkflowStub.make(PriceOrder).start(order, Note("gift")).result(timeout=30) == Quote(
            order_id="o1 (gift)", cents=300
        )
        # A dict for a dataclass parameter (a JSON body, `durable start`) is built into it: it
        # came as a dict and the code failed on `note.text` (retried for ever in an activity).
        by_dict = WorkflowStub.make("PriceOrder").start(
            order, {"text": "as JSON"}
        )  # by name: the worker converts
        assert by_dict.result(timeout=30) == Quote(order_id="o1 (as JSON)", cents=300)
        with pytest.raises(
            SerializationError, match=r"argument 'note' is invalid: field 'text': Field required"
        ):
            WorkflowStub.make(PriceOrder).start(order, {"txt": "typo"})
        # Neither a Note nor a dict: refused at the client too (it was taken, and the run failed
        # on it later, or its activity retried for ever).
        with pytest.raises(
            SerializationError,
            match=r"argument 'note' is invalid: expected a Note or a dict of its fields, got int",
        ):
            WorkflowStub.make(PriceOrder).start(order, 42)
        # A plain dict (a JSON body, the CLI) becomes the annotated model, for signals too.
        stub = WorkflowStub.make(PriceOrder).start({"id": "wait-1", "items": [{"sku": "a", "qty": 1}]})
        stub.signal("add", {"sku": "c", "qty": 4})
        stub.signal("done")
        assert stub.result(timeout=30) == Quote(order_id="wait-1", cents=500)
        # Through a worker, an activity and back: aliased, strict and computed-field models.
        for model in (Account(userId=7), _payment(), Doubled(n=3)):
            assert WorkflowStub.make(EchoModel).start(model).result(timeout=30) == model
        parcel = Parcel(
            ref="p", dims=[Dimensions(size=Size.SMALL, grams=2), Dimensions(size=Size.LARGE, grams=3)]
        )
        assert WorkflowStub.make(ShipParcel).start(parcel).result(timeout=30).ref == "p:5g"
        # Validation errors name the handler, the argument and the field: at the client, when
        # it has the workflow's class (nothing is written) ...
        bad_order = {"id": "o2", "items": [{"sku": "a", "qty": 0}]}
        with pytest.raises(
            SerializationError, match=r"\.handle: argument 'order' is invalid: field 'items.0.qty'"
        ):
            WorkflowStub.make(PriceOrder, id="refused-o2").start(bad_order)
        with pytest.raises(WorkflowNotFound):
            WorkflowStub.load("refused-o2")
        # ... else (the CLI, an HTTP server without the app) in the worker: the run fails.
        bad = WorkflowStub.make("PriceOrder").start(bad_order)  # by name: no class to check it with
        with pytest.raises(WorkflowFailed) as failed:
            bad.result(timeout=30)
        assert isinstance(failed.value.cause, SerializationError)
        assert "workflow 'PriceOrder': argument 'order' is invalid: field 'items.0.qty'" in str(
            failed.value.cause
        )
        message = WorkflowStub.make(BadActivityArgs).start().result(timeout=30)
        assert message.startswith("SerializationError: activity 'price': argument 'order' is invalid: ")
        assert "field 'items.0.qty': Input should be greater than 0" in message
        assert message.endswith("(attempts 1)")  # not retried: the input will not change


def test_an_update_argument_its_model_refuses_is_rejected_not_run(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was accepted (UpdateAccepted in the history), then its handler failed on the argument:
    docs/updates.md says an argument the handler cannot take is rejected, and nothing starts."""
    with workers(redis_url, app="apps.typed"):
        stub = WorkflowStub.make(PriceOrder).start({"id": "wait-u", "items": [{"sku": "a", "qty": 1}]})
        assert stub.update("add_now", {"sku": "b", "qty": 2}) == 1  # a dict validated into Item
        bad = {"sku": "c", "qty": 0}
        with pytest.raises(UpdateRejected, match=r"argument 'item' is invalid: field 'qty'"):
            stub.update("add_now", bad)  # refused here: this process has the class
        monkeypatch.setattr(client_updates, "get_workflow", _without_the_code)  # as the CLI is
        with pytest.raises(UpdateRejected, match=r"argument 'item' is invalid: field 'qty'"):
            stub.update("add_now", bad)  # refused by the worker, before any of the handler ran
        types = [e.type for e in stub.history()]
        assert types.count("UpdateAccepted") == 1 and types.count("UpdateRejected") == 1, types
        stub.signal("done")
        assert stub.result(timeout=30) == Quote(order_id="wait-u", cents=300)


def test_a_signal_its_handler_refuses_is_refused_by_a_sender_that_has_the_class(redis_url: str) -> None:
    """It was written and dropped by the run as a dead letter, and the sender (an HTTP
    endpoint's caller) was told it was sent."""
    stub = WorkflowStub.make(PriceOrder).start({"id": "wait-s", "items": [{"sku": "a", "qty": 1}]})
    with pytest.raises(SerializationError, match=r"@signal 'add' of PriceOrder.*field 'qty'.*greater than 0"):
        stub.signal("add", {"sku": "c", "qty": 0})
    with pytest.raises(ConfigurationError, match=r"@signal 'add' of PriceOrder"):
        stub.signal("add")
    # A stub loaded by id in a process that registered the class checks the same.
    with pytest.raises(SerializationError, match="field 'qty'"):
        WorkflowStub.load(stub.id).signal("add", {"sku": "c", "qty": -1})
    ref = stub.store.ref(stub.id)
    assert stub.store.redis.llen(stub.store.keys.inbox(ref.partition, ref.run_id)) == 0  # nothing sent
    # signal-with-start too (it started the run, and its signal was dropped as poison).
    fresh = WorkflowStub.make(PriceOrder)
    with pytest.raises(SerializationError, match=r"@signal 'add' of PriceOrder.*field 'qty'"):
        fresh.signal_with_start("add", {"sku": "c", "qty": 0}, start_args=({"id": "x", "items": []},))
    with pytest.raises(WorkflowNotFound):
        WorkflowStub.load(fresh.id)  # nothing started
    # `durable signal --app` checks the same, in a process of its own (without --app it has no
    # class: it sends, and the run drops the signal as a dead letter).
    said = durable_cli(redis_url, "signal", stub.id, "add", '{"sku": "c", "qty": 0}', "--app", "apps.typed")
    assert said.returncode == 1 and "field 'qty'" in said.stderr, said
    assert stub.store.redis.llen(stub.store.keys.inbox(ref.partition, ref.run_id)) == 0
    stub.signal("add", {"sku": "c", "qty": 2})  # a good one goes
    stub.signal("done")  # a name with no @signal handler (await_signal's) is not checked
    stub.terminate()


def test_annotations_that_cannot_be_resolved_are_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """A model imported under TYPE_CHECKING turned conversion off silently: the activity got a
    dict and failed with AttributeError, retried for ever."""
    from durable.typed_args import convert

    def takes(item: NotImportedHere) -> str:  # type: ignore[name-defined]  # noqa: F821
        return item

    caplog.set_level("WARNING", logger="durable")
    assert convert(takes, ({"sku": "a"},), "activity 'takes'") == ({"sku": "a"},)
    convert(takes, ({"sku": "b"},), "activity 'takes'")
    said = [r.getMessage() for r in caplog.records if "cannot be resolved" in r.getMessage()]
    assert len(said) == 1 and "NameError" in said[0] and "not under TYPE_CHECKING" in said[0], said


def test_a_strict_model_argument_given_as_json_data_is_read_as_json() -> None:
    """A strict model refused its datetime, UUID, Decimal and enum fields from a JSON body or the
    CLI (python mode takes only the types themselves), though the codec rebuilds it from JSON."""
    from durable.typed_args import convert

    def pay(payment: Payment) -> None: ...

    given = {"when": "2026-12-07T05:00:00Z", "uid": str(uuid4()), "amount": "1.50", "kind": "card"}
    (payment,) = convert(pay, (given,), "activity 'pay'")
    assert isinstance(payment, Payment) and payment.amount == Decimal("1.50") and payment.kind is Kind.CARD
    with pytest.raises(SerializationError, match=r"argument 'payment' is invalid: field 'amount'"):
        convert(pay, ({**given, "amount": "lots"},), "activity 'pay'")
