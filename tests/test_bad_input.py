"""Bad input: what a user gets for every wrong call, payload, id, or corrupt entry.

Each test backs one row of ``docs/errors.md``; the messages asserted here are
the ones quoted there. Workflows run on the in-process ``worker`` fixture.
"""

from __future__ import annotations

import json
import math
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import msgpack
import pytest
from click.testing import CliRunner
from waiting import wait_for

from durable import (
    Activity,
    ActivityFailed,
    CancelledError,
    ConfigurationError,
    DurableError,
    LimitExceeded,
    Limits,
    PayloadTooLarge,
    QueryFailed,
    RetryPolicy,
    SerializationError,
    UpdateRejected,
    Workflow,
    WorkflowClosed,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowStub,
    activity,
    all_settled,
    await_signal,
    child,
    query,
    side_effect,
    signal,
    timer,
    update,
)
from durable import all as durable_all
from durable import events as ev
from durable.ids import shown_id
from durable.limits import set_limits
from durable.store.records import HEARTBEAT_S
from durable.store.redis_store import RedisStore
from workers.cli import cli

# --------------------------------------------------------------------------- app


def bi_add(a: int, b: int) -> int:
    return a + b


def bi_unencodable_result() -> object:
    return object()


def bi_size(x: bytes) -> int:
    return len(x)


class BiLambda(Workflow):
    def handle(self) -> Any:
        return activity(lambda: 1)


class BiTimer(Workflow):
    def handle(self, duration: Any) -> str:
        timer(duration)
        return "done"


class BiOddCall(Workflow):
    """Calls one workflow function with a value it cannot take (these raised bare TypeErrors or
    an AssertionError, or started a child no worker can ever serve)."""

    def handle(self, call: str, value: Any) -> str:
        {
            "side_effect": lambda: side_effect(value),
            "all": lambda: durable_all(value),
            "all_settled": lambda: all_settled(value),
            "child": lambda: child(value, 1),
            "timer": lambda: timer(value),
        }[call]()
        return "done"


class BiDigitId(Workflow):
    def handle(self) -> Any:
        return activity(bi_add, 1, 2, id="1st")


class BiDuplicateId(Workflow):
    def handle(self) -> Any:
        activity(bi_add, 1, 2, id="charge")
        return activity(bi_add, 3, 4, id="charge")


class BiBadResult(Workflow):
    def handle(self) -> Any:
        return activity(bi_unencodable_result)


class BiBadActivityArgs(Workflow):
    def handle(self) -> Any:
        return activity(bi_add, 1, {"when": object()})


class BiUnknownActivity(Workflow):
    def handle(self) -> Any:
        return activity("bi_no_such_activity", 1)


class BiBig(Workflow):
    def handle(self, blob: bytes) -> dict:
        return {"size": activity(bi_size, blob), "echo": blob}


class BiWait(Workflow):
    @query
    def state(self) -> str:
        return "waiting"

    @query
    def broken(self, kind: str) -> Any:
        if kind == "circular":
            loop: list[Any] = []
            loop.append(loop)
            return loop
        if kind == "socket":
            return socket.socket()
        raise ValueError(kind)

    def handle(self) -> Any:
        return await_signal("go")


class BiExits(Workflow):
    """Handlers that call sys.exit (a library's argparse, say): each ended every worker that took the run."""

    def handle(self) -> Any:
        return await_signal("never")

    @update
    def bump(self) -> int:
        return 1

    @bump.validator
    def _check(self) -> None:
        raise SystemExit(3)

    @signal
    def quit(self) -> None:
        raise SystemExit(5)

    @query
    def leave(self) -> None:
        raise SystemExit(7)


class BiCollects(Workflow):
    """Takes signals for ever: each one an event in its history."""

    def __init__(self) -> None:
        self.got: list[Any] = []

    @signal
    def item(self, x: int) -> None:
        self.got.append(x)

    def handle(self) -> Any:
        return await_signal("done")


class BiBoom(Workflow):
    def handle(self) -> None:
        raise KeyError("boom")


class BiNeverEnding(Workflow):
    def handle(self) -> None:
        try:
            await_signal("never")
        except CancelledError:
            raise


class BiSlowStep(Activity):
    def handle(self) -> str:
        return "ok"


# ----------------------------------------------------------------------- helpers


def failure(stub: WorkflowStub, timeout: float = 10) -> WorkflowFailed:
    with pytest.raises(WorkflowFailed) as info:
        stub.result(timeout=timeout)
    return info.value


UNSUPPORTED = "unsupported type; the codec handles None, bool, int, float, str, bytes"


# ------------------------------------------------------------- public API types


@pytest.mark.parametrize("target", [int, "x".__class__, object()], ids=["int", "str-class", "instance"])
def test_make_with_a_non_workflow(redis_url: str, target: Any) -> None:
    with pytest.raises(
        ConfigurationError, match=r"^WorkflowStub\.make needs a Workflow subclass or its name, not "
    ):
        WorkflowStub.make(target)


def test_make_with_a_bad_type_name(redis_url: str) -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"^invalid workflow name 'bad name': use 1-200 characters from letters, digits, _ \. : -, "
        r"starting with a letter or _$",
    ):
        WorkflowStub.make("bad name")


def test_a_start_whose_arguments_handle_refuses_is_refused_with_its_signature(redis_url: str) -> None:
    """The client has the class: a wrong count is a clear error now, not a run failed later."""
    store = RedisStore(redis_url)
    for stub, args in [
        (WorkflowStub.make(BiBig, id="unfit-few", store=store), ()),
        (WorkflowStub.make(BiBoom, id="unfit-many", store=store), (1,)),
    ]:
        with pytest.raises(ConfigurationError) as info:
            stub.start(*args)
        with pytest.raises(WorkflowNotFound):
            WorkflowStub.load(stub.id, store=store)  # nothing was started
        assert str(info.value) in (
            "start() of workflow 'unfit-few': BiBig.handle takes (blob: bytes): missing a required argument: 'blob'",
            "start() of workflow 'unfit-many': BiBoom.handle takes (): too many positional arguments",
        )
    with pytest.raises(ConfigurationError, match=r"BiBig\.handle takes \(blob: bytes\)"):
        WorkflowStub.make(BiBig, id="unfit-sws", store=store).signal_with_start("go", start_args=())


def test_a_run_started_by_name_with_arguments_handle_refuses_fails_naming_its_signature(worker) -> None:
    """By type name the client cannot check: the run fails with a TypeError naming the method,
    where it is defined and what it takes (Python's said ``handle() missing 1 required ...``)."""
    exc = failure(WorkflowStub.make("BiBig").start())
    assert isinstance(exc.cause, TypeError)
    line = BiBig.handle.__code__.co_firstlineno
    assert str(exc.cause) == (
        f"BiBig.handle ({__file__}:{line}) takes (blob: bytes): missing a required argument: 'blob'; "
        "the run was started with 0 argument(s)"
    )


def test_activity_with_a_lambda_fails_the_run(worker, redis_url: str) -> None:
    exc = failure(WorkflowStub.make(BiLambda).start())
    assert exc.status == "failed"
    assert isinstance(exc.cause, ConfigurationError)
    assert str(exc.cause) == "an activity must be an Activity class, a named function or a name (str)"


def test_activity_call_outside_a_workflow(redis_url: str) -> None:
    with pytest.raises(
        DurableError, match=r"can only be made inside Workflow\.handle\(\) while a worker runs it"
    ):
        activity(bi_add, 1, 2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"initial_interval": 0}, "RetryPolicy.initial_interval must be > 0 seconds"),
        (
            {"initial_interval": -1},
            "RetryPolicy.initial_interval must be a finite, non-negative duration, got -1",
        ),
        (
            {"initial_interval": math.nan},
            "RetryPolicy.initial_interval must be a finite, non-negative duration, got nan",
        ),
        (
            {"initial_interval": "1"},
            "RetryPolicy.initial_interval must be seconds (int/float) or a timedelta, not str",
        ),
        ({"backoff_coefficient": 0.5}, "RetryPolicy.backoff_coefficient must be >= 1, got 0.5"),
        ({"backoff_coefficient": math.nan}, "RetryPolicy.backoff_coefficient must be >= 1, got nan"),
        ({"backoff_coefficient": "2"}, "RetryPolicy.backoff_coefficient must be a number >= 1"),
        ({"initial_interval": 2, "max_interval": 1}, "RetryPolicy.max_interval must be >= initial_interval"),
        ({"max_attempts": -1}, "RetryPolicy.max_attempts must be an int >= 0 (0 = unlimited)"),
        ({"max_attempts": 1.5}, "RetryPolicy.max_attempts must be an int >= 0 (0 = unlimited)"),
        (
            {"non_retryable_errors": [ValueError]},
            "RetryPolicy.non_retryable_errors must be exception type names (str)",
        ),
        (
            {"max_attempts": 2, "maximum_attempts": 3},
            "RetryPolicy got both max_attempts=2 and maximum_attempts=3 (Temporal's name for it): give one",
        ),
        ({"maximum_attempts": -1}, "RetryPolicy.max_attempts must be an int >= 0 (0 = unlimited)"),
    ],
)
def test_retry_policy_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RetryPolicy(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("duration", "message"),
    [
        (-1, "timer duration must be a finite, non-negative duration, got -1"),
        (math.nan, "timer duration must be a finite, non-negative duration, got nan"),
        (
            timedelta(seconds=-5),
            "timer duration must be a finite, non-negative duration, got datetime.timedelta(days=-1, seconds=86395)",
        ),
        ("5", "timer duration must be seconds (int/float) or a timedelta, not str"),
    ],
    ids=["negative", "nan", "negative-timedelta", "str"],
)
def test_timer_with_a_bad_duration_fails_the_run(worker, redis_url: str, duration: Any, message: str) -> None:
    exc = failure(WorkflowStub.make(BiTimer).start(duration))
    assert isinstance(exc.cause, ConfigurationError)
    assert str(exc.cause) == message


def test_timer_with_infinite_duration_gives_a_clear_error(worker, redis_url: str) -> None:
    exc = failure(WorkflowStub.make(BiTimer).start(math.inf))
    assert isinstance(exc.cause, ConfigurationError), f"{type(exc.cause).__name__}: {exc.cause}"


@pytest.mark.parametrize(
    ("call", "value", "message"),
    [
        ("side_effect", 5, "side_effect needs a function to call, not int"),
        ("all", None, "all() takes a list of callables, e.g. [lambda: activity(A), ...]"),
        ("all_settled", 5, "all_settled() takes a list of callables, e.g. [lambda: activity(A), ...]"),
        (
            "child",
            "",
            "invalid child workflow name '': use 1-200 characters from letters, digits, _ . : -, "
            "starting with a letter or _",
        ),
        (
            "child",
            "1st",
            "invalid child workflow name '1st': use 1-200 characters from letters, digits, _ . : -, "
            "starting with a letter or _",
        ),
        ("timer", None, "timer duration must be seconds (int/float) or a timedelta, not None"),
    ],
    ids=["side_effect-int", "all-None", "all_settled-int", "child-empty", "child-digit", "timer-None"],
)
def test_a_workflow_call_given_what_it_cannot_take_fails_the_run_naming_it(
    worker, redis_url: str, call: str, value: Any, message: str
) -> None:
    exc = failure(WorkflowStub.make(BiOddCall).start(call, value))
    assert isinstance(exc.cause, ConfigurationError), f"{type(exc.cause).__name__}: {exc.cause}"
    assert str(exc.cause) == message


def test_explicit_command_id_starting_with_a_digit(worker, redis_url: str) -> None:
    exc = failure(WorkflowStub.make(BiDigitId).start())
    assert isinstance(exc.cause, ConfigurationError)
    assert str(exc.cause) == (
        "invalid command id '1st': use 1-200 characters from letters, digits, _ . : - /, "
        "not starting with a digit (numeric ids are generated)"
    )


def test_explicit_command_id_used_twice(worker, redis_url: str) -> None:
    stub = WorkflowStub.make(BiDuplicateId).start()
    exc = failure(stub)
    assert isinstance(exc.cause, ConfigurationError)
    assert str(exc.cause) == f"command id 'charge' is used twice in run {stub.run_id}; ids must be unique"


# ----------------------------------------------------------- unserializable data


def test_unserializable_start_args_name_the_path(redis_url: str, store: RedisStore) -> None:
    with pytest.raises(SerializationError) as info:
        WorkflowStub.make(BiWait, id="never-started").start(1, {"when": object()})
    assert info.value.path == "args[1]['when']"
    assert str(info.value).startswith(f"cannot encode <builtins.object> at args[1]['when']: {UNSUPPORTED}")
    with pytest.raises(WorkflowNotFound):  # nothing was written
        WorkflowStub.load("never-started")
    with pytest.raises(SerializationError, match=r"^cannot encode <builtins\.function> at args\[0\]: "):
        WorkflowStub.make(BiWait).start(lambda: 1)


def test_unserializable_signal_args_name_the_path(worker, redis_url: str) -> None:
    stub = WorkflowStub.make(BiWait).start()
    with pytest.raises(SerializationError) as info:
        stub.signal("go", 1, {"when": [1, object()]})
    assert info.value.path == "args[1]['when'][1]"
    assert str(info.value).startswith(f"cannot encode <builtins.object> at args[1]['when'][1]: {UNSUPPORTED}")
    stub.signal("go", "fine")  # the bad signal was not delivered; the run goes on
    assert stub.result(timeout=10) == "fine"


def test_unserializable_activity_result_fails_the_activity_without_retry(worker, redis_url: str) -> None:
    exc = failure(WorkflowStub.make(BiBadResult).start())
    assert isinstance(exc.cause, ActivityFailed)
    assert exc.cause.attempts == 1
    assert str(exc.cause).startswith(
        # the error's type, not the value's (it read "builtins.object: cannot encode ...")
        "activity bi_unencodable_result (1) failed after 1 attempt(s): SerializationError: "
        f"cannot encode <builtins.object> at result: {UNSUPPORTED}"
    )


def test_unserializable_activity_args_in_workflow_code_fail_the_run(worker, redis_url: str) -> None:
    exc = failure(WorkflowStub.make(BiBadActivityArgs).start())
    assert isinstance(exc.cause, SerializationError)
    assert exc.cause.path == "args[1]['when']"
    assert str(exc.cause).startswith(f"cannot encode <builtins.object> at args[1]['when']: {UNSUPPORTED}")


# ---------------------------------------------------------------- unknown types


def test_unknown_workflow_type_is_parked_and_listed_dead(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make("BiNoSuchWorkflow").start(1)
    reason = (
        "no live worker on queue 'default' serves workflow type 'BiNoSuchWorkflow' (for 0 s): start a worker "
        f"whose --app defines it, then `durable repair {stub.id}`"
    )
    letters = wait_for(store.dead_letters)
    assert [(d["kind"], d["run"], d["reason"]) for d in letters] == [("workflow", stub.run_id, reason)]
    assert stub.snapshot()["blocked"] == reason
    assert stub.status() == "pending"
    out = CliRunner().invoke(cli, ["list", "--dead"], catch_exceptions=False).output
    assert "dead letters (1)" in out and "BiNoSuchWorkflow" in out
    assert letters[0]["run_status"] == "pending"
    # Terminated since, the letter says there is nothing to repair (it advised `durable repair`).
    stub.terminate("not ours")
    (letter,) = store.dead_letters()
    assert letter["run_status"] == "terminated"
    table = CliRunner().invoke(cli, ["list", "--dead"], catch_exceptions=False).output
    words = " ".join(table.replace("│", " ").split())  # the reason column folds over lines
    assert "(run terminated since: nothing to repair)" in words, table


def test_unknown_activity_is_parked_and_listed_dead(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(BiUnknownActivity).start()
    letters = wait_for(store.dead_letters)
    assert [(d["kind"], d["run"], d["reason"]) for d in letters] == [
        (
            "activity",
            stub.run_id,
            "no live worker on queue 'default' serves activity type 'bi_no_such_activity' (for 0 s): start a "
            f"worker whose --app defines it, then `durable repair {stub.id}`",
        )
    ]
    out = CliRunner().invoke(cli, ["list", "--dead"], catch_exceptions=False).output
    assert "dead letters (1)" in out and "bi_no_such_activity" in out


def test_run_with_a_parked_activity_shows_blocked(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(BiUnknownActivity).start()
    wait_for(store.dead_letters)
    assert stub.snapshot()["blocked"], f"status {stub.status()!r}, blocked {stub.snapshot()['blocked']!r}"
    # Its step said "not begun: queued on 'default', waiting for a worker" (a tester, in the UI).
    [step] = stub.describe().pending
    assert (
        step["state"] == "not begun: its task is parked (unknown_type, the run's blocked reason says why)"
    ), step


# ---------------------------------------------------------------- huge payloads

HUGE = 20 * 1024 * 1024


def test_20_mb_argument_round_trips(worker, redis_url: str) -> None:
    """A 20 MiB bytes argument is refused by default (max_payload_bytes); with the limits
    raised it works: history, activity task, activity args and result all carry it."""
    blob = bytes(range(256)) * (HUGE // 256)
    with pytest.raises(PayloadTooLarge, match="max_payload_bytes"):
        WorkflowStub.make(BiBig).start(blob)
    set_limits(Limits(max_payload_bytes=2 * HUGE, max_history_bytes=10 * HUGE))
    try:
        result = WorkflowStub.make(BiBig).start(blob).result(timeout=60)
    finally:
        set_limits(None)
    assert result["size"] == HUGE and result["echo"] == blob


# -------------------------------------------------------------------------- ids


@pytest.mark.parametrize("bad", [" lead", "in side", "tab\t", "new\nline", "", "x" * 257, 42, None], ids=repr)
def test_bad_workflow_ids(redis_url: str, bad: Any) -> None:
    if bad is None:  # id=None means "generate one"
        assert WorkflowStub.make(BiWait, id=bad).id.startswith("BiWait-")
        return
    with pytest.raises(ConfigurationError) as info:
        WorkflowStub.make(BiWait, id=bad)
    assert (
        str(info.value)
        == f"invalid workflow id {shown_id(bad)}: use 1-256 printable characters without whitespace"
    )
    if bad == "x" * 257:  # a lookup takes up to 1024 (a child's default id, before child() checked it)
        with pytest.raises(WorkflowNotFound):
            WorkflowStub.load(bad)
        bad = "x" * 1025
    with pytest.raises(ConfigurationError):
        WorkflowStub.load(bad)


@pytest.mark.parametrize("hidden", ["a\u200bb", "\u202eevil", "inv\u2066oice\u2069", "x\ufeff"])
def test_an_id_with_an_invisible_character_is_refused_at_start(redis_url: str, hidden: str) -> None:
    # "a\u200bb" showed as "ab" in every table, "\u202e" reversed the rest of the row: an
    # operator could signal or terminate the wrong run.
    with pytest.raises(
        ConfigurationError, match=r"invisible character U\+[0-9A-F]{4} \(.+\).*visible characters only"
    ):
        WorkflowStub.make(BiWait, id=hidden)
    with pytest.raises(WorkflowNotFound):  # a run that has one (started before) stays addressable
        WorkflowStub.load(hidden)


def test_longest_workflow_id_is_accepted(worker, redis_url: str) -> None:
    stub = WorkflowStub.make(BiWait, id="x" * 256).start()
    stub.signal("go", 1)
    assert stub.result(timeout=10) == 1


# ------------------------------------------------------------ closed / unknown


def test_signal_cancel_terminate_a_closed_run(worker, redis_url: str) -> None:
    stub = WorkflowStub.make(BiWait, id="closed-one").start()
    stub.signal("go", 1)
    assert stub.result(timeout=10) == 1
    rid = stub.run_id
    with pytest.raises(WorkflowClosed) as info:
        stub.signal("go", 2)
    assert str(info.value) == (
        f"workflow 'closed-one' (run {rid}) is completed; it takes no more signals — start a new run to continue"
    )
    with pytest.raises(WorkflowClosed, match=r"it takes no more cancel requests"):
        stub.cancel()
    with pytest.raises(WorkflowClosed) as info:
        stub.terminate()
    assert str(info.value) == f"workflow 'closed-one' (run {rid}) is already completed"


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.signal("go"),
        lambda s: s.query("state"),
        lambda s: s.cancel(),
        lambda s: s.terminate(),
        lambda s: s.status(),
        lambda s: s.result(timeout=1),
        lambda s: WorkflowStub.load(s.id),
    ],
    ids=["signal", "query", "cancel", "terminate", "status", "result", "load"],
)
def test_calls_on_an_unknown_id(redis_url: str, call: Callable[[WorkflowStub], Any]) -> None:
    with pytest.raises(WorkflowNotFound) as info:
        call(WorkflowStub.make(BiWait, id="ghost"))
    assert str(info.value).startswith(
        "no workflow with id 'ghost' (never started, or closed and purged since:"
    )


def test_a_query_that_raises_or_returns_what_cannot_be_encoded_fails_naming_it(
    worker, redis_url: str
) -> None:
    """The handler's exception went up as itself, through durable's frames (a traceback in the
    CLI, a 500 from the server); a circular value overflowed the CLI's JSON."""
    stub = WorkflowStub.make(BiWait).start()
    wait_for(lambda: stub.status() == "suspended")
    with pytest.raises(QueryFailed) as raised:
        stub.query("broken", "oops")
    assert str(raised.value) == "@query 'broken' of workflow 'BiWait' raised ValueError: oops"
    assert raised.value.name == "broken" and isinstance(raised.value.cause, ValueError)
    for kind in ("circular", "socket"):
        with pytest.raises(QueryFailed) as raised:
            stub.query("broken", kind)
        assert isinstance(raised.value.cause, SerializationError)
        assert "the result of @query 'broken'" in str(raised.value), str(raised.value)
    for args, says in ((['"oops"'], "raised ValueError: oops"), (['"circular"'], "cannot encode")):
        said = CliRunner().invoke(cli, ["query", stub.id, "broken", *args, "--app", __name__])
        assert said.exit_code == 1 and "Traceback" not in said.output, said.output
        (line,) = said.stderr.splitlines()
        assert line.startswith("error: ") and says in line, line
    stub.signal("go", 1)  # the run is unaffected
    assert stub.result(timeout=10) == 1


def test_unknown_query_name(worker, redis_url: str) -> None:
    stub = WorkflowStub.make(BiWait).start()
    wait_for(lambda: stub.status() == "suspended")
    with pytest.raises(DurableError) as info:
        stub.query("nope")
    assert str(info.value) == "workflow 'BiWait' has no @query 'nope'; it has ['broken', 'state']"
    assert stub.query("state") == "waiting"


def test_empty_signal_name(worker, redis_url: str) -> None:
    stub = WorkflowStub.make(BiWait).start()
    with pytest.raises(ConfigurationError, match=r"^signal name must be a non-empty string$"):
        stub.signal("")


# --------------------------------------------------------------- corrupt entries


def test_garbage_in_history_blocks_the_run(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(BiWait).start()
    wait_for(lambda: stub.status() == "suspended")
    ref = store.ref(stub.id)
    seq = store.run_record(ref)["seq"] + 1
    store.redis.xadd(store.keys.history(ref.partition, ref.run_id), {"e": b"\xc1garbage"}, id=f"0-{seq}")
    store.redis.hset(store.keys.run(ref.partition, ref.run_id), "seq", seq)
    worker.decider.cache.clear()
    stub.signal("go", 1)
    blocked = wait_for(lambda: stub.snapshot()["blocked"])
    assert blocked.startswith(f"HistoryCorrupt: run {ref.run_id} seq {seq}: ")
    letters = store.dead_letters()
    assert [(d["kind"], d["reason"]) for d in letters] == [("workflow", blocked)]
    assert stub.status() == "suspended"


def test_a_recorded_payload_that_is_not_msgpack_blocks_the_run_as_corrupt_history(
    worker, store: RedisStore
) -> None:
    """It blocked the run as a parked input, "cannot decode payload: FormatError: " (no more), and
    `repair --drop-input` had no input to drop: the bytes are in the history."""
    stub = WorkflowStub.make(BiWait).start()
    wait_for(lambda: stub.status() == "suspended")
    ref = store.ref(stub.id)
    seq = store.run_record(ref)["seq"] + 1
    raw = ev.encode(ev.SignalReceived(name="go", payload=b"\xc1\xc1"), 1)
    store.redis.xadd(store.keys.history(ref.partition, ref.run_id), {"e": raw}, id=f"0-{seq}")
    store.redis.hset(store.keys.run(ref.partition, ref.run_id), "seq", seq)
    worker.decider.cache.clear()
    stub.signal("go", 1)
    blocked = wait_for(lambda: stub.blocked())
    assert blocked.kind == "history_corrupt", blocked
    assert blocked.message == (
        f"HistoryCorrupt: run {ref.run_id} seq {seq}: a recorded payload does not decode: cannot decode "
        "payload: FormatError: the bytes are not valid msgpack"
    ), blocked.message


def test_foreign_entry_in_history_blocks_the_run(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(BiWait).start()
    wait_for(lambda: stub.status() == "suspended")
    ref = store.ref(stub.id)
    seq = store.run_record(ref)["seq"] + 1
    store.redis.xadd(store.keys.history(ref.partition, ref.run_id), {"x": b"1"}, id=f"0-{seq}")
    store.redis.hset(store.keys.run(ref.partition, ref.run_id), "seq", seq)
    worker.decider.cache.clear()
    stub.signal("go", 1)
    blocked = wait_for(lambda: stub.snapshot()["blocked"])
    assert (
        blocked
        == f"HistoryCorrupt: run {ref.run_id} seq {seq}: history entry has no 'e' field (foreign entry?)"
    )


def test_garbage_in_inbox_is_parked_and_the_run_goes_on(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(BiWait).start()
    wait_for(lambda: stub.status() == "suspended")
    ref = store.ref(stub.id)
    store.redis.rpush(store.keys.inbox(ref.partition, ref.run_id), b"\x93garbage")
    stub.signal("go", "ok")
    assert stub.result(timeout=10) == "ok"
    letters = store.dead_letters()
    assert [(d["kind"], d["run"], d["workflow_id"]) for d in letters] == [("inbox", ref.run_id, stub.id)]
    assert isinstance(letters[0]["ts"], int)  # readable, not bytes
    assert letters[0]["reason"].startswith("poison: ") and "not valid msgpack" in letters[0]["reason"]


@pytest.mark.parametrize(
    ("kind", "fields", "reason"),
    [
        ("aq", {"body": b"\xc1 not msgpack"}, "undecodable activity task: "),
        ("aq", {"run": b"r", "act": b"1"}, "undecodable activity task: "),
        ("wq", {"nothing": b"here"}, "task has no run id"),
        ("wq", {"run": b"\xff\xfe"}, "task's run id is not UTF-8 text"),  # a worker died on it, over and over
        ("wq", {"run": b"01NOSUCHRUN"}, "run 01NOSUCHRUN does not exist"),
        # A 100 KB run id was logged and stored in full (200 KB log lines): cut, with its length.
        ("wq", {"run": b"A" * 100_000}, "run " + "A" * 60 + "... (100,000 characters) does not exist"),
        ("ox", {"m": b"\xc1"}, "undecodable: "),
        ("ox", {"m": b"\x81\xa4kind\xa3odd"}, "unknown message kind 'odd'"),
        # A message that fails however often it is tried stopped every worker reading it.
        (
            "ox",
            {"m": msgpack.packb({"kind": "terminate", "wid": "q" * 1100})},
            "terminate of workflow 'qqqq",
        ),
        (
            "ox",
            {"m": msgpack.packb({"kind": "start", "wid": "w"})},
            "start of workflow 'w' failed: KeyError: 'parent'",
        ),
    ],
    ids=[
        "aq-garbage-body",
        "aq-no-body",
        "wq-no-run",
        "wq-run-not-text",
        "wq-unknown-run",
        "wq-huge-run-id",
        "ox-garbage",
        "ox-unknown-kind",
        "ox-id-no-lookup-takes",
        "ox-start-without-its-fields",
    ],
)
def test_garbage_in_task_streams_is_parked(
    worker, store: RedisStore, kind: str, fields: dict, reason: str
) -> None:
    k = store.keys
    stream = {"aq": k.activity_tasks(3, "default"), "wq": k.workflow_tasks(3, "default"), "ox": k.outbox(3)}[
        kind
    ]
    store.redis.xadd(stream, fields)
    letters = wait_for(store.dead_letters)
    assert len(letters) == 1 and letters[0]["stream"] == stream
    assert letters[0]["reason"].startswith(reason), letters[0]["reason"]
    # The worker keeps serving.
    stub = WorkflowStub.make(BiWait).start()
    stub.signal("go", 7)
    assert stub.result(timeout=10) == 7


def test_garbage_in_the_deadline_and_timer_sets_is_dropped_and_the_scheduler_goes_on(
    worker, store: RedisStore
) -> None:
    """A member of a partition's running-attempts set that names no attempt failed every scheduler
    pass (a traceback a second, no timeouts, no heartbeat: the live worker looked gone); one of its
    timers set without a '|' failed the timers script."""
    k = store.keys
    store.redis.zadd(k.running(0), {b"garbage": 0, b"a|b|notint": 0, b"\xff|\xfe|1": 0})
    store.redis.zadd(k.timers(0), {b"garbage": 0, b"u|run|no-first": 0})
    wait_for(lambda: store.redis.zcard(k.running(0)) == 0 and store.redis.zcard(k.timers(0)) == 0)
    stub = WorkflowStub.make(BiWait).start()
    stub.signal("go", 7)
    assert stub.result(timeout=10) == 7
    assert [w.name for w in store.live_workers()] == [worker.consumer]


def test_odd_values_in_run_records_build_keys_and_registry_entries_are_shown_not_fatal(
    store: RedisStore,
) -> None:
    """Bytes durable did not write made the views fail: a snapshot that does not decode failed
    `durable list` (every page with that run) and `describe`/`terminate` of it; a status or a
    current build that is not UTF-8, and a registry entry of the wrong JSON types, printed
    tracebacks from `durable status`, `durable start` and `durable workers`."""
    k = store.keys
    odd = WorkflowStub.make(BiWait, id="odd-snapshot", queue="odd-q").start()
    other = WorkflowStub.make(BiWait, id="odd-status", queue="odd-q").start()
    ref, other_ref = store.ref(odd.id), store.ref(other.id)
    store.redis.hset(k.run(ref.partition, ref.run_id), "snapshot", b"\xc9\xff\xff\xff\xff\x05")
    store.redis.hset(k.run(other_ref.partition, other_ref.run_id), "status", b"\xff\xfe")
    store.redis.set(k.current_build("odd-q"), b"\xff")
    store.redis.set(k.worker("odd-worker"), '{"name": 5, "queues": "notalist"}')
    store.redis.sadd(k.worker_index(), "odd-worker")
    runner = CliRunner()
    for args in (
        ["list"],
        ["describe", odd.id],
        ["status", other.id],
        ["workers"],
        ["start", "BiWait", "--queue", "odd-q"],
    ):
        said = runner.invoke(cli, args)
        assert said.exception is None or isinstance(said.exception, SystemExit), (args, said.output)
        assert "Traceback" not in said.output, (args, said.output)
    listed = runner.invoke(cli, ["list", "--json"])
    assert listed.exit_code == 0 and {odd.id, other.id} <= {
        r["workflow_id"] for r in json.loads(listed.stdout)
    }
    described = json.loads(runner.invoke(cli, ["describe", odd.id, "--json"]).stdout)
    assert described["unreadable"].startswith("the run record's snapshot does not decode"), described
    assert "\\xff\\xfe" in runner.invoke(cli, ["status", other.id]).stdout  # shown as it is
    assert store.live_workers() == []  # not an entry a worker wrote
    odd.terminate("odd")
    assert odd.status() == "terminated"


def test_garbage_in_the_served_builds_set_is_dropped(store: RedisStore) -> None:
    """A member that is not a [queue, build] pair failed every retired-builds pass ("dead workers'
    consumers not deleted yet: Expecting value", every 30 s, naming no key)."""
    builds = store.keys.served_builds()
    store.redis.sadd(builds, "not json", '["q"]', '["default", "v1"]')
    report = store.drop_retired_builds([])
    assert report.dropped == ["default@v1"]  # its streams are empty: retired
    assert store.redis.smembers(builds) == set()


def test_a_failing_scheduler_pass_still_renews_the_worker_s_registry_entry(
    worker, store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(parts: Any) -> Any:
        raise ValueError("odd data")

    (me,) = store.live_workers()
    monkeypatch.setattr(worker.scheduler.store, "fire_timers", broken)  # fails every pass from now
    seen = me.seen
    renewed = wait_for(
        lambda: [w for w in store.live_workers() if w.seen > seen], timeout=3 * HEARTBEAT_S + 2
    )
    assert [w.name for w in renewed] == [me.name]


# -------------------------------------------------------- result of a closed run


def test_result_of_a_failed_run(worker, redis_url: str) -> None:
    stub = WorkflowStub.make(BiBoom, id="boom").start()
    exc = failure(stub)
    assert exc.status == "failed" and isinstance(exc.cause, KeyError)
    assert str(exc) == "workflow 'boom' failed: KeyError: 'boom'"


def test_result_of_a_cancelled_run(worker, redis_url: str) -> None:
    stub = WorkflowStub.make(BiNeverEnding, id="to-cancel").start()
    wait_for(lambda: stub.status() == "suspended")
    stub.cancel("changed my mind")
    exc = failure(stub)
    assert exc.status == "cancelled" and exc.cause is None
    assert str(exc) == "workflow 'to-cancel' was cancelled: changed my mind"


def test_result_of_a_terminated_run(worker, redis_url: str) -> None:
    stub = WorkflowStub.make(BiNeverEnding, id="to-terminate").start()
    wait_for(lambda: stub.status() == "suspended")
    stub.terminate("ops said so")
    exc = failure(stub)
    assert exc.status == "terminated" and exc.cause is None
    assert str(exc) == "workflow 'to-terminate' was terminated: ops said so"


def test_a_history_gone_from_redis_blocks_its_run_instead_of_a_new_history(worker, store: RedisStore) -> None:
    """An evicted (allkeys-lru) or deleted history stream: the worker decided from its cached
    driver and committed on top of nothing, so the run completed with a history that began at
    seq 3 -- silently, and no replay could read it."""
    stub = WorkflowStub.make(BiWait, id="history-gone").start()
    wait_for(lambda: stub.status() == "suspended")
    ref = store.ref(stub.id)
    history = store.keys.history(ref.partition, ref.run_id)
    store.redis.unlink(history)
    stub.signal("go", "x")
    blocked = wait_for(stub.blocked)
    assert blocked.kind == "history_corrupt", blocked
    assert f"run {ref.run_id}: its history is gone from Redis (the run record counts " in blocked.message
    assert store.redis.exists(history) == 0  # nothing written on top of the loss
    assert stub.status() == "suspended"
    # Terminated, it is not blocked any more: the runs list said "blocked ... repair" still.
    stub.terminate("history lost")
    (row,) = json.loads(CliRunner().invoke(cli, ["list", "--json"], catch_exceptions=False).output)
    assert row["status"] == "terminated" and "blocked" not in row and "blocked_kind" not in row, row


def test_handlers_calling_sys_exit_reject_fail_or_refuse_and_the_worker_goes_on(worker) -> None:
    stub = WorkflowStub.make(BiExits).start()
    wait_for(lambda: stub.status() == "suspended")
    with pytest.raises(UpdateRejected, match="SystemExit"):
        stub.update("bump", timeout=10)
    with pytest.raises(QueryFailed, match="raised SystemExit: 7"):
        stub.query("leave")
    stub.signal("quit")
    assert str(failure(stub)).endswith("failed: SystemExit: 5")  # failed as handle() raising it does
    other = WorkflowStub.make(BiWait).start()  # the worker still decides
    other.signal("go", 1)
    assert other.result(timeout=10) == 1


def test_a_run_whose_history_is_full_of_inputs_is_blocked_saying_why(worker) -> None:
    """Every further signal is refused (LimitExceeded) and no decision passes the limit, so the
    run never moved again, while the views showed an ordinary wait."""
    set_limits(Limits(max_history_events=12))
    try:
        stub = WorkflowStub.make(BiCollects).start()
        wait_for(lambda: stub.status() == "suspended")
        with pytest.raises(LimitExceeded, match="max_history_events"):
            for i in range(20):
                stub.signal("item", i)
        blocked = wait_for(stub.blocked)
        assert blocked.kind == "history_full", blocked
        assert "the limit (max_history_events 12): every signal, update and hook payload" in blocked.message
        status = CliRunner().invoke(cli, ["status", stub.id], catch_exceptions=False).output
        assert "blocked: its history holds" in status, status
        # The operator's list of blocked runs holds it too (it was empty), and the runs list says it.
        for argv in (["list", "--status", "blocked", "--json"], ["list", "--json"]):
            rows = json.loads(CliRunner().invoke(cli, argv, catch_exceptions=False).output)
            (row,) = [r for r in rows if r["workflow_id"] == stub.id]
            assert row["blocked_kind"] == "history_full", (argv, row)
        # A cancel is no input it refuses: it closes the run (it was said to wait for it to move).
        said = CliRunner().invoke(cli, ["cancel", stub.id], catch_exceptions=False).output
        assert "takes effect only" not in said, said
        wait_for(lambda: stub.status() == "cancelled")
    finally:
        set_limits(None)


def test_result_timeout_of_an_open_run(worker, redis_url: str) -> None:
    stub = WorkflowStub.make(BiWait, id="slowpoke").start()
    wait_for(lambda: stub.status() == "suspended")
    with pytest.raises(TimeoutError) as info:
        stub.result(timeout=0.3)
    assert str(info.value) == (
        "workflow 'slowpoke' did not close within 0.3 s: it is suspended, waiting for signal 'go' "
        "(`durable describe slowpoke` says more)"
    )


# ------------------------------------------------------------- async def workflow code


class BiLateAsync(Workflow):
    def handle(self) -> int:
        return 1


async def _late_async_handle(self: BiLateAsync) -> int:
    return 2


BiLateAsync.handle = _late_async_handle  # type: ignore[assignment,method-assign]  # after the class check


def test_async_handle_set_after_the_class_statement_fails_its_run_saying_why(worker) -> None:
    """The class check cannot see it: the run failed with "cannot encode <builtins.coroutine>"."""
    exc = failure(WorkflowStub.make(BiLateAsync).start())
    assert isinstance(exc.cause, TypeError)
    assert "BiLateAsync.handle returned a coroutine: workflow code is plain synchronous" in str(exc.cause)


def test_async_def_and_generator_workflow_code_is_refused_at_class_definition() -> None:
    """Temporal's habit: an ``async def`` @signal handler returned a coroutine nobody awaited,
    so every signal was recorded and dropped, silently; an ``async def handle`` failed its run
    with "cannot encode <builtins.coroutine>"."""
    with pytest.raises(
        ConfigurationError, match=r"BiAsyncHandle.handle is async def: workflow code is plain"
    ):

        class BiAsyncHandle(Workflow):
            async def handle(self) -> int:
                return 1

    with pytest.raises(
        ConfigurationError, match=r"BiAsyncSignal.add is async def: .*write it as a plain def"
    ):

        class BiAsyncSignal(Workflow):
            def handle(self) -> int:
                return 1

            @signal
            async def add(self, n: int) -> None:
                pass

    with pytest.raises(ConfigurationError, match=r"BiYields.handle is a generator \(it yields\)"):

        class BiYields(Workflow):
            def handle(self) -> Any:
                yield activity(bi_add, 1, 2)

    with pytest.raises(ConfigurationError, match=r"BiAsyncValidator.check is async def"):

        class BiAsyncValidator(Workflow):
            def handle(self) -> int:
                return 1

            @update
            def bump(self, n: int) -> int:
                return n

            @bump.validator
            async def check(self, n: int) -> None:
                pass
