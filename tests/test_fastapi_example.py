"""examples/fastapi_app.py (issue 18 item 1): a FastAPI handler starts a workflow and awaits it."""

from __future__ import annotations

import importlib.util

import pytest
from click.testing import CliRunner

from durable.store.redis_store import RedisStore

pytest.importorskip("pydantic", reason="the example's models need the optional pydantic")


def test_the_example_passes_the_determinism_lint() -> None:
    from workers.cli import cli

    result = CliRunner().invoke(cli, ["check", "--app", "examples.fastapi_app"])
    assert result.exit_code == 0, result.output


@pytest.mark.skipif(
    importlib.util.find_spec("fastapi") is None,
    reason="fastapi is an optional dependency of the example only (pip install fastapi, or the dev extra)",
)
def test_fastapi_app_starts_a_workflow_and_awaits_its_result(store: RedisStore) -> None:
    from examples import fastapi_app

    result = fastapi_app.main(store, timeout=30)
    placed = result["placed"]
    assert placed["cents"] == 500 and placed["charge_id"].startswith("ch-")
    assert result["again"] == placed  # idempotent: the retried POST got the first run's receipt
    assert result["status"] == {"status": "completed", "receipt": placed}
    assert result["unknown"] == 404
    assert result["invalid"] == 422  # the request body failed validation: no workflow started
    # One run for the order, though it was posted twice.
    assert [r["type"] for r in store.list_runs(workflow_type="WebOrder")] == ["WebOrder"]
