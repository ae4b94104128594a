"""``durable schedule ...`` in process, and schedules fired by real `durable worker` processes:
each scheduled time starts exactly one run however many workers' schedulers race; a schedule
survives a Redis restart."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest
from click.testing import CliRunner, Result

from durable import Schedule, ScheduleHandle, WorkflowStub
from durable.store.embedded import EmbeddedRedis
from durable.store.redis_store import RedisStore
from tests.procs import workers
from tests.waiting import wait_for
from workers.cli import cli


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def test_cli_create_describe_list_pause_trigger_backfill_update_delete(redis_url: str) -> None:
    made = invoke(
        "schedule", "create", "nightly", "--workflow", "Report", "--args", '"eu"', "--args", "3",
        "--cron", "0 2 * * *", "--timezone", "Europe/Berlin", "--overlap", "buffer_one", "--json",
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    data = json.loads(made.output)
    assert data["spec"]["args"] == ["eu", 3] and data["spec"]["overlap"] == "buffer_one"
    assert len(data["next_times"]) == 5 and all(
        t.endswith(("T00:00:00Z", "T01:00:00Z")) for t in data["next_times"]
    )

    text = invoke("schedule", "describe", "nightly").output
    assert "cron '0 2 * * *' (Europe/Berlin), overlap buffer_one" in text and "next: " in text
    listed = json.loads(invoke("schedule", "list", "--json").output)
    assert [d["id"] for d in listed] == ["nightly"]

    assert invoke("schedule", "pause", "nightly", "--note", "deploy").output == "schedule nightly paused\n"
    paused = json.loads(invoke("schedule", "describe", "nightly", "--json").output)
    assert paused["paused"] and paused["note"] == "deploy" and paused["next_times"] == []
    invoke("schedule", "unpause", "nightly")

    fired = json.loads(invoke("schedule", "trigger", "nightly", "--json").output)
    assert fired["workflow_id"].startswith("nightly-")
    filled = json.loads(
        invoke(
            "schedule",
            "backfill",
            "nightly",
            "--from",
            "2024-05-01",
            "--to",
            "2024-05-03T12:00:00Z",
            "--overlap",
            "allow_all",
            "--json",
        ).output  # fmt: skip
    )
    assert filled["scheduled"] == ["2024-05-01T00:00:00Z", "2024-05-02T00:00:00Z", "2024-05-03T00:00:00Z"]
    assert WorkflowStub.load("nightly-2024-05-02T00:00:00Z").status() == "pending"
    # The list says what describe says of the runs it started (it said "status": null).
    described = json.loads(invoke("schedule", "describe", "nightly", "--json").output)
    (listed,) = json.loads(invoke("schedule", "list", "--json").output)
    started = [a for a in listed["recent_actions"] if a.get("workflow_id")]
    assert started and {a["status"] for a in started} == {"pending"}
    assert listed["recent_actions"] == described["recent_actions"]
    assert listed["running"] == described["running"]

    updated = json.loads(invoke("schedule", "update", "nightly", "--every", "15m", "--json").output)
    assert updated["spec"]["every"] == 900.0 and updated["spec"]["cron"] is None
    assert invoke("schedule", "delete", "nightly").output == "schedule nightly deleted\n"
    assert invoke("schedule", "list").output == "no schedules\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--cron", "0 25 * * *"),
            "error: invalid cron expression '0 25 * * *': field 2 (hour) '25' at column 3",
        ),
        (
            ("--every", "1m", "--overlap", "sometimes"),
            "error: unknown overlap policy 'sometimes': use one of skip, ",
        ),
        (("--every", "fast"), "error: every: not a duration: 'fast'"),
        ((), "error: a schedule needs exactly one of cron"),
    ],
)
def test_cli_bad_input_is_one_error_line_and_writes_nothing(
    redis_url: str, args: tuple[str, ...], message: str
) -> None:
    result = CliRunner().invoke(cli, ["schedule", "create", "s", "--workflow", "Report", *args])
    assert result.exit_code == 1
    assert result.output.startswith(message), result.output
    assert RedisStore(redis_url).schedule_ids() == []


def test_cli_unknown_schedule(redis_url: str) -> None:
    result = CliRunner().invoke(cli, ["schedule", "describe", "ghost"])
    assert result.exit_code == 1
    assert "error: no schedule with id 'ghost'" in result.output


@pytest.mark.slow
def test_exactly_once_with_three_worker_processes(redis_url: str) -> None:
    store = RedisStore(redis_url)
    ids = [f"e{i}" for i in range(10)]
    with workers(redis_url, n=3, app="apps.schedules"):
        for sid in ids:
            invoke("schedule", "create", sid, "--workflow", "SchedEcho", "--args", sid, "--every", "1s",
                   "--overlap", "allow_all")  # fmt: skip
        time.sleep(5)
        for sid in ids:
            ScheduleHandle(sid, store=store).pause()
        time.sleep(0.5)
    for sid in ids:
        desc = ScheduleHandle(sid, store=store).describe(runs=False)
        started = [a for a in desc.recent_actions if a["action"] == "started"]
        times = sorted(_ms(a["scheduled_at"]) for a in started)
        assert len(times) >= 3, (sid, times)
        assert len(times) == len(set(times)) == desc.started == desc.fired, (sid, times)
        # No time skipped in between, none twice.
        assert times == list(range(times[0], times[-1] + 1, 1000)), (sid, times)
        instances = list(store.redis.scan_iter(match=f"*:wf:{sid}-*"))
        assert len(instances) == len(times)
    store.close()


@pytest.mark.slow
def test_schedule_survives_a_redis_restart(fresh_redis: EmbeddedRedis) -> None:
    store = RedisStore(fresh_redis.url)
    ScheduleHandle.create("keep", Schedule(workflow="SchedEcho", every="1h"), store=store)
    before = ScheduleHandle("keep", store=store).describe().next_times
    store.redis.save()  # the embedded server's persistence: a restart reloads the data
    fresh_redis.stop()
    fresh_redis.ensure()
    store = RedisStore(fresh_redis.url)
    assert ScheduleHandle("keep", store=store).describe().next_times == before
    with workers(fresh_redis.url, n=1, app="apps.schedules"):
        wid = ScheduleHandle("keep", store=store).trigger()
        assert wait_for(lambda: WorkflowStub.load(wid, store=store).status() == "completed", timeout=15)
    store.close()


# --------------------------------------------------------------------------- tester's findings


def _fails(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_cli_refuses_an_interval_below_the_minimum(redis_url: str) -> None:
    made = _fails("schedule", "create", "bad1", "--workflow", "Tick", "--every", "1ms")
    assert made.exit_code == 1
    assert made.output.startswith("error: every '1ms' is 0.001s: the shortest interval is 1s"), made.output
    assert RedisStore(redis_url).schedule_ids() == []
    assert invoke("schedule", "create", "ok", "--workflow", "Tick", "--every", "1s").exit_code == 0
    changed = _fails("schedule", "update", "ok", "--every", "1ms")
    assert changed.exit_code == 1 and "the shortest interval is 1s" in changed.output
    assert json.loads(invoke("schedule", "describe", "ok", "--json").output)["spec"]["every"] == 1.0


def test_cli_trigger_and_backfill_say_what_the_overlap_policy_did(redis_url: str) -> None:
    invoke("schedule", "create", "sA", "--workflow", "Report", "--every", "1h")
    started = invoke("schedule", "trigger", "sA").output  # no worker runs Report: the run stays open
    assert started.startswith("workflow_id: sA-"), started
    skipped = invoke("schedule", "trigger", "sA")
    assert skipped.exit_code == 0
    assert skipped.output == (
        "skipped: a run is open (overlap skip); use --overlap allow_all to start one anyway\n"
    )
    data = json.loads(invoke("schedule", "trigger", "sA", "--json").output)
    assert data["outcome"] == "skipped" and data["workflow_id"] is None
    data = json.loads(invoke("schedule", "trigger", "sA", "--overlap", "allow_all", "--json").output)
    assert data["outcome"] == "started" and data["workflow_id"].startswith("sA-")
    buffered = invoke("schedule", "trigger", "sA", "--overlap", "buffer_one").output
    assert buffered.startswith("buffered: sA-") and "starts when the open run closes" in buffered

    filled = invoke(
        "schedule", "backfill", "sA", "--from", "2024-05-01T00:00:00Z", "--to", "2024-05-01T04:00:00Z"
    )
    assert filled.output == (
        "backfill of sA: 5 scheduled time(s) (2024-05-01T00:00:00Z .. 2024-05-01T04:00:00Z); "
        "0 started, 5 skipped: a run is open (overlap skip)\n"
        "use --overlap allow_all or buffer_all to start every one\n"
    )
    data = json.loads(
        invoke(
            "schedule",
            "backfill",
            "sA",
            "--from",
            "2024-05-02",
            "--to",
            "2024-05-02T01:00:00Z",
            "--overlap",
            "allow_all",
            "--json",
        ).output  # fmt: skip
    )
    assert data["scheduled"] == data["started"] == ["2024-05-02T00:00:00Z", "2024-05-02T01:00:00Z"]
    assert data["skipped"] == [] and data["skip_reason"] is None and data["existing"] == []
    again = invoke(
        "schedule", "backfill", "sA", "--from", "2024-05-02", "--to", "2024-05-02T02:00:00Z", "--overlap", "allow_all"
    )  # fmt: skip
    assert again.output == (
        "backfill of sA: 3 scheduled time(s) (2024-05-02T00:00:00Z .. 2024-05-02T02:00:00Z); "
        "1 started, 2 had started already (their runs exist)\n"
    )


def test_cli_create_with_app_checks_the_workflow_type(redis_url: str) -> None:
    refused = _fails(
        "schedule", "create", "g3", "--workflow", "SchedEch", "--every", "3s", "--app", "apps.schedules"
    )
    assert refused.exit_code == 1
    assert "workflow type 'SchedEch' is not defined in --app apps.schedules; did you mean 'SchedEcho'?" in (
        refused.output
    )
    assert RedisStore(redis_url).schedule_ids() == []
    made = invoke(
        "schedule", "create", "g3", "--workflow", "SchedEcho", "--every", "3s", "--app", "apps.schedules"
    )
    assert made.exit_code == 0
    assert "warning: no live worker on queue 'default' runs workflow type 'SchedEcho'" in made.stderr
    changed = _fails("schedule", "update", "g3", "--workflow", "Nope", "--app", "apps.schedules")
    assert changed.exit_code == 1 and "'Nope' is not defined in --app" in changed.output
    assert ScheduleHandle("g3").spec.workflow == "SchedEcho"


def test_cli_shows_finished_schedules(redis_url: str) -> None:
    store = RedisStore(redis_url)
    invoke("schedule", "create", "mr", "--workflow", "Report", "--every", "1s", "--max-runs", "2",
           "--overlap", "allow_all")  # fmt: skip
    key = store.keys.schedule(store.keys.partition("mr"), "mr")
    store.redis.hset(key, "next", (store.server_time_ms() // 1000 - 3) * 1000)  # 3 times are due
    ScheduleHandle("mr", store=store).trigger()  # runs the schedule pass at once
    assert "state: done (max_runs reached); fired 2, started 3" in invoke("schedule", "describe", "mr").output
    ended = invoke(
        "schedule", "create", "old", "--workflow", "Report", "--every", "1h", "--end-at", "2020-01-01"
    )
    assert ended.exit_code == 0
    assert (
        "warning: schedule old will never fire: end_at 2020-01-01T00:00:00Z is already past" in ended.stderr
    )
    listed = invoke("schedule", "list").output.splitlines()
    assert "  done (max_runs reached)  next -" in listed[0] and "  ended (end_at passed)  next -" in listed[1]
    assert (
        json.loads(invoke("schedule", "describe", "old", "--json").output)["state"] == "ended (end_at passed)"
    )


def test_cli_refuses_times_past_9999_and_lists_one_stored_before(redis_url: str) -> None:
    """A spec whose times a datetime cannot hold was written, then crashed `schedule list`,
    `describe` and the API's schedules for every schedule (a traceback, a 500)."""
    too_long = invoke("schedule", "create", "far", "--workflow", "Report", "--every", "100000000d")
    assert too_long.exit_code == 1 and too_long.output.startswith("error: every '100000000d' is "), (
        too_long.output
    )
    assert "the longest interval is 100 years" in too_long.output
    assert RedisStore(redis_url).schedule_ids() == []
    assert invoke("schedule", "create", "ok", "--workflow", "Report", "--every", "1h").exit_code == 0
    store = RedisStore(redis_url)
    key = store.keys.schedule(store.keys.partition("ok"), "ok")
    store.redis.hset(key, "next", 10**16)  # a time written before the checks
    listed = invoke("schedule", "list")
    assert listed.exit_code == 0 and "10000000000000000 ms after 1970 (out of range)" in listed.output
    assert invoke("schedule", "describe", "ok").exit_code == 0


def test_cli_update_clears_end_at_start_at_and_max_runs_with_none(redis_url: str) -> None:
    """`--end-at ''` was "not a date": only Python's update(end_at=None) could clear them."""
    made = invoke("schedule", "create", "clr", "--workflow", "Report", "--cron", "0 9 * * *", "--timezone",
                  "Europe/Berlin", "--end-at", "2030-01-01", "--start-at", "2026-01-01", "--max-runs", "5")  # fmt: skip
    assert made.exit_code == 0, made.output
    cleared = invoke(
        "schedule", "update", "clr", "--end-at", "none", "--start-at", "None", "--max-runs", "none"
    )
    assert cleared.exit_code == 0, cleared.output
    spec = json.loads(invoke("schedule", "describe", "clr", "--json").output)["spec"]
    assert (spec["end_at"], spec["start_at"], spec["max_runs"]) == (None, None, None)
    # A cron's zone goes when it becomes an interval (an interval has none).
    assert invoke("schedule", "update", "clr", "--every", "1h").exit_code == 0
    assert json.loads(invoke("schedule", "describe", "clr", "--json").output)["spec"]["timezone"] == "UTC"
    bad = invoke("schedule", "update", "clr", "--max-runs", "many")
    assert bad.exit_code != 0 and "'many' is not a number (or none)" in bad.output


def test_cli_pause_without_note_and_update_without_options(redis_url: str) -> None:
    invoke("schedule", "create", "sC", "--workflow", "Report", "--every", "1h")
    invoke("schedule", "pause", "sC")
    assert "state: paused; fired 0" in invoke("schedule", "describe", "sC").output
    data = json.loads(invoke("schedule", "describe", "sC", "--json").output)
    assert data["paused"] is True and data["spec"]["paused"] is True and data["note"] == ""
    before = data["recent_actions"]
    nothing = _fails("schedule", "update", "sC")
    assert nothing.exit_code == 2 and "nothing to change" in nothing.output
    assert json.loads(invoke("schedule", "describe", "sC", "--json").output)["recent_actions"] == before


def test_describe_says_why_the_open_run_every_time_waits_on_is_stuck(
    redis_url: str, store: RedisStore
) -> None:
    """A schedule whose one open run was blocked (a type no worker serves) looked healthy:
    "state: active", "running: x (pending)", while every later time was skipped for it."""
    made = invoke(
        "schedule", "create", "stuck", "--workflow", "Typo", "--every", "1h", "--queue", "nobody-serves",
        "--start-at", "2030-01-01T00:00:00Z", "--end-at", "2031-01-01T00:00:00Z",
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    assert invoke("schedule", "trigger", "stuck").exit_code == 0
    wait_for(lambda: ScheduleHandle("stuck", store=store).describe().running)
    text = invoke("schedule", "describe", "stuck").output
    (running,) = [line for line in text.splitlines() if line.startswith("running: ")]
    assert "(pending, blocked: no live worker serves queue 'nobody-serves'" in running, text
    assert "from 2030-01-01T00:00:00Z, until 2031-01-01T00:00:00Z" in text, text
    (run,) = json.loads(invoke("schedule", "describe", "stuck", "--json").output)["running"]
    assert run["blocked"].startswith("no live worker serves queue 'nobody-serves'")
