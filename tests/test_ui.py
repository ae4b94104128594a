"""The web UI in real headless Chromium (Debian's ``chromium``, driven by Playwright).

A real ``durable server`` process (one open on loopback, one with tokens) over the test Redis
with a real ``durable worker`` process; one browser for the module. Each page is saved as a
screenshot at 1280x800 under the test's tmp output (the path is printed) to be looked at.
Without chromium or Playwright these tests skip, saying why.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from procs import spawn_worker, stop
from server_procs import ServerProc
from waiting import wait_for

from durable import Schedule, ScheduleHandle, WorkflowStub
from durable.store.connect import flush_database
from durable.store.redis_store import RedisStore
from durable.store.workers import WorkerInfo
from workers.worker import Worker

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed: pip install playwright"
)
if CHROMIUM is None:
    pytest.skip(
        "no chromium on PATH: apt-get install -y chromium (Playwright's own download is not used)",
        allow_module_level=True,
    )

OPERATOR = "op-" + "u" * 29
READER = "ro-" + "v" * 29
CSRF = {"X-Durable-Request": "1"}
TIMEOUT_MS = 15_000


@dataclass
class Ui:
    store: RedisStore
    open: ServerProc
    secured: ServerProc
    browser: Any
    shots: Path
    console: list[str] = field(default_factory=list)

    def page(self, server: ServerProc | None = None, token: str | None = None) -> Any:
        """A fresh tab (its own sessionStorage) at 1280x800; page errors are collected."""
        context = self.browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.on("pageerror", lambda exc: self.console.append(f"pageerror: {exc}"))
        page.on(
            "console",
            lambda msg: (
                self.console.append(f"{msg.type}: {msg.text}")
                if msg.type == "error" and "Failed to load resource" not in msg.text
                else None
            ),
        )
        if token is not None:
            assert server is not None
            page.goto(server.url + "/workers")
            page.fill("#token", token)
            page.click("#token-form button[type=submit]")
            page.wait_for_selector("#token-state.ok")
        return page

    def shot(self, page: Any, name: str) -> Path:
        path = self.shots / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        print(f"screenshot: {path}")
        return path


@pytest.fixture(scope="module")
def ui(durable_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:
    flush_database(durable_redis_url)
    out = tmp_path_factory.mktemp("ui")
    shots = out / "screenshots"
    shots.mkdir()
    store = RedisStore(durable_redis_url)
    # a type no worker serves is parked after the grace: short here, the blocked-run flow needs it
    worker = spawn_worker(durable_redis_url, extra=("--unknown-type-grace", "1"))
    servers: list[ServerProc] = []
    playwright = sync_api.sync_playwright().start()
    browser = None
    try:
        servers.append(ServerProc(durable_redis_url, out / "open.log"))
        env = {"DURABLE_SERVER_TOKENS": f"operator:{OPERATOR},read:{READER}"}
        servers.append(ServerProc(durable_redis_url, out / "secured.log", env=env))
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        wait_for(lambda: store.live_workers(), timeout=30)
        ui = Ui(store, servers[0], servers[1], browser, shots)
        yield ui
        assert not ui.console, ui.console
    finally:
        if browser is not None:
            browser.close()
        playwright.stop()
        for server in servers:
            server.stop()
        stop(worker)
        store.close()


def _id(name: str) -> str:
    return f"ui-{name}-{uuid.uuid4().hex[:6]}"


def _start(ui: Ui, workflow: str, *args: Any, workflow_id: str | None = None) -> str:
    with ui.open.client(**CSRF) as c:
        resp = c.post(
            "/api/v1/workflows",
            json={"type": workflow, "id": workflow_id or _id(workflow.lower()), "args": list(args)},
        )
        assert resp.status_code == 201, resp.text
        return resp.json()["workflow_id"]


def _waits_for_signal(ui: Ui, workflow_id: str) -> None:
    with ui.open.client() as c:
        wait_for(
            lambda: any(
                p["kind"] == "signal" for p in c.get(f"/api/v1/workflows/{workflow_id}").json()["pending"]
            ),
            timeout=30,
        )


def _confirm(page: Any, **fields: str) -> None:
    page.wait_for_selector("#confirm[open]")
    for name, value in fields.items():
        page.fill(f"#confirm-fields [name={name}]", value)
    page.click("#confirm-yes")


def test_runs_list_shows_runs_counts_and_a_blocked_reason(ui: Ui) -> None:
    waiter = _start(ui, "Waiter", 60)
    blocked = WorkflowStub.make("UiNoSuchType", id=_id("blocked"), store=ui.store).start()
    # At once no live worker defines the type; once the grace passes, its task is parked.
    wait_for(lambda: (b := blocked.blocked()) is not None and b.kind == "unknown_type", timeout=30)
    page = ui.page()
    page.goto(ui.open.url + "/")
    page.wait_for_selector(f"#runs tr[data-id='{waiter}']")
    row = page.locator(f"#runs tr[data-id='{blocked.id}']")
    assert "blocked" in row.locator(".badge").inner_text()
    reason = page.locator("#runs tr.blocked-reason").first.inner_text()
    assert "unknown_type" in reason and "UiNoSuchType" in reason
    page.wait_for_selector("#counts .chip.total b")
    assert int(page.locator("#counts .chip.total b").inner_text()) >= 2
    ui.shot(page, "runs")

    page.select_option("#filters select[name=status]", "blocked")
    sync_api.expect(page.locator("#runs tbody tr[data-id]")).to_have_count(1)
    assert page.locator("#runs tbody tr[data-id]").get_attribute("data-id") == blocked.id
    assert "status=blocked" in page.url

    page.click(f"#runs tr[data-id='{blocked.id}'] a")
    page.wait_for_selector("#blocked:not([hidden])")
    assert "serves workflow type 'UiNoSuchType'" in page.inner_text(
        "#blocked"
    ) and "Repair" in page.inner_text("#blocked")
    ui.shot(page, "run-blocked")
    page.context.close()
    with ui.open.client(**CSRF) as c:
        c.post(f"/api/v1/workflows/{waiter}/terminate")
        c.post(f"/api/v1/workflows/{blocked.id}/terminate")


def test_run_page_says_no_worker_serves_the_queue_an_activity_waits_on(ui: Ui) -> None:
    wid = _start(ui, "PaysOnBilling", 41)  # its activity goes to 'billing': no worker there
    page = ui.page()
    page.goto(f"{ui.open.url}/workflows/{wid}")
    page.wait_for_selector("#blocked:not([hidden])", timeout=30_000)
    banner = page.inner_text("#blocked")
    assert "no live worker serves queue 'billing', where activity 'add' (id 1) waits" in banner
    assert "moves on by itself" in banner
    row = page.locator("#pending tbody tr.current").first.inner_text()
    assert "attempt 1: not begun: queued on 'billing', waiting for a worker" in row

    # Every reason found on read goes by itself once its cause does: the page offers no repair
    # for a starved queue either (it said "Fix the cause ..., then Repair re-queues the run").
    def starved(route: Any) -> None:
        body = route.fetch().json()
        body.update(blocked_kind="starved_queue", blocked="its workers' threads are all held")
        route.fulfill(json=body)

    page.route(f"**/api/v1/workflows/{wid}", starved)
    page.reload()
    page.wait_for_selector("#blocked:not([hidden])", timeout=30_000)
    banner = page.inner_text("#blocked")
    assert "Blocked (starved_queue)" in banner and "no repair needed" in banner and "Repair" not in banner
    page.context.close()
    with ui.open.client(**CSRF) as c:
        c.post(f"/api/v1/workflows/{wid}/terminate")


def test_run_page_says_where_its_pending_workflow_task_is(ui: Ui) -> None:
    """A live worker of the queue that reads nothing (registered here, no loop): the run's task
    waits on its queue, and the page says so (it showed "pending" and nothing else)."""
    idle = Worker(ui.store, queues=["ui-idle"], concurrency=1)
    idle._ensure_groups()
    idle.membership.join()
    try:
        with ui.open.client(**CSRF) as c:
            resp = c.post(
                "/api/v1/workflows",
                json={"type": "Waiter", "id": _id("idle"), "args": [0.01], "queue": "ui-idle"},
            )
            assert resp.status_code == 201, resp.text
        wid = resp.json()["workflow_id"]
        page = ui.page()
        page.goto(f"{ui.open.url}/workflows/{wid}")
        said = page.wait_for_selector("#workflow-task").inner_text()
        assert said == "its workflow task waits on queue 'ui-idle' for a worker (backlog 1)"
        page.context.close()
        with ui.open.client(**CSRF) as c:
            c.post(f"/api/v1/workflows/{wid}/terminate")
    finally:
        idle.membership.leave()


def test_a_closed_runs_last_waits_are_not_shown_as_coming(ui: Ui) -> None:
    wid = _start(ui, "Waiter", 3600)  # a timer due in an hour
    with ui.open.client(**CSRF) as c:
        wait_for(lambda: c.get(f"/api/v1/workflows/{wid}").json()["pending"], timeout=30)
        assert c.post(f"/api/v1/workflows/{wid}/terminate").status_code == 200
    page = ui.page()
    page.goto(f"{ui.open.url}/workflows/{wid}")
    page.wait_for_selector("#run-status .badge.terminated")
    assert page.inner_text("#pending-title") == "Pending when it closed (nothing waits now)"
    row = page.locator("#pending tbody tr").first
    assert row.inner_text().startswith("timer") and "(in " not in row.inner_text()
    assert page.locator("#pending tbody tr.current").count() == 0
    page.context.close()


def test_run_page_shows_a_signal_no_decision_took_yet(ui: Ui) -> None:
    """A run no worker serves (its queue has none) showed nothing of the signals sent to it."""
    wid = _id("undecided")
    with ui.open.client(**CSRF) as c:
        body = {"type": "Everything", "id": wid, "args": [1], "queue": "nobody-serves"}
        assert c.post("/api/v1/workflows", json=body).status_code == 201
        assert c.post(f"/api/v1/workflows/{wid}/signal/approve", json={"args": ["x"]}).status_code < 300
    page = ui.page()
    page.goto(f"{ui.open.url}/workflows/{wid}")
    received = page.locator("#pending tbody tr.received")
    received.wait_for()
    assert "approve" in received.inner_text() and "x1, not yet decided" in received.inner_text()
    page.context.close()


def test_large_payloads_are_shown_only_when_opened_and_cut(ui: Ui) -> None:
    """Every event's data was in the page at once: 73 events with 1.5 MB results made a 70 MB
    page that took 27 s to show. Written when its row is opened; payloads at most 100,000
    characters, the rest named in the API."""
    wid = _start(ui, "Waiter", 0.01)
    _waits_for_signal(ui, wid)
    big = "x" * 300_000
    with ui.open.client(**CSRF) as c:
        assert c.post(f"/api/v1/workflows/{wid}/signal/go", json={"args": [big]}).status_code < 300
        wait_for(lambda: c.get(f"/api/v1/workflows/{wid}").json()["status"] == "completed", timeout=30)
    page = ui.page()
    page.goto(f"{ui.open.url}/workflows/{wid}")
    row = page.locator("#history tbody tr", has_text="WorkflowCompleted")
    row.wait_for()
    # The result is cut, the events' payloads not in the page until opened (it held ~900 KB).
    assert "KB more: GET /api/v1/workflows/" in page.locator("#outcome").inner_text()
    assert page.evaluate("document.body.innerHTML.length") < 250_000
    row.locator("summary").click()
    shown = row.locator("pre.json")
    wait_for(lambda: "KB more" in shown.inner_text(), timeout=10)
    assert 100_000 <= len(shown.inner_text()) < 101_000
    page.context.close()


def test_run_page_timeline_then_a_signal_from_the_ui_completes_it(ui: Ui) -> None:
    wid = _start(ui, "Everything", 10)
    _waits_for_signal(ui, wid)
    with ui.open.client(**CSRF) as c:  # a misspelt signal: received, and nothing awaits it
        assert c.post(f"/api/v1/workflows/{wid}/signal/aprove", json={"args": ["typo"]}).status_code < 300
        wait_for(lambda: c.get(f"/api/v1/workflows/{wid}").json()["signals_buffered"] == {"aprove": 1})
    page = ui.page()
    page.goto(f"{ui.open.url}/workflows/{wid}")
    page.wait_for_selector("#timeline svg rect.bar.current")  # the signal wait, highlighted
    received = page.locator("#pending tbody tr.received").inner_text()
    assert "aprove" in received and "x1, not awaited yet" in received
    lanes = page.locator("#timeline svg text.lane").all_text_contents()
    assert any(t.startswith("add #") for t in lanes) and "timer #2" in lanes and "signal approve" in lanes
    assert page.locator("#pending tbody tr.current").first.inner_text().startswith("signal")
    assert page.locator("#history tbody tr").count() >= 8
    ui.shot(page, "run-waiting")

    page.click("#actions button[data-action=signal]")
    _confirm(page, name="approve", args='["alice"]')
    page.wait_for_selector("#flash .msg.ok")
    for _ in range(2):
        page.click("#actions button[data-action=signal]")
        _confirm(page, name="bump", args="[1]")
    page.wait_for_selector("#run-status .badge.completed", timeout=30_000)
    assert '"approval": "alice"' in page.inner_text("#outcome")
    assert page.locator("#timeline svg rect.bar.current").count() == 0
    assert page.locator("#children tbody a").first.inner_text() == f"{wid}/8"
    page.locator("#history tbody tr").nth(0).locator("summary").click()
    first = page.locator("#history tbody tr").nth(0)
    wait_for(lambda: '"args"' in first.locator("pre").inner_text(), timeout=10)  # written once opened
    ui.shot(page, "run-completed")

    page.click("#children tbody a")  # a child's id holds "/": its page and API calls work
    page.wait_for_selector("#run-status .badge.completed")
    assert page.inner_text("#run-id") == f"{wid}/8"
    assert page.locator("#children tbody tr").first.inner_text().startswith("parent")
    page.context.close()


def test_a_timer_set_for_ages_shows_no_impossible_date(ui: Ui) -> None:
    """A wait past year 9999 is said as the CLI says it (the page once showed year 33715)."""
    wid = _start(ui, "Waiter", 1e12)  # about 31,700 years
    with ui.open.client() as c:
        wait_for(
            lambda: any(p["kind"] == "timer" for p in c.get(f"/api/v1/workflows/{wid}").json()["pending"]),
            timeout=30,
        )
    page = ui.page()
    page.goto(f"{ui.open.url}/workflows/{wid}")
    row = page.locator("#pending tbody tr.current").first
    row.wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[0] == "timer" and cells[3] == "after 9999-12-31", cells
    page.context.close()


def test_an_overdue_deadline_says_how_long_ago(ui: Ui) -> None:
    """A timer due 55 s ago (no worker to fire it) showed "(in 0 ms)"; describe says "ago"."""
    wid = _start(ui, "Waiter", 3600)
    with ui.open.client() as c:
        wait_for(
            lambda: any(p["kind"] == "timer" for p in c.get(f"/api/v1/workflows/{wid}").json()["pending"]),
            timeout=30,
        )
    page = ui.page()

    def overdue(route: Any) -> None:  # as the run reads with no worker left to fire its timer
        body = route.fetch().json()
        for step in body["pending"]:
            if step["kind"] == "timer":
                step["deadline"] = int(time.time() * 1000) - 55_000
        route.fulfill(json=body)

    page.route(f"**/api/v1/workflows/{wid}", overdue)
    page.goto(f"{ui.open.url}/workflows/{wid}")
    row = page.locator("#pending tbody tr.current").first
    row.wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[0] == "timer" and re.search(r"\(5\d(\.\d)? s ago, overdue\)", cells[3]), cells
    page.context.close()
    with ui.open.client(**CSRF) as c:
        c.post(f"/api/v1/workflows/{wid}/terminate")


def test_failed_attempts_show_errors_and_cancel_from_the_ui(ui: Ui, tmp_path: Path) -> None:
    failing = _start(ui, "Failing", str(tmp_path / "flaky.log"), 5)
    saga = _start(ui, "Saga", str(tmp_path / "saga.log"))
    page = ui.page()
    page.goto(f"{ui.open.url}/workflows/{failing}")
    page.wait_for_selector("#attempts tbody tr.outcome-failed")
    assert page.locator("#attempts tbody tr.outcome-retry").count() == 2
    assert "flaky failure 3" in page.inner_text("#attempts")
    page.locator("#attempts tbody tr.outcome-failed summary").click()
    assert "Traceback" in page.locator("#attempts tbody tr.outcome-failed pre.tb").inner_text()
    assert page.locator("#timeline svg rect.bar.retry").count() == 2
    assert page.locator("#timeline svg rect.bar.failed").count() >= 1
    ui.shot(page, "run-retries")

    _waits_for_signal(ui, saga)
    page.goto(f"{ui.open.url}/workflows/{saga}")
    page.wait_for_selector("#timeline svg rect.bar.current")
    page.click("#actions button[data-action=cancel]")
    _confirm(page, reason="operator from the UI")
    page.wait_for_selector("#run-status .badge.cancelled", timeout=30_000)
    assert page.locator("#actions button[data-action=terminate]").is_disabled()
    ui.shot(page, "run-cancelled")
    page.context.close()


def test_an_earlier_run_of_an_id_opens_from_the_runs_list(ui: Ui) -> None:
    """Both rows of a reused id linked to its current run: the earlier (failed, terminated) one
    could not be opened, its failure nowhere in the UI."""
    wid = _start(ui, "Waiter", 60)
    first = WorkflowStub.load(wid, store=ui.store)
    first_run = first.run_id
    first.terminate("first try")
    _start(ui, "Waiter", 60, workflow_id=wid)  # the id again (allow_duplicate)
    page = ui.page()
    page.goto(ui.open.url + "/?id_prefix=" + wid)
    page.wait_for_selector(f"#runs a[href$='run_id={first_run}']")
    page.click(f"#runs a[href$='run_id={first_run}']")
    page.wait_for_selector("#run-status .badge.terminated")
    note = page.wait_for_selector("#earlier:not([hidden])")
    assert f"An earlier run of {wid} (run {first_run}); the current run is" in note.inner_text()
    assert page.locator("#actions button[data-action=terminate]").is_disabled()  # they act on the current
    assert first_run in page.inner_text("#facts")
    page.context.close()
    WorkflowStub.load(wid, store=ui.store).terminate("test done")


def test_read_only_token_sees_runs_but_actions_are_refused(ui: Ui) -> None:
    wid = _start(ui, "Waiter", 60)
    anonymous = ui.page()
    anonymous.goto(ui.secured.url + "/")
    anonymous.wait_for_selector("#runs td.error")
    assert "unauthorized" in anonymous.inner_text("#runs") and "token" in anonymous.inner_text("#token-state")
    # A token the server does not know is said so at once (it said "token set").
    anonymous.fill("#token", "no-such-token")
    anonymous.click("#token-form button[type=submit]")
    assert anonymous.wait_for_selector("#token-state.bad").inner_text() == "token not accepted: paste another"
    anonymous.context.close()

    page = ui.page(ui.secured, READER)
    page.goto(ui.secured.url + "/")
    page.wait_for_selector(f"#runs tr[data-id='{wid}']")
    page.goto(f"{ui.secured.url}/workflows/{wid}")
    page.wait_for_selector("#run-status .badge")
    page.click("#actions button[data-action=terminate]")
    assert "operator" in page.inner_text("#confirm-role")
    _confirm(page, reason="should not happen")
    error = page.wait_for_selector("#flash .msg.error")
    assert "forbidden" in error.inner_text()
    # Refused again and again: the errors stayed over the action buttons (a click timed out on
    # them, intercepted) and piled up until each was closed by hand.
    for _ in range(3):
        page.click("#actions button[data-action=terminate]", timeout=5_000)
        _confirm(page, reason="should not happen")
    page.wait_for_timeout(1_000)
    assert page.locator("#flash .msg.error").count() == 3
    ui.shot(page, "run-refused")
    page.context.close()
    with ui.open.client() as c:
        assert c.get(f"/api/v1/workflows/{wid}").json()["status"] != "terminated"
    with ui.secured.client(OPERATOR) as c:
        assert c.post(f"/api/v1/workflows/{wid}/terminate").status_code == 200


def test_workers_schedules_dead_letters_and_start_pages(ui: Ui) -> None:
    # A dead letter of this test's own (the worker parks a type it lacks after its 1 s grace).
    parked = WorkflowStub.make("UiNoSuchType", id=_id("parked"), store=ui.store).start().id
    wait_for(lambda: any(d["workflow_id"] == parked for d in ui.store.dead_letters()), timeout=30)
    ScheduleHandle.create("ui-sched", Schedule(workflow="Waiter", args=(60,), every="1h"), store=ui.store)
    page = ui.page()
    page.goto(ui.open.url + "/workers")
    page.wait_for_selector("#workers tbody td:has-text('Everything')")
    cells = page.locator("#workers tbody tr").first.locator("td").all_inner_texts()
    assert cells[6].isdigit() and int(cells[6]) > 0, cells  # its activity threads, none held
    assert page.locator("#problem").is_hidden()  # Redis takes writes: no banner
    assert page.inner_text("#retention") == "3d"  # the namespace's, as `durable workers` says it
    # An activity of this test's own waits on 'billing', which no worker serves: listed, in red.
    _start(ui, "PaysOnBilling", 7)
    page.reload()
    page.wait_for_selector("#queues tbody tr.is-blocked:has-text('billing')")
    rows = {r.split("\t")[0]: r for r in page.locator("#queues tbody tr").all_inner_texts()}
    assert "none serves it" in rows["billing"] and "none serves it" not in rows["default"], rows
    assert "no live worker takes them" in rows["billing"] and "no live worker takes" not in rows["default"], (
        rows
    )
    ui.shot(page, "workers")
    # A worker that is stopping (its registry entry says since when) gets a badge saying so.
    now = ui.store.server_time_ms()
    entry = WorkerInfo(name="ui-stopping-1", queues=("ui-stopping",), started=now, seen=now, stopping=now)
    # One draining (its build's pinned runs left, then it stops) says how many are left.
    drainer = WorkerInfo(
        name="ui-draining-1",
        build="old",
        queues=("ui-stopping",),
        started=now,
        seen=now,
        draining=now,
        pinned_left=3,
    )
    ui.store.register_worker(entry)
    ui.store.register_worker(drainer)
    try:
        page.reload()
        page.wait_for_selector("#workers tbody tr:has-text('ui-stopping-1') .badge.stopping")
        badge = page.wait_for_selector("#workers tbody tr:has-text('ui-draining-1') .badge.draining")
        assert badge.inner_text() == "draining: 3 left"
        # Neither has a Drain button (already stopping or draining); a serving worker has one.
        assert page.locator("#workers tbody tr:has-text('ui-draining-1') button").count() == 0
        serving = WorkerInfo(
            name="ui-drainable-1", build="b1", queues=("ui-stopping",), started=now, seen=now
        )
        ui.store.register_worker(serving)
        page.reload()
        page.click("#workers tbody tr:has-text('ui-drainable-1') button:has-text('Drain')")
        _confirm(page)
        page.wait_for_selector("#flash .msg.ok:has-text('ui-drainable-1: asked to drain')")
        # The ask waits in Redis for that worker's next heartbeat (this entry has no process).
        assert ui.store.register_worker(serving) is True
    finally:
        ui.store.unregister_worker(entry.name)
        ui.store.unregister_worker(drainer.name)
        ui.store.unregister_worker("ui-drainable-1")

    ended = ScheduleHandle.create(
        "ui-ended",
        Schedule(workflow="Sequence", args=[1], every="10s", end_at="2020-01-01T00:00:00Z"),
        store=ui.store,
    )
    page.goto(ui.open.url + "/schedules")
    page.wait_for_selector("#schedules tr[data-id=ui-sched]")
    # The API's state word, as the CLI says it (an ended schedule showed "running").
    assert page.inner_text("#schedules tr[data-id=ui-ended] .schedule-state") == "ended (end_at passed)"
    assert page.inner_text("#schedules tr[data-id=ui-sched] .schedule-state") == "active"
    ended.delete()
    page.click("#schedules tr[data-id=ui-sched] button:has-text('Pause')")
    _confirm(page, note="maintenance")
    page.wait_for_selector("#schedules tr[data-id=ui-sched] button:has-text('Unpause')")
    page.click("#schedules tr[data-id=ui-sched] button:has-text('Trigger')")
    _confirm(page)
    page.wait_for_selector("#flash .msg.ok a")
    triggered = page.locator("#flash .msg.ok a").inner_text()
    assert triggered.startswith("ui-sched-")
    ui.shot(page, "schedules")
    # A schedule whose run cannot move: its row says why (it said only "1 running").
    stuck = ScheduleHandle.create("ui-stuck", Schedule(workflow="UiNoSuchType", every="1h"), store=ui.store)
    stuck.trigger()
    blocked = page.wait_for_selector("#schedules tr[data-id=ui-stuck] .blocked-run", timeout=30_000)
    assert "UiNoSuchType" in blocked.inner_text(), blocked.inner_text()

    page.goto(ui.open.url + "/dead-letters")
    page.wait_for_selector("#dead tbody td.bad")
    assert "UiNoSuchType" in page.inner_text("#dead")
    ui.shot(page, "dead-letters")

    page.goto(ui.open.url + "/start")
    page.fill("#start input[name=type]", "Sequence")
    page.fill("#start input[name=id]", started := _id("start"))
    # Arguments mistyped, then mended: the form went on refusing the text it no longer had.
    page.fill("#start textarea[name=args]", "[4")
    page.click("#start button[type=submit]")
    assert "a JSON array" in page.eval_on_selector("#start textarea[name=args]", "e => e.validationMessage")
    page.fill("#start textarea[name=args]", "[4]")
    page.click("#start button[type=submit]")
    _confirm(page)
    page.wait_for_selector("#flash .msg.ok a")
    ui.shot(page, "start")
    page.click("#flash .msg.ok a")
    page.wait_for_selector("#run-status .badge.completed", timeout=30_000)
    assert page.inner_text("#outcome").strip() == "6"
    page.context.close()
    with ui.open.client(**CSRF) as c:
        c.post(f"/api/v1/workflows/{triggered}/terminate")
    ScheduleHandle("ui-sched", store=ui.store).delete()
    for run in stuck.describe().running:
        WorkflowStub.load(run["workflow_id"], store=ui.store).terminate("test over")
    assert started
    # Deleted from its row (the API had no route for it).
    page = ui.page()
    page.goto(ui.open.url + "/schedules")
    page.click("#schedules tr[data-id=ui-stuck] button:has-text('Delete')")
    _confirm(page)
    page.wait_for_selector("#flash .msg.ok:has-text('ui-stuck: deleted')")
    page.wait_for_selector("#schedules tr[data-id=ui-stuck]", state="detached")
    assert "ui-stuck" not in [s.id for s in ScheduleHandle.list(store=ui.store)]
    page.context.close()


def test_a_page_that_cannot_refresh_says_it_is_out_of_date(ui: Ui, fresh_redis: Any, tmp_path: Path) -> None:
    """With Redis down, a run page went on showing its last status as if current (every refresh
    got a 503): a banner says since when it is not refreshed, and goes once a refresh works."""
    server = ServerProc(fresh_redis.url, tmp_path / "server.log")
    try:
        store = RedisStore(fresh_redis.url)
        run = WorkflowStub.make("Waiter", id=_id("stale"), store=store).start(60).id
        store.close()
        page = ui.page()
        page.goto(f"{server.url}/workflows/{run}")
        page.wait_for_selector("#run-status .badge")
        pid = fresh_redis.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            banner = page.wait_for_selector("#stale", timeout=30_000)
            assert banner.inner_text().startswith("Not refreshed since "), banner.inner_text()
        finally:
            os.kill(pid, signal.SIGCONT)
        page.wait_for_selector("#stale", state="detached", timeout=30_000)
        page.context.close()
    finally:
        server.stop()


def test_runs_page_terminates_the_runs_its_where_filter_selects(ui: Ui) -> None:
    """With a Where filter the runs page offers the batch actions: counted and confirmed, then
    every open run it selects is terminated (POST /api/v1/batch/terminate)."""
    ids = [
        WorkflowStub.make("Waiter", id=_id("bulk"), queue="ui-bulk", store=ui.store).start(60).id
        for _ in range(3)
    ]
    kept = _start(ui, "Waiter", 60)  # queue default: not selected
    # Another type on that queue: the Type filter leaves it out of the list, so out of the batch
    # too (the batch sent the Where filter alone, and terminated runs the list did not show).
    other = WorkflowStub.make("UiOther", id=_id("bulk-other"), queue="ui-bulk", store=ui.store).start().id
    page = ui.page()
    page.goto(ui.open.url + "/")
    assert page.locator("#batch").is_hidden()  # no Where filter: no batch actions
    page.fill("#filters input[name=where]", "queue = 'ui-bulk'")
    page.fill("#filters input[name=type]", "Waiter")
    page.click("#filters button[type=submit]")
    page.wait_for_selector("#batch:not([hidden])")
    page.click("#batch button[data-action=terminate]")
    page.wait_for_selector("#confirm[open]")
    said = page.inner_text("#confirm-text")
    assert "3 open run(s) match (queue = 'ui-bulk') and type = 'Waiter'" in said, said
    _confirm(page, reason="ui bulk")
    done = page.wait_for_selector("#flash .msg.ok:has-text('Terminate matching runs')")
    assert "3 run(s)" in done.inner_text()
    ui.shot(page, "runs-batch-terminated")
    page.context.close()
    for workflow_id in ids:
        assert WorkflowStub.load(workflow_id, store=ui.store).status() == "terminated"
    assert WorkflowStub.load(kept, store=ui.store).status() != "terminated"
    assert WorkflowStub.load(other, store=ui.store).status() == "pending"
    WorkflowStub.load(kept, store=ui.store).terminate("test done")
    WorkflowStub.load(other, store=ui.store).terminate("test done")


def test_workers_page_warns_of_a_redis_that_can_lose_data(ui: Ui, fresh_redis: Any, tmp_path: Path) -> None:
    """A private Redis with an evicting policy under a limit and no AOF: the workers page shows
    both warnings in a banner (as ``durable workers`` does); the shared one shows none."""
    client = redis.Redis.from_url(fresh_redis.url)
    client.config_set("maxmemory", 2**30)
    client.config_set("maxmemory-policy", "allkeys-lru")
    client.config_set("appendonly", "no")
    server = ServerProc(fresh_redis.url, tmp_path / "server.log")
    try:
        page = ui.page()
        page.goto(server.url + "/workers")
        banner = page.wait_for_selector("#warnings:not([hidden])")
        lines = banner.inner_text().splitlines()
        assert [line.split(" (")[0] for line in lines] == [
            "Warning: Redis evicts keys at its maxmemory",
            "Warning: Redis keeps no append-only file",
        ], lines
        assert "maxmemory-policy noeviction" in lines[0] and "appendonly yes" in lines[1]
        ui.shot(page, "workers-redis-warnings")
        page.goto(ui.open.url + "/workers")
        page.wait_for_selector("#workers tbody td:has-text('Everything')")
        assert page.locator("#warnings").is_hidden()
        page.context.close()
    finally:
        server.stop()
        client.config_set("maxmemory", 0)
        client.close()
