"""Schedules: interval and cron times, overlap policies, pause, trigger, backfill, catch-up, bad input.

Real Redis; runs are fired by an in-process worker's scheduler (``durable_env``) or by
:class:`SchedulePass` called directly (several at once for exactly-once).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner

from durable import (
    ConfigurationError,
    Schedule,
    ScheduleExists,
    ScheduleHandle,
    ScheduleNotFound,
    Workflow,
    WorkflowStub,
    schedule_health,
    schedule_pass,
    timer,
)
from durable.schedule_pass import SchedulePass
from durable.schedule_spec import LAST_MS, MAX_INTERVAL_S, ScheduleOverlap, iso, scheduled_workflow_id
from durable.schedules import skip_reason
from durable.store.redis_store import RedisStore
from durable.store.schedules import claim_member
from durable.testing import TestEnvironment
from tests.clikit import cli_ok
from tests.waiting import wait_for
from workers.cli import cli


class SchedTick(Workflow):
    """Finishes at once with its argument."""

    def handle(self, tag: str = "") -> str:
        return tag


class SchedFails(Workflow):
    """Fails at once."""

    def handle(self) -> str:
        raise ValueError("bad config")


class SchedSleep(Workflow):
    """Stays open for ``seconds``."""

    def handle(self, seconds: float = 3.0) -> str:
        timer(seconds)
        return "slept"


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def _started(handle: ScheduleHandle) -> list[dict]:
    return [a for a in handle.describe().recent_actions if a["action"] == "started"]


# --------------------------------------------------------------------------- times (unit)


def test_interval_times_align_to_the_epoch_or_start_at() -> None:
    spec = Schedule(workflow="X", every="5m")
    base = _ms("2024-05-01T12:03:10Z")
    assert spec.upcoming(base, 3) == [
        _ms("2024-05-01T12:05:00Z"),
        _ms("2024-05-01T12:10:00Z"),
        _ms("2024-05-01T12:15:00Z"),
    ]
    anchored = Schedule(workflow="X", every=90, start_at="2024-05-01T12:00:30Z")
    assert anchored.upcoming(_ms("2024-05-01T11:00:00Z"), 2) == [
        _ms("2024-05-01T12:00:30Z"),
        _ms("2024-05-01T12:02:00Z"),
    ]


def test_cron_in_a_time_zone_across_dst() -> None:
    spec = Schedule(workflow="X", cron="30 2 * * *", timezone="Europe/Berlin")
    berlin = ZoneInfo("Europe/Berlin")
    # Spring forward (2024-03-31): 02:30 does not exist; it fires once, at the jump (03:00 CEST).
    times = [
        datetime.fromtimestamp(ms / 1000, berlin) for ms in spec.upcoming(_ms("2024-03-30T00:00:00Z"), 3)
    ]
    assert [t.isoformat() for t in times] == [
        "2024-03-30T02:30:00+01:00",
        "2024-03-31T03:00:00+02:00",
        "2024-04-01T02:30:00+02:00",
    ]
    # Fall back (2024-10-27): 02:30 happens twice; it fires once.
    times = [
        datetime.fromtimestamp(ms / 1000, berlin) for ms in spec.upcoming(_ms("2024-10-26T00:00:00Z"), 3)
    ]
    assert [t.isoformat() for t in times] == [
        "2024-10-26T02:30:00+02:00",
        "2024-10-27T02:30:00+02:00",
        "2024-10-28T02:30:00+01:00",
    ]
    # 09:00 local stays 09:00 local across the change: 07:00 UTC in summer, 08:00 UTC in winter.
    nine = Schedule(workflow="X", cron="0 9 * * *", timezone="Europe/Berlin")
    got = nine.upcoming(_ms("2024-10-26T12:00:00Z"), 2)
    assert got == [_ms("2024-10-27T08:00:00Z"), _ms("2024-10-28T08:00:00Z")]


def test_start_end_and_max_runs_bound_the_times() -> None:
    spec = Schedule(workflow="X", every="1h", start_at="2024-05-01T00:00:00Z", end_at="2024-05-01T02:00:00Z")
    assert spec.upcoming(0, 10) == [
        _ms("2024-05-01T00:00:00Z"),
        _ms("2024-05-01T01:00:00Z"),
        _ms("2024-05-01T02:00:00Z"),
    ]


def test_workflow_id_is_deterministic() -> None:
    assert scheduled_workflow_id("nightly", _ms("2024-05-01T02:00:00Z")) == "nightly-2024-05-01T02:00:00Z"
    assert scheduled_workflow_id("t", _ms("2024-05-01T02:00:00.250Z")) == "t-2024-05-01T02:00:00.250Z"


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression '61 * * * *': field 1 (minute) '61' at column 1"),
        ({"cron": "0 0 32 * *"}, "field 3 (day of month) '32' at column 5"),
        ({"cron": "* * * *"}, "4 field(s), a cron expression has 5"),
        ({"cron": "* * * * *", "every": "1m"}, "exactly one of cron"),
        ({}, "exactly one of cron"),
        ({"every": "soon"}, "every: not a duration: 'soon'"),
        (
            {"every": "1m", "overlap": "queue"},
            "unknown overlap policy 'queue': use one of skip, buffer_one, buffer_all, allow_all, cancel_other, terminate_other",
        ),
        ({"every": "1m", "timezone": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ({"every": "1m", "max_runs": 0}, "max_runs must be an int >= 1"),
        ({"every": "1m", "paused": "no"}, "paused must be True or False, got 'no'"),
        (
            {"every": "1m", "start_at": "2024-05-02", "end_at": "2024-05-01"},
            "end_at (2024-05-01T00:00:00Z) is before start_at",
        ),
        ({"every": "1m", "start_at": "tomorrow"}, "start_at 'tomorrow': not a date-time"),
        ({"every": "1m", "note": "n" * 1001}, "a schedule note holds at most 1000 characters, not 1,001"),
        # Times a datetime does not hold: written, they crashed every listing of schedules.
        ({"every": "100000000d"}, "the longest interval is 100 years"),
        ({"every": "1h", "timezone": "Europe/Berlin"}, "timezone 'Europe/Berlin' applies to cron only"),
        ({"every": "1h", "jitter": "2h"}, "jitter 7200s is not shorter than the interval (3600s)"),
        (
            {"cron": "0 9 * * 1-5", "jitter": "2d"},
            "jitter 172800s is not shorter than the shortest interval between the cron's times (86400s)",
        ),
        (
            {"every": "1m", "start_at": 1e15},
            "start_at 1000000000000000.0 is outside the times a schedule can name",
        ),
        (
            {"every": "1m", "end_at": -1e12},
            "end_at -1000000000000.0 is outside the times a schedule can name",
        ),
    ],
)
def test_bad_specs_raise_and_write_nothing(store: RedisStore, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        ScheduleHandle.create("bad", Schedule(workflow="SchedTick", **kwargs), store=store)
    assert message in str(info.value)
    assert store.schedule_ids() == []
    assert store.redis.dbsize() == 1  # only the deployment's meta record


def test_args_the_workflow_refuses_are_refused_when_the_schedule_is_written(store: RedisStore) -> None:
    """As start() does: every run of such a schedule failed at its first decision, forever."""
    with pytest.raises(ConfigurationError, match=r"schedule fs: SchedFails.handle takes \(\): too many"):
        ScheduleHandle.create("fs", Schedule(workflow=SchedFails, every="1h", args=["x"]), store=store)
    assert store.schedule_ids() == []
    handle = ScheduleHandle.create("fs", Schedule(workflow="SchedTick", every="1h", args=["a"]), store=store)
    with pytest.raises(ConfigurationError, match=r"schedule fs: SchedTick.handle takes \(tag: str = ''\)"):
        handle.update(args=["a", "b"])
    assert handle.spec.args == ("a",)
    out = CliRunner().invoke(
        cli,
        [
            "--redis",
            store.url,
            "schedule",
            "create",
            "fs2",
            "--workflow",
            "SchedFails",
            "--every",
            "1h",
            "--args",
            '"x"',
            "--app",
            __name__,
        ],
    )
    assert out.exit_code == 1 and "SchedFails.handle takes (): too many positional arguments" in out.output
    assert store.schedule_ids() == ["fs"]


def test_bad_id_and_duplicates(store: RedisStore) -> None:
    with pytest.raises(ConfigurationError, match="invalid schedule id 'a b'"):
        ScheduleHandle.create("a b", Schedule(workflow="SchedTick", every="1m"), store=store)
    ScheduleHandle.create("dup", Schedule(workflow="SchedTick", every="1m"), store=store)
    with pytest.raises(ScheduleExists, match="schedule 'dup' already exists"):
        ScheduleHandle.create("dup", Schedule(workflow="SchedTick", every="1h"), store=store)
    with pytest.raises(ScheduleNotFound, match="no schedule with id 'nope'"):
        ScheduleHandle("nope", store=store).describe()
    with pytest.raises(ConfigurationError, match="unknown overlap policy"):
        ScheduleHandle("dup", store=store).update(overlap="never")
    assert ScheduleHandle("dup", store=store).spec.every == 60.0
    # A pause note is kept with each recent action: a long one is refused, nothing changes.
    with pytest.raises(ConfigurationError, match="at most 1000 characters"):
        ScheduleHandle("dup", store=store).pause("x" * 1_000_000)
    assert ScheduleHandle("dup", store=store).describe().paused is False


# --------------------------------------------------------------------------- firing


def test_interval_schedule_fires_runs_with_deterministic_ids(durable_env) -> None:
    store = durable_env.store
    handle = ScheduleHandle.create("tick", Schedule(workflow=SchedTick, args=("hi",), every=1), store=store)
    wait_for(lambda: len(_started(handle)) >= 2, timeout=10)
    desc = handle.describe()
    first = _started(handle)[-1]
    assert first["workflow_id"] == scheduled_workflow_id("tick", _ms(first["scheduled_at"]))
    assert first["late_ms"] < 1500
    stub = WorkflowStub.load(first["workflow_id"], store=store)
    assert stub.result(timeout=10) == "hi"
    started = stub.history()[0].data["options"]
    assert started["schedule_id"] == "tick" and started["scheduled_at"] == _ms(first["scheduled_at"])
    record = store.run_record(store.ref(first["workflow_id"]))
    assert record["schedule_id"] == "tick"
    assert len(desc.next_times) == 5
    assert desc.spec.every == 1.0


def test_pause_unpause_trigger_delete(durable_env) -> None:
    store = durable_env.store
    handle = ScheduleHandle.create("p", Schedule(workflow=SchedTick, every="1h", paused=True), store=store)
    desc = handle.describe()
    assert desc.paused and desc.next_times == []
    wid = handle.trigger()
    assert WorkflowStub.load(wid, store=store).result(timeout=10) == ""
    handle.unpause()
    assert len(handle.describe().next_times) == 5
    handle.pause("maintenance")
    desc = handle.describe()
    assert desc.paused and desc.note == "maintenance"
    assert [a["action"] for a in desc.recent_actions][:4] == ["paused", "unpaused", "started", "triggered"]
    handle.delete()
    assert store.schedule_ids() == []
    with pytest.raises(ScheduleNotFound):
        handle.delete()


def test_backfill_starts_each_past_time_once(store: RedisStore) -> None:
    handle = ScheduleHandle.create(
        "bf", Schedule(workflow="SchedTick", every="1h", overlap="allow_all"), store=store
    )
    times = handle.backfill("2024-05-01T00:00:00Z", "2024-05-01T03:00:00Z")
    assert times == [
        "2024-05-01T00:00:00Z",
        "2024-05-01T01:00:00Z",
        "2024-05-01T02:00:00Z",
        "2024-05-01T03:00:00Z",
    ]
    for t in times:
        assert store.ref(f"bf-{t}")
    # Again: the same ids; nothing new starts, and it says so.
    again = handle.backfill("2024-05-01T00:00:00Z", "2024-05-01T03:00:00Z")
    assert again == times and again.existing == times and again.started == []
    assert handle.describe(runs=False).started == 4
    assert len([k for k in store.redis.scan_iter(match="*:wf:bf-*")]) == 4


def test_update_changes_the_times(store: RedisStore) -> None:
    handle = ScheduleHandle.create("u", Schedule(workflow="SchedTick", every="1h"), store=store)
    handle.update(cron="0 3 * * *", timezone="America/New_York")
    desc = handle.describe()
    assert desc.spec.cron == "0 3 * * *" and desc.spec.every is None
    assert all(t.endswith(("T07:00:00Z", "T08:00:00Z")) for t in desc.next_times)


# --------------------------------------------------------------------------- overlap


def _claim_now(store: RedisStore, handle: ScheduleHandle, ms: int) -> None:
    """Make a scheduled time due now (as if the schedule's next time had come)."""
    spec = handle.spec
    store.schedule_claim(
        handle.id,
        token="",
        expected=None,
        next_ms=None,
        last_ms=None,
        count=0,
        items=[(0, claim_member(ms, "scheduled", str(spec.overlap)))],
    )


@pytest.mark.parametrize(
    ("policy", "started_at_once", "buffered"),
    [
        ("skip", 1, 0),
        ("allow_all", 3, 0),
        ("buffer_one", 1, 1),
        ("buffer_all", 1, 2),
        ("terminate_other", 3, 0),
        ("cancel_other", 1, 1),
    ],
)
def test_overlap_policies(store: RedisStore, policy: str, started_at_once: int, buffered: int) -> None:
    handle = ScheduleHandle.create(
        f"o-{policy}", Schedule(workflow="SchedSleep", every="1h", overlap=policy), store=store
    )
    base = _ms("2024-05-01T00:00:00Z")
    sched = SchedulePass(store)
    for i in range(3):
        _claim_now(store, handle, base + i * 1000)
        sched.process(handle.id)
    desc = handle.describe()
    assert desc.started == started_at_once
    assert len(desc.buffered) == buffered
    open_runs = [r["workflow_id"] for r in desc.running]
    if policy == "terminate_other":
        assert open_runs == [scheduled_workflow_id(handle.id, base + 2000)]
        assert WorkflowStub.load(scheduled_workflow_id(handle.id, base), store=store).status() == "terminated"
    if policy == "allow_all":
        assert len(open_runs) == 3
    if policy == "cancel_other":
        assert desc.buffered == ["2024-05-01T00:00:02Z"]
    if buffered:
        # Close the open run: the buffered time starts next.
        for wid in open_runs:
            WorkflowStub.load(wid, store=store).terminate("test")
        sched.process(handle.id)
        desc = handle.describe()
        assert desc.started == started_at_once + 1
        assert len(desc.buffered) == buffered - 1


def test_a_buffer_is_capped_paused_and_trimmed_to_the_policy(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """buffer_all grew without bound (106 times after 12 minutes of 3 s times and 5 s runs);
    buffered times went on starting while paused, and after an update to skip; the skip said
    "buffer full"."""
    monkeypatch.setitem(schedule_pass._BUFFER_KEEPS, ScheduleOverlap.BUFFER_ALL, 3)  # 1,000 in use
    handle = ScheduleHandle.create(
        "cap", Schedule(workflow="SchedSleep", every="1h", overlap="buffer_all"), store=store
    )
    base, sched = _ms("2024-05-01T00:00:00Z"), SchedulePass(store)
    for i in range(6):  # one starts, three are buffered, two skipped
        _claim_now(store, handle, base + i * 1000)
        sched.process(handle.id)
    desc = handle.describe()
    assert desc.started == 1 and len(desc.buffered) == 3
    skipped = [a for a in desc.recent_actions if a["action"] == "skipped"]
    assert [a["reason"] for a in skipped] == ["buffer full (3 waiting)"] * 2
    (first,) = [r["workflow_id"] for r in desc.running]

    handle.pause("deploy")
    WorkflowStub.load(first, store=store).terminate("test")
    sched.process(handle.id)
    assert handle.describe().started == 1  # paused: no buffered time starts
    handle.update(overlap="skip")
    handle.unpause()
    sched.process(handle.id)
    desc = handle.describe()
    assert desc.buffered == [] and desc.started == 1  # skip keeps none: dropped, each said
    dropped = [a for a in desc.recent_actions if a.get("reason", "").startswith("overlap is skip now")]
    assert len(dropped) == 3
    _claim_now(store, handle, base + 10_000)
    sched.process(handle.id)
    assert handle.describe().started == 2  # nothing open: it starts


# --------------------------------------------------------------------------- exactly once


def test_each_time_fires_once_with_several_schedulers(store: RedisStore) -> None:
    for i in range(20):
        ScheduleHandle.create(
            f"x{i}", Schedule(workflow="SchedTick", every=1, overlap="allow_all"), store=store
        )
    stop = threading.Event()
    passes = [SchedulePass(RedisStore(store.url)) for _ in range(3)]

    def loop(sched: SchedulePass) -> None:
        while not stop.is_set():
            sched.tick()
            time.sleep(0.05)

    threads = [threading.Thread(target=loop, args=(s,)) for s in passes]
    for t in threads:
        t.start()
    time.sleep(3.5)
    stop.set()
    for t in threads:
        t.join()
    for i in range(20):
        desc = ScheduleHandle(f"x{i}", store=store).describe(runs=False)
        started = [a for a in desc.recent_actions if a["action"] == "started"]
        times = [a["scheduled_at"] for a in started]
        assert len(times) == len(set(times)) >= 3, times
        assert desc.started == len(times) == desc.fired
    assert sum(s.started for s in passes) == sum(
        ScheduleHandle(f"x{i}", store=store).describe(runs=False).started for i in range(20)
    )


def test_catch_up_window(store: RedisStore) -> None:
    """Times missed while no scheduler ran: those within the window fire, older are recorded missed."""
    handle = ScheduleHandle.create(
        "cu", Schedule(workflow="SchedTick", every=1, catchup_window=3, overlap="allow_all"), store=store
    )
    key = store.keys.schedule(store.keys.partition("cu"), "cu")
    now = store.server_time_ms()
    store.redis.hset(key, "next", (now // 1000 - 10) * 1000)  # as if schedulers were down for 10 s
    SchedulePass(store).process("cu")
    desc = handle.describe(runs=False)
    actions = [a["action"] for a in desc.recent_actions]
    assert "missed" in actions
    assert 3 <= desc.started <= 4  # the last 3 s (+ the boundary), not 10
    assert _ms(desc.next_times[0]) > now


def test_a_time_that_did_not_fire_says_why(store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """No worker runs: the schedule's times passed, and list/describe said only ``active``
    with a next time in the past, ``started 0``."""
    monkeypatch.setattr(schedule_health, "OVERDUE_AFTER_S", 1.0)
    handle = ScheduleHandle.create("od", Schedule(workflow="SchedTick", every=1), store=store)
    assert handle.describe().overdue == ""  # its first time is ahead
    desc = wait_for(lambda: (d := handle.describe()).overdue and d, timeout=10)
    assert "s ago and has not fired: no live worker runs" in desc.overdue, desc.overdue
    assert "`durable worker --app YOUR_APP`" in desc.overdue
    assert "more than 60 s old by then (the catchup window) are recorded as missed" in desc.overdue
    assert desc.to_dict()["overdue"] == desc.overdue
    assert "overdue: " + desc.next_times[0] in cli_ok("schedule", "describe", "od")
    assert "  overdue: " + desc.next_times[0] in cli_ok("schedule", "list")
    handle.pause()
    assert handle.describe().overdue == ""  # paused: its times are not due
    handle.unpause()
    with TestEnvironment(store=store):  # a live worker's scheduler fires the schedule
        wait_for(lambda: handle.describe().started >= 1, timeout=10)
        assert handle.describe().overdue == ""


def test_a_time_waiting_out_its_jitter_is_shown(store: RedisStore) -> None:
    """Claimed, its run not started yet: describe shows when it starts (it was invisible)."""
    handle = ScheduleHandle.create(
        "jit", Schedule(workflow="SchedTick", every="1h", jitter="50m"), store=store
    )
    key = store.keys.schedule(store.keys.partition("jit"), "jit")
    spec = handle.describe(runs=False).spec
    now = store.server_time_ms()
    # A due time (a second ago or earlier) whose jitter is long enough for this test to see it.
    due = next(t for t in range(now - 1000, now - 600_000, -1000) if spec.jitter_ms("jit", t) > 60_000)
    delay = spec.jitter_ms("jit", due)
    store.redis.hset(key, "next", due)
    SchedulePass(store).process("jit")
    desc = handle.describe(runs=False)
    assert desc.claimed == [{"scheduled_at": iso(due), "starts_at": iso(due + delay)}]
    assert desc.started == 0 and desc.to_dict()["claimed"] == desc.claimed
    out = CliRunner().invoke(cli, ["schedule", "describe", "jit"])
    assert f"claimed: {iso(due)}, starts at {iso(due + delay)}" in out.output, out.output


def test_example(store: RedisStore) -> None:
    from examples import schedule as example  # noqa: PLC0415 - the example module, loaded like tests/test_examples.py

    out = example.main(store, seconds=2.5)
    assert out["started"] >= 2 and out["result"]["region"] == "eu"
    assert store.schedule_ids() == []


# --------------------------------------------------------------------------- tester's findings


@pytest.mark.parametrize("every", ["1ms", "999ms", 0.5, "0.2s"])
def test_every_below_the_minimum_is_refused(store: RedisStore, every: object) -> None:
    from durable.schedule_spec import MIN_INTERVAL_S

    with pytest.raises(ConfigurationError, match=r"the shortest interval is 1s \(MIN_INTERVAL_S"):
        Schedule(workflow="SchedTick", every=every)
    handle = ScheduleHandle.create("m", Schedule(workflow="SchedTick", every="1s"), store=store)
    before = handle.describe(runs=False)
    with pytest.raises(ConfigurationError, match="the shortest interval is 1s"):
        handle.update(every=every)
    after = handle.describe(runs=False)
    assert after.spec.every == 1.0 and after.recent_actions == before.recent_actions
    assert MIN_INTERVAL_S == 1.0 and Schedule(workflow="X", every=1).every_ms == 1000


def test_a_stored_sub_second_interval_is_read_at_the_minimum(store: RedisStore) -> None:
    """Schedules stored before the minimum existed can still be listed, paused, updated, deleted."""
    import json

    handle = ScheduleHandle.create("old", Schedule(workflow="SchedTick", every="1h"), store=store)
    key = store.keys.schedule(store.keys.partition("old"), "old")
    spec = json.loads(store.redis.hget(key, "spec"))
    store.redis.hset(key, "spec", json.dumps({**spec, "every": 0.001}))
    assert handle.spec.every == 1.0
    assert [d.id for d in ScheduleHandle.list(store=store)] == ["old"]
    handle.pause()
    handle.update(every="5m")
    assert handle.spec.every == 300.0
    # A cron's jitter past its interval (stored before it was refused) is read at half of it.
    store.redis.hset(key, "spec", json.dumps({**spec, "every": None, "cron": "0 * * * *", "jitter": 7200.0}))
    assert (handle.spec.cron, handle.spec.jitter) == ("0 * * * *", 1800.0)


def test_times_end_at_year_9999_and_a_stored_out_of_range_spec_is_readable(store: RedisStore) -> None:
    import json

    last = Schedule(workflow="SchedTick", every="1h", start_at="9999-12-31T23:00:00Z")
    assert last.upcoming(0) == [LAST_MS - 3_599_999]  # its one time, then it has ended
    # The last two midnights, and no error past them (cronsim raised at year 10000).
    midnights = Schedule(workflow="SchedTick", cron="0 0 * * *").upcoming(LAST_MS - 2 * 86_400_000)
    assert midnights == [LAST_MS + 1 - 2 * 86_400_000, LAST_MS + 1 - 86_400_000]
    # In a zone ahead of UTC, the last hours are in year 10000 there: no time, not an OverflowError.
    kiritimati = Schedule(workflow="SchedTick", cron="59 23 * * *", timezone="Pacific/Kiritimati")
    assert kiritimati.upcoming(LAST_MS - 3_600_000) == []
    handle = ScheduleHandle.create("far", last, store=store)
    assert handle.describe().spec.to_dict()["start_at"] == "9999-12-31T23:00:00Z"
    # Stored before the checks: listed, described, deleted (it crashed all of them).
    key = store.keys.schedule(store.keys.partition("far"), "far")
    spec = json.loads(store.redis.hget(key, "spec"))
    store.redis.hset(
        key, mapping={"spec": json.dumps({**spec, "every": 8.64e12, "start_at": 1e18}), "next": 10**18}
    )
    assert [d.id for d in ScheduleHandle.list(store=store)] == ["far"]
    assert handle.describe().spec.every == MAX_INTERVAL_S
    handle.delete()


def test_recent_actions_say_how_the_runs_a_schedule_started_ended(durable_env) -> None:
    """A schedule whose runs all fail said only `started` for each of them."""
    store = durable_env.store
    handle = ScheduleHandle.create("f", Schedule(workflow=SchedFails, every="1h", paused=True), store=store)
    wid = handle.trigger()
    wait_for(lambda: WorkflowStub.load(wid, store=store).status() == "failed", timeout=10)
    (started,) = _started(handle)
    assert (started["workflow_id"], started["status"]) == (wid, "failed")
    out = cli_ok("--redis", store.url, "schedule", "describe", "f")
    assert f"workflow_id={wid}" in out and "status=failed" in out, out


def test_trigger_returns_none_when_the_overlap_policy_skips(store: RedisStore) -> None:
    handle = ScheduleHandle.create("tr", Schedule(workflow="SchedSleep", every="1h"), store=store)
    first = handle.trigger()
    assert first is not None and WorkflowStub.load(first, store=store).status() == "pending"
    assert handle.trigger() is None  # a run is open: skip starts nothing
    skipped = handle.describe().recent_actions[0]
    assert skipped["action"] == "skipped" and skipped["reason"] == "a run is open"
    forced = handle.trigger(overlap="allow_all")
    assert forced is not None and WorkflowStub.load(forced, store=store).status() == "pending"
    # buffer_one: the id it will start under once the open runs close.
    buffered = handle.trigger(overlap="buffer_one")
    assert buffered is not None and handle.describe().buffered == [buffered[len("tr-") :]]
    assert handle.describe(runs=False).started == 2


def test_a_time_whose_workflow_id_another_run_holds_is_skipped_not_recorded_as_started(
    store: RedisStore,
) -> None:
    """A run started by hand under the id a scheduled time takes was recorded as the
    schedule's own start (no run of its type was started, and the overlap policy then counted
    the stranger as its open run)."""
    handle = ScheduleHandle.create("sx", Schedule(workflow="SchedTick", every="1h"), store=store)
    base = _ms("2024-05-01T00:00:00Z")
    stranger = WorkflowStub.make("SchedSleep", id=scheduled_workflow_id("sx", base), store=store).start(60)
    _claim_now(store, handle, base)
    SchedulePass(store).process(handle.id)
    desc = handle.describe()
    assert desc.started == 0 and desc.running == []
    (skipped,) = [a for a in desc.recent_actions if a["action"] == "skipped"]
    assert f"is taken by run {stranger.run_id}, not started by this schedule" in skipped["reason"]
    stranger.terminate("test")


def test_a_schedule_whose_times_are_skipped_behind_an_open_run_says_it_is_held_up(store: RedisStore) -> None:
    """`schedule list` showed it as plain "active", on time: it fires, and skips every time."""
    handle = ScheduleHandle.create("hu", Schedule(workflow="SchedSleep", every="1h"), store=store)
    base, sched = _ms("2024-05-01T00:00:00Z"), SchedulePass(store)
    _claim_now(store, handle, base)
    sched.process(handle.id)
    (run,) = [r["workflow_id"] for r in handle.describe().running]
    assert handle.describe().held_up == ""  # one run, open as it should be
    for i in (1, 2, 3):
        _claim_now(store, handle, base + i * 3_600_000)
        sched.process(handle.id)
    held = handle.describe().held_up
    assert held.startswith(
        f"its last 3 times were skipped behind run {run} (scheduled 2024-05-01T00:00:00Z), still pending; "
        "blocked: no live worker serves queue 'default'"  # (no worker runs in this test)
    ), held
    listed = cli_ok("--redis", store.url, "schedule", "list")
    assert f"  held up: its last 3 times were skipped behind run {run}" in listed, listed
    WorkflowStub.load(run, store=store).terminate("test")
    _claim_now(store, handle, base + 4 * 3_600_000)
    sched.process(handle.id)
    assert handle.describe().held_up == ""  # it started a run again


def test_a_trigger_or_backfill_buffered_on_a_skip_schedule_starts_once_the_run_closes(
    store: RedisStore,
) -> None:
    """The next pass dropped them ("overlap is skip now", the schedule's own policy) while the
    callers had been told they would start once the open run closed."""
    handle = ScheduleHandle.create("tb", Schedule(workflow="SchedSleep", every="1h"), store=store)
    first = handle.trigger()
    assert first is not None
    triggered = handle.trigger(overlap="buffer_one")
    filled = handle.backfill("2024-05-01T00:00:00Z", "2024-05-01T01:00:00Z", overlap="buffer_all")
    assert filled.started == [] and len(filled.buffered) == 2
    sched = SchedulePass(store)
    sched.process(handle.id)  # a pass while the run is open keeps every one of them
    assert len(handle.describe().buffered) == 3
    started = [first]
    for _ in range(3):  # each time the open run closes, the oldest buffered time starts
        WorkflowStub.load(started[-1], store=store).terminate("test")
        sched.process(handle.id)
        (now_open,) = [r["workflow_id"] for r in handle.describe().running]
        started.append(now_open)
    assert started[1] == triggered and len(set(started)) == 4
    assert handle.describe().started == 4 and handle.describe().buffered == []
    assert not [a for a in handle.describe().recent_actions if a["action"] == "skipped"]


def test_backfill_says_what_started_and_what_was_skipped(store: RedisStore) -> None:
    handle = ScheduleHandle.create("bs", Schedule(workflow="SchedSleep", every="1h"), store=store)
    done = handle.backfill("2024-05-01T00:00:00Z", "2024-05-01T04:00:00Z")
    assert len(done) == 5 and done[0] == "2024-05-01T00:00:00Z"  # still the list of times
    assert done.started == ["2024-05-01T00:00:00Z"] and len(done.skipped) == 4
    assert done.skip_reason == "a run is open (overlap skip)"
    assert done.buffered == done.pending == []
    every = handle.backfill("2024-05-02T00:00:00Z", "2024-05-02T02:00:00Z", overlap="allow_all")
    assert len(every.started) == 3 and every.skipped == [] and every.skip_reason is None
    queued = handle.backfill("2024-05-03T00:00:00Z", "2024-05-03T02:00:00Z", overlap="buffer_one")
    assert queued.started == [] and len(queued.buffered) == 1 and len(queued.skipped) == 2
    assert queued.skip_reason == "a time is buffered already (overlap buffer_one)"
    # buffer_all skips only past its cap (it said "a run is open", and advised buffer_all).
    assert skip_reason("buffer_all") == "the buffer is full (1000 times wait; overlap buffer_all)"


def test_finished_schedules_say_so(store: RedisStore) -> None:
    handle = ScheduleHandle.create(
        "mr", Schedule(workflow="SchedTick", every=1, max_runs=2, overlap="allow_all"), store=store
    )
    assert handle.describe(runs=False).state == "active"
    key = store.keys.schedule(store.keys.partition("mr"), "mr")
    store.redis.hset(key, "next", (store.server_time_ms() // 1000 - 3) * 1000)  # 3 times are due
    SchedulePass(store).process("mr")
    desc = handle.describe(runs=False)
    assert desc.fired == desc.started == 2 and desc.next_times == []
    assert desc.state == "done (max_runs reached)" and desc.to_dict()["state"] == desc.state
    past = ScheduleHandle.create(
        "past", Schedule(workflow="SchedTick", every="1h", end_at="2020-01-01"), store=store
    )
    assert past.describe(runs=False).state == "ended (end_at passed)"
    handle.pause()
    assert handle.describe(runs=False).state == "done (max_runs reached)"


@pytest.mark.parametrize("args", ["abc", b"abc", 5])
def test_args_must_be_a_list_or_tuple(store: RedisStore, args: object) -> None:
    with pytest.raises(ConfigurationError, match="args must be a list or tuple of arguments, not "):
        Schedule(workflow="SchedTick", every="1m", args=args)  # type: ignore[arg-type]
    handle = ScheduleHandle.create("ar", Schedule(workflow="SchedTick", every="1m", args=["a"]), store=store)
    with pytest.raises(ConfigurationError, match="args must be a list or tuple"):
        handle.update(args=args)
    assert handle.spec.args == ("a",)


def test_update_of_an_unknown_field_names_it(store: RedisStore) -> None:
    handle = ScheduleHandle.create("uf", Schedule(workflow="SchedTick", every="1m"), store=store)
    with pytest.raises(ConfigurationError) as info:
        handle.update(colour="red", every="5m")
    assert "unknown schedule field(s) 'colour': valid ones are workflow, args, cron, every" in str(info.value)
    assert handle.spec.every == 60.0


def test_pause_notes_paused_flags_and_empty_updates(store: RedisStore) -> None:
    handle = ScheduleHandle.create("pn", Schedule(workflow="SchedTick", every="1m"), store=store)
    handle.pause()
    desc = handle.describe()
    assert desc.paused and desc.note == "" and desc.state == "paused"
    data = desc.to_dict()
    assert data["paused"] is data["spec"]["paused"] is True and handle.spec.paused
    handle.unpause()
    handle.pause("deploy")
    assert handle.describe().note == "deploy"
    handle.unpause()  # the pause's reason no longer holds
    desc = handle.describe()
    assert not desc.paused and desc.note == "" and desc.to_dict()["spec"]["paused"] is False
    # Nothing to change: nothing written, nothing recorded.
    assert handle.update() == handle.spec
    assert handle.update(every="1m") == handle.spec
    assert handle.describe().recent_actions == desc.recent_actions
    handle.update(note="owned by billing")
    assert handle.describe().note == "owned by billing" and handle.spec.note == "owned by billing"


def test_a_queue_no_worker_could_serve_and_a_window_nothing_fits_in_are_refused() -> None:
    """A tester's schedule on queue 'a:b' (refused by start and by workers) started a run no
    worker could ever serve; one with catchup_window 0 recorded every time as missed (a time
    fires some ms after it is due) and never started a run."""
    with pytest.raises(ConfigurationError, match="invalid queue name 'a:b'"):
        Schedule(workflow="SchedTick", every=2, queue="a:b")
    for window in (0, "1ms", 0.5):
        with pytest.raises(ConfigurationError, match="catchup_window .* the shortest is 1s"):
            Schedule(workflow="SchedTick", every=2, catchup_window=window)
    # Stored by a release that took them: read back so they can be shown, updated or deleted.
    stored = (
        Schedule(workflow="SchedTick", every=2)
        .to_json()
        .replace('"catchup_window":60.0', '"catchup_window":0.0')
    )
    stored = stored.replace('"queue":null', '"queue":"a:b"')
    spec = Schedule.from_json(stored)
    assert spec.catchup_window == 1.0 and spec.queue == "a:b"


def test_a_schedule_whose_pass_fails_is_tried_again_after_a_pause_and_said_once(
    store: RedisStore, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A key of the schedule's of the wrong kind failed its pass: still due, it was tried again
    # at once, hundreds of passes a second, each with a traceback (95,000 log lines a minute).
    ScheduleHandle.create("broken", Schedule(workflow="SchedTick", every="1s"), store=store)
    sweep = SchedulePass(store)

    def fails(schedule_id: str, now_ms: int | None = None) -> bool:
        raise RuntimeError(f"schedule {schedule_id} cannot be read")

    monkeypatch.setattr(sweep, "process", fails)
    time.sleep(1.1)  # due
    with caplog.at_level("ERROR", logger="durable.schedules"):
        now = store.server_time_ms()
        soonest = [sweep.tick() for _ in range(3)]
    assert all(s is not None and s >= now + schedule_pass.RETRY_MS - 100 for s in soonest), soonest
    said = [r for r in caplog.records if "schedule broken: pass failed; retrying in 5 s" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is not None
    ScheduleHandle("broken", store=store).delete()
