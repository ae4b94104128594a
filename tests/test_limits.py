"""Limits (durable.limits): each one refused with an error naming it, nothing written.

Payload size, signal/query names, queue names, pending signals and history size at the
client; pending activities/children and the history hard limit in the decision, which
terminates the run with a reason naming the limit (also in a real worker process).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from apps.limits import (
    BigResult,
    BigResults,
    BigSideEffectsThenDone,
    ChildFanOut,
    FanOut,
    FillsThenWaits,
    Grower,
    LargeArgument,
    Loud,
    SideEffectsThenDone,
    Sink,
    TwoSignalsThenAgain,
    limits_echo,
)
from procs import workers
from sim import Sim
from waiting import wait_for

from durable import (
    ApplicationError,
    ConfigurationError,
    LimitExceeded,
    Limits,
    PayloadTooLarge,
    SerializationError,
    Workflow,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowStub,
    activity,
    continue_as_new,
    history_budget,
    should_continue_as_new,
)
from durable import codec as payload_codec
from durable import events as ev
from durable.limits import ENV, current, reset_limits, set_limits
from durable.replay import replay_history
from durable.store.redis_store import RedisStore
from durable.testing import TestEnvironment


@pytest.fixture(autouse=True)
def _default_limits() -> Iterator[None]:
    reset_limits()
    yield
    reset_limits()


def _use(**overrides: int) -> None:
    set_limits(Limits(**overrides))


def _history_types(stub: WorkflowStub) -> list[str]:
    return [e.type for e in stub.history()]


# ----------------------------------------------------------------- configuration
def test_defaults_follow_temporal_and_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = current()
    assert limits.max_payload_bytes == 2 * 1024 * 1024 and limits.warn_payload_bytes == 256 * 1024
    assert (limits.max_history_events, limits.max_history_bytes) == (51_200, 50 * 1024 * 1024)
    assert limits.max_pending_activities == limits.max_pending_children == 2_000
    assert limits.max_name_length == 255
    monkeypatch.setenv(ENV["max_pending_activities"], "500")
    monkeypatch.setenv("DURABLE_MAX_PAYLOAD_BYTES", "1_000_000")
    reset_limits()
    assert current().max_pending_activities == 500 and current().max_payload_bytes == 1_000_000
    monkeypatch.setenv("DURABLE_MAX_HISTORY_EVENTS", "lots")
    reset_limits()
    with pytest.raises(ConfigurationError, match="DURABLE_MAX_HISTORY_EVENTS"):
        current()
    with pytest.raises(ConfigurationError, match="max_name_length"):
        Limits(max_name_length=0)


# ------------------------------------------------------------------- the client
def test_payload_too_large_is_refused_before_anything_is_written(store: RedisStore) -> None:
    _use(max_payload_bytes=10_000)
    with pytest.raises(PayloadTooLarge, match="max_payload_bytes.*DURABLE_MAX_PAYLOAD_BYTES") as info:
        WorkflowStub.make(Sink, id="big-start", store=store).start("x" * 20_000)
    assert isinstance(info.value, SerializationError) and info.value.limit == "max_payload_bytes"
    assert info.value.value == 10_000 and info.value.actual > 20_000
    with pytest.raises(WorkflowNotFound):
        WorkflowStub.load("big-start", store=store)
    stub = WorkflowStub.make(Sink, id="big-signal", store=store).start()
    before = _history_types(stub)
    with pytest.raises(PayloadTooLarge):
        stub.signal("note", "y" * 20_000)
    assert (
        _history_types(stub) == before
        and store.redis.llen(store.keys.inbox(stub._ref().partition, stub.run_id)) == 0
    )


def test_large_payload_logs_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    _use(warn_payload_bytes=1_000)
    with caplog.at_level(logging.WARNING, logger="durable.limits"):
        payload_codec.dumps("z" * 2_000, path="args")
    assert "warn_payload_bytes" in caplog.text and "args" in caplog.text


def test_a_large_payload_is_said_once_naming_its_run_not_on_each_replay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every replay and query said it again for each large payload in the history, naming no
    run (2 queries gave 6 identical lines in an agent pass)."""
    _use(warn_payload_bytes=1_000)
    sim = Sim(LargeArgument, (2_000,), compare=False)  # one driver: one live decision
    try:
        with caplog.at_level(logging.WARNING, logger="durable.limits"):
            (step,) = sim.decide().activities
            said = [r.getMessage() for r in caplog.records]
            assert len(said) == 1 and "in run run-1 (LargeArgument)" in said[0], said
            caplog.clear()
            sim.complete(step.id, "x" * 10)
            sim.decide()
            caplog.clear()
            sim.check_replay()  # a cache miss replays the history: the args are encoded again
            assert not caplog.records, [r.getMessage() for r in caplog.records]
    finally:
        sim.close()


def test_an_error_too_large_to_store_is_cut_down() -> None:
    _use(max_payload_bytes=10_000, warn_payload_bytes=5_000)
    error = payload_codec.loads(payload_codec.dumps(KeyError("k" * 50_000), path="error"))
    assert isinstance(error, ApplicationError) and error.type_name == "builtins.KeyError"
    assert "max_payload_bytes" in str(error) and len(str(error)) < 3_000


def test_long_names_and_bad_queues_are_refused(store: RedisStore) -> None:
    stub = WorkflowStub.make(Sink, id="names", store=store).start()
    before = _history_types(stub)
    with pytest.raises(LimitExceeded, match="max_name_length.*DURABLE_MAX_NAME_LENGTH") as info:
        stub.signal("s" * 1_000_000)
    assert info.value.limit == "max_name_length" and info.value.actual == 1_000_000
    assert len(str(info.value)) < 400  # the name is not echoed whole
    with pytest.raises(LimitExceeded, match="max_name_length"):
        stub.query("q" * 256)
    assert _history_types(stub) == before
    for bad in ("", "a b", "@private", "x" * 101, "new\nline", "ü"):
        with pytest.raises(ConfigurationError, match="queue name"):
            WorkflowStub.make(Sink, queue=bad, store=store)
    with pytest.raises(ConfigurationError, match="BadQueue.queue"):

        class BadQueue(Workflow):
            queue = "has space"

            def handle(self) -> None:
                return None


def test_signal_spam_is_refused_past_pending_signals(store: RedisStore) -> None:
    # No worker: every signal waits in the inbox, as under a flood faster than deciding.
    _use(max_pending_signals=5)
    stub = WorkflowStub.make(Sink, id="spam", store=store).start()
    for i in range(5):
        stub.signal("note", i)
    inbox = store.keys.inbox(stub._ref().partition, stub.run_id)
    with pytest.raises(
        LimitExceeded, match="max_pending_signals.*6 > 5.*DURABLE_MAX_PENDING_SIGNALS"
    ) as info:
        stub.signal("note", 5)
    assert info.value.limit == "max_pending_signals" and store.redis.llen(inbox) == 5
    stub.cancel("cancel is not a signal: never refused")
    assert store.redis.llen(inbox) == 6


def test_signals_are_refused_at_the_history_limit(store: RedisStore) -> None:
    _use(max_history_events=4)
    stub = WorkflowStub.make(Sink, id="full", store=store).start()  # seq 1
    for i in range(3):
        stub.signal("note", i)
    with pytest.raises(LimitExceeded, match="max_history_events"):
        stub.signal("note", 3)
    assert _history_types(stub) == ["WorkflowStarted"]


def test_signals_and_updates_are_refused_past_the_history_bytes(store: RedisStore) -> None:
    # Every signal and update goes into the history: past max_history_bytes the run could only
    # be terminated for it, and undecided they would pile up as one commit as large as the pile.
    _use(max_history_bytes=10_000)
    stub = WorkflowStub.make(Sink, id="heavy", store=store).start()
    for _ in range(3):
        stub.signal("note", "x" * 3_000)
    with pytest.raises(
        LimitExceeded,
        match=r"refused SignalReceived: bytes of the signals and updates it took.*max_history_bytes",
    ) as info:
        stub.signal("note", "x" * 3_000)
    assert info.value.limit == "max_history_bytes" and info.value.actual > 10_000
    with pytest.raises(LimitExceeded, match=r"refused update 'grow'.*max_history_bytes"):
        stub.update("grow", "x" * 3_000, timeout=1)
    with pytest.raises(LimitExceeded, match=r"signal-with-start.*max_history_bytes"):
        WorkflowStub.make(Sink, id="heavy", store=store, id_conflict_policy="use_existing").signal_with_start(
            "note", "x" * 3_000
        )
    stub.signal("note", "small enough")
    inbox = store.keys.inbox(stub._ref().partition, stub.run_id)
    assert store.redis.llen(inbox) == 4


def test_a_pile_of_inputs_is_decided_a_part_at_a_time(
    durable_store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Inputs piled up while no worker ran: one decision takes a part (history_budget), so no
    # commit is as large as the pile; all are decided, in order.
    monkeypatch.setattr(history_budget, "DECISION_INPUT_BYTES", 10_000)
    stub = WorkflowStub.make(Sink, id="pile", store=durable_store).start()
    for i in range(12):
        stub.signal("note", f"{i:02}" + "x" * 2_000)
    stub.signal("stop", "done")
    consumed: list[int] = []
    commit_many = durable_store.commit_many

    def counting(items: Any) -> Any:
        consumed.extend(plan.consumed for _, plan in items)
        return commit_many(items)

    monkeypatch.setattr(durable_store, "commit_many", counting)
    with TestEnvironment(store=durable_store):
        assert stub.result(timeout=30) == "done"
    assert sum(consumed) == 13 and len(consumed) >= 3 and max(consumed) <= 5, consumed
    notes = [e.data["payload"][0][:2] for e in stub.history() if e.type == "SignalReceived"][:12]
    assert notes == [f"{i:02}" for i in range(12)]


# ---------------------------------------------------------------- the decision
def _terminated(stub: WorkflowStub, limit: str) -> str:
    with pytest.raises(WorkflowFailed) as info:
        stub.result(timeout=30)
    assert info.value.status == "terminated" and limit in str(info.value)
    assert f"DURABLE_{limit.upper()}" in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("eager", [False, True])
def test_fan_out_past_pending_activities_terminates_the_run(durable_store: RedisStore, eager: bool) -> None:
    _use(max_pending_activities=20)
    with TestEnvironment(store=durable_store, eager=eager) as env:
        ok = env.start(FanOut, 20)
        assert ok.result(timeout=30) == sum(range(20))
        stub = env.start(FanOut, 50)
        message = _terminated(stub, "max_pending_activities")
        assert "21 > 20" in message
    types = _history_types(stub)
    assert types.count("ActivityScheduled") == 20 and types[-1] == "WorkflowTerminated"
    assert "ActivityCompleted" not in types  # the scheduled ones were voided, never run
    entries = durable_store.history(stub._ref())
    replay_history(entries)  # replay stops where the limit stopped the code: no nondeterminism
    assert stub.describe().status == "terminated"


def test_fan_out_past_pending_children_terminates_the_run(durable_store: RedisStore) -> None:
    _use(max_pending_children=5)
    with TestEnvironment(store=durable_store) as env:
        stub = env.start(ChildFanOut, 8)
        _terminated(stub, "max_pending_children")
        types = _history_types(stub)
        assert types.count("ChildStarted") == 5 and types[-1] == "WorkflowTerminated"
        replay_history(durable_store.history(stub._ref()))


def test_history_hard_limit_terminates_the_run(
    durable_store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    _use(max_history_events=40)
    with TestEnvironment(store=durable_store) as env:
        stub = env.start(Grower)
        message = _terminated(stub, "max_history_events")
    assert "continue_as_new" in message
    # Closed on the engine's authority: the worker's log says so (it said nothing).
    (said,) = [r for r in caplog.records if "terminated: limit exceeded" in r.getMessage()]
    assert (
        said.levelname == "WARNING"
        and stub.run_id in said.getMessage()
        and "max_history_events" in said.getMessage()
    )
    types = _history_types(stub)
    assert 40 < len(types) <= 43 and types[-1] == "WorkflowTerminated"
    replay_history(durable_store.history(stub._ref()))


def test_a_decision_that_would_close_the_run_past_the_history_limit_terminates_it(
    durable_store: RedisStore,
) -> None:
    """The limit was checked only on decisions that left the run open: one that closed it
    committed any number of events (100,002 side effects in one script, Redis blocked 1.4 s)."""
    _use(max_history_events=40)
    with TestEnvironment(store=durable_store) as env:
        ok = env.start(SideEffectsThenDone, 30)
        assert ok.result(timeout=30) == 30
        stub = env.start(SideEffectsThenDone, 500)
        message = _terminated(stub, "max_history_events")
    assert "(41 > 40)" in message, message
    types = _history_types(stub)
    assert len(types) == 41 and types[-1] == "WorkflowTerminated", types
    replay_history(durable_store.history(stub._ref()))  # stops where the limit stopped the code


def test_a_decision_that_would_close_the_run_past_the_history_bytes_terminates_it(
    durable_store: RedisStore,
) -> None:
    """As for events: a closing decision's bytes were never checked (a run completed with a
    3 MB history under a 1 MB limit), an open one's only after it was written."""
    _use(max_history_bytes=200_000)
    with TestEnvironment(store=durable_store) as env:
        stub = env.start(BigSideEffectsThenDone, 100)  # 1 MB of side effects
        message = _terminated(stub, "max_history_bytes")
    assert "> 200,000)" in message, message
    assert stub.describe()["history"]["bytes"] <= 200_000 + 2_000  # the termination event past it
    replay_history(durable_store.history(stub._ref()))


def test_inputs_that_would_pass_the_history_bytes_are_not_written_and_the_run_ends_there() -> None:
    """A decision applying many large results wrote them all, then terminated the run: 3.6 MB of
    history under a 1 MB limit (12 results of 300 KB). Now it stops at the first that would pass."""
    _use(max_history_bytes=1_000_000)
    sim = Sim(BigResults, (12, 300_000))
    try:
        scheduled = sim.decide().activities
        assert len(scheduled) == 12
        for step in scheduled:
            sim.complete(step.id)
        decision = sim.decide()  # all twelve results in one decision
        assert isinstance(decision.closing, ev.WorkflowTerminated), decision.closing
        assert "max_history_bytes" in decision.closing.reason
        assert sum(len(e.raw) for e in sim.history) <= 1_000_000 + 2_000  # the termination past it
        applied = [e for e in sim.history if e.type == "ActivityCompleted"]
        assert len(applied) == 3 and len(decision.dropped) == 9, (len(applied), len(decision.dropped))
        (_, first), *rest = decision.dropped
        assert (
            first.startswith("run terminated before ActivityCompleted was applied: ")
            and "max_history_bytes" in first
        )
        assert {why for _, why in rest} == {"run closed before ActivityCompleted was applied"}
        sim.check_replay()  # the history replays to the same end
    finally:
        sim.close()


def test_a_signal_past_the_limit_after_signals_whose_code_continues_as_new_is_carried() -> None:
    """The third signal would pass the limit; the code run for the first two continues as new:
    the third was dropped as "run terminated" (the run was not) instead of carried on."""
    _use(max_history_bytes=200_000)
    sim = Sim(TwoSignalsThenAgain, (150_000, []))
    try:
        (step,) = sim.decide().activities
        sim.complete(step.id, "x" * 150_000)
        sim.decide()
        for name in "abc":
            sim.signal("s", name * 19_000)
        decision = sim.decide()  # all three in one decision
        assert isinstance(decision.closing, ev.WorkflowContinuedAsNew), decision.closing
        assert len(decision.carried) == 1 and not decision.dropped, decision.dropped
    finally:
        sim.close()


def test_a_full_run_can_still_be_cancelled(durable_store: RedisStore) -> None:
    """The close a cancel asks for is never refused for the limits (its clean-up runs)."""
    _use(max_history_events=12)
    with TestEnvironment(store=durable_store) as env:
        stub = env.start(FillsThenWaits, 10)  # started, 10 side effects, the signal wait: full
        wait_for(lambda: len(stub.history()) == 12)
        stub.cancel()
        with pytest.raises(WorkflowFailed) as info:
            stub.result(timeout=30)
    assert info.value.status == "cancelled", info.value


def test_a_history_budget_past_the_hard_limit_is_cut_to_it_with_a_warning(
    durable_store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    """should_continue_as_new() turned true at 80 % of the class's budget even past the hard
    limit: the documented loop was terminated by the limit first, without a word."""
    _use(max_history_events=40)

    class LoopsPastTheLimit(Workflow):
        history_budget = {"events": 100}

        def handle(self, runs: int) -> int:
            while not should_continue_as_new():
                activity(limits_echo, 1)
            if runs > 1:
                continue_as_new(runs - 1)
            return runs

    class KeepsTheDefaultBudget(Workflow):  # cut to the limit too, but it declared nothing: not said
        def handle(self) -> None:
            return None

    class DeclaresTheDefault(Workflow):  # declared (the default's value): said
        history_budget = {"events": 10_000}

        def handle(self) -> None:
            return None

    said, default = [r.getMessage() for r in caplog.records if "history_budget" in r.getMessage()]
    assert "LoopsPastTheLimit.history_budget['events'] = 100 is past the hard limit (40" in said
    assert default.startswith("DeclaresTheDefault.history_budget['events'] = 10000 is past")
    with TestEnvironment(store=durable_store) as env:
        stub = env.start(LoopsPastTheLimit, 3)
        assert stub.result(timeout=30) == 1
        assert stub.describe()["history"]["budget"]["events"] == 40
    # It continued as new once should_continue_as_new() was true: not told to (each run was).
    assert not [r.getMessage() for r in caplog.records if "near its history budget" in r.getMessage()]


def test_history_bytes_limit_and_oversized_result(durable_store: RedisStore) -> None:
    _use(max_history_bytes=6_000, max_payload_bytes=4_000, warn_payload_bytes=1_000)
    with TestEnvironment(store=durable_store) as env:
        big = env.start(BigResult, 5_000)
        with pytest.raises(WorkflowFailed, match="max_payload_bytes") as info:
            big.result(timeout=30)
        assert isinstance(info.value.cause, PayloadTooLarge)
        loud = env.start(Loud, 100_000)
        with pytest.raises(WorkflowFailed, match="cut to fit max_payload_bytes"):
            loud.result(timeout=30)
        grower = env.start(Grower)
        _terminated(grower, "max_history_bytes")


def test_a_real_worker_process_obeys_the_environment(durable_store: RedisStore, redis_url: str) -> None:
    env = {"DURABLE_MAX_PENDING_ACTIVITIES": "10"}
    with workers(redis_url, app="apps.limits", env=env):
        stub = WorkflowStub.make(FanOut, id="proc-fan", store=durable_store).start(11)
        wait_for(lambda: stub.status() == "terminated", timeout=30)
        _terminated(stub, "max_pending_activities")
    assert _history_types(stub).count("ActivityScheduled") == 10


def test_a_huge_cancel_or_terminate_reason_is_cut(store: RedisStore) -> None:
    # A 20 MB reason was stored whole: in the history, the runs list, every result() error.
    stub = WorkflowStub.make(Sink, id="loud-reason", store=store).start()
    stub.cancel("c" * 3_000_000)
    stub.terminate("t" * 20_000_000)
    reasons = [e.data["reason"] for e in stub.history() if e.type in ("WorkflowTerminated",)]
    assert reasons == ["t" * 2_000 + "... [reason of 20,000,000 characters cut]"]
    inbox = store.keys.inbox(stub._ref().partition, stub.run_id)
    assert store.redis.llen(inbox) == 0  # the cancel request was dropped with the run: beside the history
    assert all(len(e["e"]) < 3_000 for e in store.log_entries(stub._ref()) if e.get("kind") == "dropped")


def test_describe_counts_every_signal_a_client_may_leave_waiting(store: RedisStore) -> None:
    # describe counted the first 1,000 of 2,000 waiting signals, with nothing saying so.
    stub = WorkflowStub.make(Sink, id="counted", store=store).start()
    for i in range(1_500):
        stub.signal("note", i)
    assert stub.describe()["signals_undecided"] == {"note": 1_500}
