"""durable.testing: the pytest plugin, TestEnvironment, time skipping, activity mocks, replay checks."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest
from waiting import wait_for

from durable import (
    Activity,
    ActivityFailed,
    ConfigurationError,
    NondeterminismError,
    RetryPolicy,
    Workflow,
    activity,
    await_signal,
    now,
    registry,
    timer,
)

if TYPE_CHECKING:
    from durable.testing import TestEnvironment

# In a project, put this line in the top-level conftest.py. (durable.testing is imported
# lazily below so that pytest, not this module, imports the plugin first.)
pytest_plugins = ["durable.testing"]

#: Options for the ``durable_env`` fixture (same as ``@pytest.mark.durable(time_skipping=True)``).
SKIPPING = pytest.mark.parametrize("durable_env_options", [{"time_skipping": True}])


# ------------------------------------------------------------------ app code
def tt_fetch_price(item: str) -> int:
    return 100


def tt_reserve(item: str) -> str:
    return f"real-{item}"


class TTCharge(Activity):
    retry = RetryPolicy(initial_interval=0.05, max_attempts=2)

    def handle(self, cents: int) -> str:
        return f"charged-{cents}"


class TTLongSleep(Workflow):
    def handle(self, days: int) -> dict:
        before = now()
        timer(timedelta(days=days))
        after = now()
        return {"before": before.isoformat(), "after": after.isoformat(), "days": (after - before).days}


class TTHourTimer(Workflow):
    def handle(self) -> str:
        timer(timedelta(hours=1))
        return "woke"


class TTShop(Workflow):
    def handle(self, item: str) -> dict:
        price = activity(tt_fetch_price, item)
        reservation = activity(tt_reserve, item)
        charge = activity(TTCharge, price)
        return {"price": price, "reservation": reservation, "charge": charge}


class TTShopV2(Workflow):
    """TTShop after an unsafe change: reserves before fetching the price."""

    def handle(self, item: str) -> dict:
        reservation = activity(tt_reserve, item)
        price = activity(tt_fetch_price, item)
        charge = activity(TTCharge, price)
        return {"price": price, "reservation": reservation, "charge": charge}


class TTApproval(Workflow):
    def handle(self) -> str:
        try:
            return str(await_signal("approve", timeout=timedelta(days=2)))
        except Exception as exc:  # noqa: BLE001
            return f"timed out: {type(exc).__name__}"


# ------------------------------------------------------------------ time skipping
@SKIPPING
def test_time_skipping_runs_a_30_day_timer_in_milliseconds(durable_env: TestEnvironment) -> None:
    started = time.monotonic()
    stub = durable_env.start(TTLongSleep, 30)
    result = stub.result(timeout=10)
    elapsed = time.monotonic() - started
    assert elapsed < 2.0, elapsed
    assert result["days"] >= 30
    assert durable_env.skips >= 1
    assert durable_env.clock_offset >= timedelta(days=29, hours=23)
    fired = [e for e in stub.history() if e.type == "TimerFired"]
    assert fired and fired[0].ts - stub.history()[0].ts >= 30 * 86_400_000


@SKIPPING
def test_time_skipping_does_not_skip_while_nobody_waits(durable_env: TestEnvironment) -> None:
    # A signal wait with a 2-day deadline: the test signals before it asks for the result,
    # so the clock must not jump meanwhile.
    stub = durable_env.start(TTApproval)
    deadline = time.monotonic() + 5
    while stub.status() != "suspended" and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    assert durable_env.skips == 0
    stub.signal("approve", "alice")
    assert stub.result(timeout=10) == "alice"


@SKIPPING
def test_time_skipping_fires_a_signal_deadline_while_waiting(durable_env: TestEnvironment) -> None:
    stub = durable_env.start(TTApproval)
    assert stub.result(timeout=10) == "timed out: SignalTimeout"


def test_skip_moves_the_clock_by_hand(durable_env: TestEnvironment) -> None:
    stub = durable_env.start(TTHourTimer)
    deadline = time.monotonic() + 5
    while not any(e.type == "TimerStarted" for e in stub.history()) and time.monotonic() < deadline:
        time.sleep(0.02)
    before = durable_env.now()
    durable_env.skip(timedelta(minutes=61))
    assert durable_env.now() - before >= timedelta(minutes=61)
    assert stub.result(timeout=5) == "woke"


def test_skip_rejects_bad_durations(durable_env: TestEnvironment) -> None:
    with pytest.raises(Exception, match="non-negative"):
        durable_env.skip(-1)


# ------------------------------------------------------------------ mocks
def test_mock_activity_by_function_value_and_class(durable_env: TestEnvironment) -> None:
    durable_env.mock_activity(tt_fetch_price, lambda item: 7)
    durable_env.mock_activity("tt_reserve", "mocked-reservation")
    durable_env.mock_activity(TTCharge, lambda cents: f"fake-charge-{cents}")
    result = durable_env.start(TTShop, "pen").result(timeout=10)
    assert result == {"price": 7, "reservation": "mocked-reservation", "charge": "fake-charge-7"}


def test_mock_activity_with_an_exception_fails_the_activity(durable_env: TestEnvironment) -> None:
    durable_env.mock_activity(TTCharge, ValueError("card declined"))
    stub = durable_env.start(TTShop, "pen")
    with pytest.raises(Exception) as info:
        stub.result(timeout=10)
    assert isinstance(info.value.cause, ActivityFailed)  # type: ignore[attr-defined]
    assert "card declined" in str(info.value.cause)  # type: ignore[attr-defined]


def test_a_mocked_name_close_to_an_activity_is_refused_as_a_typo(durable_env: TestEnvironment) -> None:
    """It was taken, and the real activity ran (a test stubbing out a payment provider charged)."""
    with pytest.raises(ConfigurationError, match="did you mean 'tt_reserve'"):
        durable_env.mock_activity("tt_resreve", "x")  # defined beside TTShop, not registered yet
    durable_env.mock_activity("another_service_ships", "x")  # close to nothing: another process's
    durable_env.mock_activity("tt_reserves", "x", exact=True)  # another process's, close to ours


def test_mocks_are_restored_on_exit(durable_store) -> None:  # type: ignore[no-untyped-def]
    from durable.testing import TestEnvironment

    original = registry.activities()["TTCharge"]
    with TestEnvironment(store=durable_store, worker=False) as env:
        env.mock_activity(TTCharge, 1)
        env.mock_activity("tt_never_registered", 2)
        assert registry.activities()["TTCharge"].fn is not original.fn
        assert "tt_never_registered" in registry.activities()
    assert registry.activities()["TTCharge"] is original
    assert "tt_never_registered" not in registry.activities()


# ------------------------------------------------------------------ replay checks
def test_replay_history_accepts_stub_entries_export_and_dicts(durable_env: TestEnvironment, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from durable.testing import replay_history
    from workers.cli import export_history

    stub = durable_env.start(TTShop, "book", id="tt-shop-1")
    stub.result(timeout=10)
    assert replay_history(stub, TTShop).status == "completed"
    entries = durable_env.store.history(durable_env.store.ref("tt-shop-1"))
    assert replay_history(entries).status == "completed"
    exported = export_history(durable_env.store, "tt-shop-1")
    path = tmp_path / "shop.json"
    path.write_text(json.dumps(exported))
    assert replay_history(path, TTShop).status == "completed"
    assert replay_history(str(path)).status == "completed"
    assert replay_history(json.loads(path.read_text()), TTShop).status == "completed"

    with pytest.raises(NondeterminismError):
        replay_history(path, TTShopV2)
    with pytest.raises(NondeterminismError) as caught:
        replay_history(stub, TTShopV2)
    # A class of another type name: said, in case it is the wrong class rather than a new version.
    assert (
        "the history is of workflow type 'TTShop', replayed with class TTShopV2" in caught.value.__notes__[0]
    )


def test_replay_history_refuses_decoded_events(durable_env: TestEnvironment) -> None:
    from durable.testing import replay_history

    stub = durable_env.start(TTShop, "cup")
    stub.result(timeout=10)
    with pytest.raises(Exception, match="stored entries"):
        replay_history(stub.history(), TTShop)
    with pytest.raises(Exception, match="raw"):
        replay_history([{"seq": 1, "type": "WorkflowStarted"}], TTShop)


# ------------------------------------------------------------------ fixtures and standalone use
def test_durable_stub_fixture_is_bound_to_the_environment(durable_stub, durable_worker) -> None:  # type: ignore[no-untyped-def]
    stub = durable_stub(TTShop, id="tt-fixture")
    stub.start("mug")
    assert stub.result(timeout=10)["reservation"] == "real-mug"
    # Counted as each activity thread returns: the last may return after the run's commit.
    wait_for(lambda: durable_worker.activities_run >= 3, timeout=10)


def test_standalone_environment_owns_its_redis() -> None:
    from durable.testing import TestEnvironment

    with TestEnvironment(time_skipping=True) as env:
        url = env.store.url
        assert url and url.startswith("unix://")
        assert env.start(TTLongSleep, 3).result(timeout=10)["days"] >= 3
        server = env._server
    assert server is not None and not server.is_running()
