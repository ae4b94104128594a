"""Payloads shown to an operator whose tools do not import the application's code.

``durable result``, ``history``, ``describe``, the API and the UI decode payloads in a process
that has not imported the app, so a dataclass (or pydantic model, or enum) in a result could not
be built there: ``durable result`` failed with ``cannot decode dataclass <app.Receipt>: it is
not loaded in this process; import the module ...`` (the CLI has no way to), and history showed
``<undecodable payload: ...>``. They now show it by its type's name and its fields
(:func:`durable.codec.view`), while ``WorkflowStub.result()`` still returns real objects or
says why it cannot.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass

import pytest
from procs import durable_cli, workers

from durable import SerializationError, WorkflowStub, codec
from durable.dropped import preview


def _payload_of_a_class_then_gone() -> bytes:
    """A dataclass payload whose module is then unloaded (as in a process without the app)."""
    module = types.ModuleType("vw_gone_app")
    sys.modules[module.__name__] = module

    @dataclass
    class Parcel:
        weight: int

    Parcel.__module__, Parcel.__qualname__ = module.__name__, "Parcel"
    module.Parcel = Parcel  # type: ignore[attr-defined]
    codec.allow_module(module.__name__)
    try:
        return codec.dumps({"parcels": [Parcel(2), Parcel(5)], "n": 2})
    finally:
        del sys.modules[module.__name__]


def test_view_shows_a_class_it_cannot_build_by_name_and_fields() -> None:
    data = _payload_of_a_class_then_gone()
    with pytest.raises(SerializationError, match="it is not loaded in this process"):
        codec.loads(data)
    assert codec.view(data) == {
        "parcels": [
            {"__type__": "vw_gone_app.Parcel", "weight": 2},
            {"__type__": "vw_gone_app.Parcel", "weight": 5},
        ],
        "n": 2,
    }


def test_a_dropped_inputs_preview_shows_a_class_it_cannot_build() -> None:
    assert preview(_payload_of_a_class_then_gone()).startswith(
        "{'parcels': [{'__type__': 'vw_gone_app.Parcel', 'weight': 2}"
    )


def test_view_still_refuses_what_is_not_a_payload() -> None:
    with pytest.raises(SerializationError):
        codec.view(b"\xc1")  # never valid msgpack


def test_the_cli_shows_a_result_whose_classes_it_does_not_load(redis_url: str) -> None:
    with workers(redis_url, app="apps.receipts"):
        stub = WorkflowStub.make("ReceiptRun").start("o-7", 12.5)
        # This process has not imported apps.receipts either: the API says why it cannot build it.
        with pytest.raises(SerializationError, match=r"cannot decode .*apps\.receipts"):
            stub.result(timeout=30)
    shown = {"__type__": "apps.receipts.Receipt", "order": "o-7", "total": 12.5}
    shown["tier"] = {"__type__": "apps.receipts.Tier", "value": "gold"}
    out = durable_cli(redis_url, "result", stub.id)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"receipt": shown, "ok": True}
    history = json.loads(durable_cli(redis_url, "history", stub.id, "--json").stdout)
    (done,) = [e for e in history if e["type"] == "ActivityCompleted"]
    assert done["data"]["result"] == shown
    described = json.loads(durable_cli(redis_url, "describe", stub.id, "--json").stdout)
    assert described["outcome"]["result"] == {"receipt": shown, "ok": True}
    # `start --wait` prints it the same way (it exited 1 with the decode error of a completed run).
    with workers(redis_url, app="apps.receipts"):
        waited = durable_cli(redis_url, "start", "ReceiptRun", '"o-7"', "12.5", "--wait", "--timeout", "30")
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout.split("\n", 2)[2]) == {"receipt": shown, "ok": True}
