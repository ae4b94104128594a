"""``durable server``: the HTTP API, end to end.

A real server process (two: one open on loopback, one with tokens and a hook secret) on
the test Redis with a real ``durable worker`` process, driven with an HTTP client.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from procs import ROOT, spawn_worker, stop
from server_procs import ServerProc
from waiting import wait_for

from durable import Schedule, ScheduleHandle, WorkflowStub
from durable.store.connect import flush_database
from durable.store.redis_store import RedisStore
from workers.server import CODES, ENDPOINTS, sign

OPERATOR = "op-" + "o" * 29
READER = "ro-" + "r" * 29
HOOK_SECRET = "hook-secret-for-tests"
CSRF = {"X-Durable-Request": "1"}


@dataclass
class Api:
    store: RedisStore
    open: ServerProc
    secured: ServerProc


@pytest.fixture(scope="module")
def api(durable_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    flush_database(durable_redis_url)
    logs = tmp_path_factory.mktemp("server-logs")
    store = RedisStore(durable_redis_url)
    worker = spawn_worker(durable_redis_url)
    servers: list[ServerProc] = []
    try:
        servers.append(ServerProc(durable_redis_url, logs / "open.log"))
        env = {
            "DURABLE_SERVER_TOKENS": f"operator:{OPERATOR},read:{READER}",
            "DURABLE_SERVER_HOOK_SECRET": HOOK_SECRET,
        }
        servers.append(ServerProc(durable_redis_url, logs / "secured.log", env=env))
        wait_for(lambda: store.live_workers(), timeout=30)
        yield Api(store, servers[0], servers[1])
    finally:
        for server in servers:
            server.stop()
        stop(worker)
        store.close()


def _id(name: str) -> str:
    return f"srv-{name}-{uuid.uuid4().hex[:8]}"


def _error(resp: httpx.Response, status: int, code: str) -> str:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    assert CODES[code][0] == status
    return body["error"]["message"]


def _status(client: httpx.Client, workflow_id: str, want: str) -> dict:
    return wait_for(
        lambda: (d := client.get(f"/api/v1/workflows/{workflow_id}").json()).get("status") == want and d,
        timeout=30,
    )


def test_health_and_openapi(api: Api) -> None:
    with api.open.client() as c:
        assert c.get("/healthz").json() == {"status": "ok", "warnings": []}
        doc = c.get("/api/v1/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    for endpoint in ENDPOINTS:
        assert endpoint.method.lower() in doc["paths"][endpoint.path]
    assert doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"][
        "enum"
    ] == sorted(CODES)


def test_start_signal_describe_history_list(api: Api) -> None:
    wid = _id("waiter")
    with api.open.client(**CSRF) as c:
        resp = c.post("/api/v1/workflows", json={"type": "Waiter", "id": wid, "args": [0.01]})
        assert resp.status_code == 201, resp.text
        started = resp.json()
        assert started["workflow_id"] == wid and started["run_id"] and started["warning"] is None
        unserved = c.post(
            "/api/v1/workflows", json={"type": "Waiter", "args": [0.01], "queue": "nobody"}
        ).json()
        assert unserved["warning"].startswith("no live worker on queue 'nobody'"), unserved
        c.post(f"/api/v1/workflows/{unserved['workflow_id']}/terminate", json={})
        wait_for(
            lambda: any(p["kind"] == "signal" for p in c.get(f"/api/v1/workflows/{wid}").json()["pending"])
        )
        assert c.post(f"/api/v1/workflows/{wid}/signal/go", json={"args": ["ready"]}).status_code == 200
        info = _status(c, wid, "completed")
        assert info["outcome"]["result"] == "ready" and info["run_id"] == started["run_id"]
        history = c.get(f"/api/v1/workflows/{wid}/history").json()
        types = [e["type"] for e in history["events"]]
        assert types[0] == "WorkflowStarted" and types[-1] == "WorkflowCompleted"
        assert history["events"][0]["data"]["args"] == [0.01]
        signal = next(e for e in history["events"] if e["type"] == "SignalReceived")
        assert signal["data"]["payload"] == ["ready"]
        page = c.get(f"/api/v1/workflows/{wid}/history", params={"limit": 2}).json()
        assert [e["seq"] for e in page["events"]] == [1, 2] and page["next_after"] == 2
        rest = c.get(f"/api/v1/workflows/{wid}/history", params={"after": 2}).json()
        assert [e["seq"] for e in rest["events"]] == list(range(3, len(types) + 1))

        listed = c.get("/api/v1/workflows", params={"type": "Waiter", "id_prefix": wid}).json()
        assert [r["workflow_id"] for r in listed["workflows"]] == [wid]
        assert listed["workflows"][0]["status"] == "completed" and "snapshot" not in listed["workflows"][0]
        assert (
            c.get("/api/v1/workflows", params={"status": "running", "id_prefix": wid}).json()["workflows"]
            == []
        )
        created = listed["workflows"][0]["created"]
        assert (
            c.get("/api/v1/workflows", params={"since": created + 1, "id_prefix": wid}).json()["workflows"]
            == []
        )
        assert c.get("/api/v1/workflows", params={"until": created, "id_prefix": wid}).json()["workflows"]


def test_an_earlier_run_of_a_continue_as_new_chain(api: Api) -> None:
    wid = _id("looper")
    with api.open.client(**CSRF) as c:
        first = c.post("/api/v1/workflows", json={"type": "Looper", "id": wid, "args": [1, 0]}).json()[
            "run_id"
        ]
        last = _status(c, wid, "completed")["run_id"]
        assert last != first
        old = c.get(f"/api/v1/workflows/{wid}", params={"run_id": first}).json()
        assert old["run_id"] == first and old["outcome"]["status"] == "continued"
        assert old["outcome"]["continued_as"] == last
        events = c.get(f"/api/v1/workflows/{wid}/history", params={"run_id": first}).json()
        assert events["run_id"] == first and events["events"][-1]["type"] == "WorkflowContinuedAsNew"
        assert "has no run 'nope'" in _error(
            c.get(f"/api/v1/workflows/{wid}/history", params={"run_id": "nope"}), 404, "not_found"
        )


def test_start_with_policies_and_signal_with_start(api: Api) -> None:
    wid = _id("policy")
    with api.open.client(**CSRF) as c:
        body = {"type": "Waiter", "id": wid, "args": [0.01], "signal": {"name": "go", "args": ["early"]}}
        resp = c.post("/api/v1/workflows", json={**body, "id_reuse_policy": "reject_duplicate"})
        assert resp.status_code == 201, resp.text
        assert _status(c, wid, "completed")["outcome"]["result"] == "early"  # the signal came with the start
        again = c.post(
            "/api/v1/workflows",
            json={"type": "Waiter", "id": wid, "args": [0.01], "id_reuse_policy": "reject_duplicate"},
        )
        _error(again, 409, "already_started")
        # The server has the app's code: a start whose arguments its handle() would refuse is
        # refused now, naming the signature, and nothing is started.
        unfit = _error(
            c.post("/api/v1/workflows", json={"type": "Waiter", "id": _id("unfit")}), 422, "invalid_argument"
        )
        assert "Waiter.handle takes (seconds: float): missing a required argument: 'seconds'" in unfit
        bad = c.post(
            "/api/v1/workflows", json={"type": "Waiter", "id": _id("bad"), "id_reuse_policy": "never"}
        )
        assert "allow_duplicate" in _error(bad, 422, "invalid_argument")  # the message lists the valid ones


def test_query_and_hook_resumed_by_signed_webhook(api: Api) -> None:
    wid = _id("hooked")
    with api.secured.client(OPERATOR) as c:
        assert c.post("/api/v1/workflows", json={"type": "Hooked", "id": wid}).status_code == 201
        token = wait_for(
            lambda: c.post(f"/api/v1/workflows/{wid}/query/hook_token", json={}).json().get("result")
        )
        created = next(
            e
            for e in c.get(f"/api/v1/workflows/{wid}/history").json()["events"]
            if e["type"] == "HookCreated"
        )
        assert token not in json.dumps(created)

    body = json.dumps({"paid": 42}).encode()
    headers = {"content-type": "application/json"}
    with api.secured.client() as hook:
        _error(hook.post(f"/api/v1/hooks/{token}", content=body, headers=headers), 401, "bad_signature")
        # Non-standard JSON is refused as on every other route (it resumed the run with {"$float": "inf"}).
        for odd in (b'{"paid": Infinity}', b'{"paid": 1e400}', b"[NaN]"):
            oddly = {**headers, "X-Durable-Signature": sign(HOOK_SECRET, odd)}
            _error(hook.post(f"/api/v1/hooks/{token}", content=odd, headers=oddly), 400, "bad_request")
        wrong = {**headers, "X-Durable-Signature": sign("other", body)}
        _error(hook.post(f"/api/v1/hooks/{token}", content=body, headers=wrong), 401, "bad_signature")
        signed = {**headers, "X-Durable-Signature": sign(HOOK_SECRET, body)}
        resp = hook.post(f"/api/v1/hooks/{token}", content=body, headers=signed)
        assert resp.status_code == 200, resp.text
        assert token not in resp.text
        message = _error(
            hook.post(f"/api/v1/hooks/{token}", content=body, headers=signed), 409, "hook_token_unusable"
        )
        assert token not in message
    with api.secured.client(READER) as c:
        assert _status(c, wid, "completed")["outcome"]["result"] == {"paid": 42}
    log = api.secured.log.read_text()
    assert "/api/v1/hooks/***" in log
    for secret in (token, OPERATOR, READER, HOOK_SECRET):
        assert secret not in log


def test_cancel_terminate_and_conflicts(api: Api, tmp_path: Path) -> None:
    saga, waiter = _id("saga"), _id("waiter")
    with api.open.client(**CSRF) as c:
        c.post("/api/v1/workflows", json={"type": "Saga", "id": saga, "args": [str(tmp_path / "saga.log")]})
        c.post("/api/v1/workflows", json={"type": "Waiter", "id": waiter, "args": [60]})
        wait_for(
            lambda: any(p["kind"] == "signal" for p in c.get(f"/api/v1/workflows/{saga}").json()["pending"])
        )
        # A repair of a run that is not blocked does nothing: said, as the CLI says it (the UI said "done").
        repaired = c.post(f"/api/v1/workflows/{saga}/repair").json()
        assert repaired["note"] == "it was not blocked; the extra workflow task is harmless", repaired
        resp = c.post(f"/api/v1/workflows/{saga}/cancel", json={"reason": "operator says"})
        assert resp.status_code == 200 and resp.json()["cancel_requested"] is True
        assert resp.json()["note"] is None  # not blocked: it takes effect at once
        assert _status(c, saga, "cancelled")["outcome"]["error"]["message"]
        assert c.post(f"/api/v1/workflows/{waiter}/terminate", json={"reason": "stop"}).json()["terminated"]
        info = c.get(f"/api/v1/workflows/{waiter}").json()
        assert info["status"] == "terminated" and info["outcome"]["error"]["message"] == "stop"
        _error(c.post(f"/api/v1/workflows/{waiter}/signal/go", json={"args": [1]}), 409, "workflow_closed")
        _error(c.post(f"/api/v1/workflows/{waiter}/terminate"), 409, "workflow_closed")
        _error(c.post(f"/api/v1/workflows/{waiter}/repair"), 409, "workflow_closed")
        again = c.post("/api/v1/workflows", json={"type": "Waiter", "id": saga + "-x", "args": [60]})
        assert again.status_code == 201
        _error(
            c.post("/api/v1/workflows", json={"type": "Waiter", "id": saga + "-x", "args": [1]}),
            409,
            "already_started",
        )
        c.post(f"/api/v1/workflows/{saga}-x/terminate")


def test_bad_input_gets_json_errors(api: Api) -> None:
    with api.open.client(**CSRF) as c:
        _error(c.get("/api/v1/workflows/no-such-run"), 404, "not_found")
        _error(c.get("/api/v1/workflows/no-such-run/history"), 404, "not_found")
        _error(c.post("/api/v1/workflows/no-such-run/signal/go", json={"args": []}), 404, "not_found")
        _error(c.get("/api/v1/nothing-here"), 404, "not_found")
        # A query is replayed by the server itself: its own --app is what to mend.
        unknown = WorkflowStub.make("SrvUnknownType", id=_id("unknown-type"), store=api.store).start()
        said = _error(c.post(f"/api/v1/workflows/{unknown.id}/query/state", json={}), 422, "unknown_type")
        assert "(start the server with --app MODULE)" in said, said
        unknown.terminate("test over")
        misspelt = _error(c.get("/api/v1/workflows", params={"statuss": "failed"}), 422, "invalid_argument")
        assert "unknown query parameter 'statuss' (did you mean 'status'?)" in misspelt, misspelt
        # Percent-escapes of bytes that are not UTF-8 text: refused, not decoded with replacement
        # (a signal named "\ufffd\ufffd\ufffd" went to the run).
        assert "not valid UTF-8" in _error(c.get("/api/v1/workflows/%FF%FE"), 422, "invalid_argument")
        _error(
            c.post("/api/v1/workflows/no-such-run/signal/%ED%A0%80", json={"args": []}),
            422,
            "invalid_argument",
        )
        wrong_method = c.delete("/api/v1/workflows")
        assert "this route takes GET, HEAD, POST" in _error(wrong_method, 405, "method_not_allowed")
        assert wrong_method.headers["allow"] == "GET, HEAD, POST"  # RFC 9110: a 405 names them
        # A POST-only action read with GET is that route's 405, not the describe of a run "u1/cancel".
        action_get = c.get("/api/v1/workflows/u1/cancel")
        assert "this route takes POST" in _error(action_get, 405, "method_not_allowed")
        assert action_get.headers["allow"] == "POST"
        assert "'u1/cancel'" in _error(c.get("/api/v1/workflows/u1%2Fcancel"), 404, "not_found")
        json_headers = {"content-type": "application/json"}
        _error(c.post("/api/v1/workflows", content=b"{not json", headers=json_headers), 400, "bad_request")
        _error(
            c.post("/api/v1/workflows", content=b"type=x", headers={"content-type": "text/plain"}),
            415,
            "unsupported_media_type",
        )
        _error(c.post("/api/v1/workflows", json={"type": "Waiter", "args": "nope"}), 422, "invalid_argument")
        _error(c.post("/api/v1/workflows", json={"type": 5}), 422, "invalid_argument")
        _error(c.post("/api/v1/workflows", json=[1, 2]), 422, "invalid_argument")
        # `null` was "no body" (a signal with no args went through), and drain read no body at all.
        null = c.post("/api/v1/workflows/no-such-run/signal/go", content=b"null", headers=json_headers)
        assert "must be a JSON object" in _error(null, 422, "invalid_argument")
        _error(c.post("/api/v1/workers/w/drain", json={"bogus": 1}), 422, "invalid_argument")
        _error(c.post("/api/v1/workers/w/drain", json=[1]), 422, "invalid_argument")
        _error(c.post("/api/v1/workflows", json={"type": "Waiter", "id": "bad\nid"}), 422, "invalid_argument")
        _error(c.get("/api/v1/workflows", params={"limit": "x"}), 422, "invalid_argument")
        _error(c.get("/api/v1/workflows", params={"limit": 100000}), 422, "invalid_argument")
        _error(c.get("/api/v1/workflows", params={"status": "sleepy"}), 422, "invalid_argument")
        _error(c.get("/api/v1/workflows", params={"before": "yesterday"}), 422, "invalid_argument")
        _error(c.get("/api/v1/workflows", params={"since": "not a time"}), 422, "invalid_argument")
        big = json.dumps({"type": "Waiter", "args": ["x" * (1 << 20)]}).encode()
        _error(c.post("/api/v1/workflows", content=big, headers=json_headers), 413, "payload_too_large")
        _error(c.post("/api/v1/hooks/0.nonsense", json={}), 409, "hook_token_unusable")

        wid = _id("waiter")
        c.post("/api/v1/workflows", json={"type": "Waiter", "id": wid, "args": [60]})
        message = _error(c.post(f"/api/v1/workflows/{wid}/query/nope", json={}), 422, "rejected")
        assert "no @query 'nope'" in message
        update = c.post(f"/api/v1/workflows/{wid}/update/nope", json={"args": []})
        assert update.status_code in (404, 409, 422, 501) and "error" in update.json()
        c.post(f"/api/v1/workflows/{wid}/terminate")


def test_auth_roles_and_csrf(api: Api) -> None:
    secured, opened = api.secured, api.open
    with secured.client() as anonymous:
        resp = anonymous.get("/api/v1/workflows")
        _error(resp, 401, "unauthorized")
        assert resp.headers["www-authenticate"].startswith("Bearer")
        assert anonymous.get("/healthz").status_code == 200
    with secured.client("not-a-known-token-at-all") as wrong:
        _error(wrong.get("/api/v1/workflows"), 401, "unauthorized")
    wid = _id("waiter")
    with secured.client(READER) as reader:
        assert reader.get("/api/v1/workflows").status_code == 200
        assert reader.get("/api/v1/workers").status_code == 200
        _error(reader.post("/api/v1/workflows", json={"type": "Waiter", "id": wid}), 403, "forbidden")
    with secured.client(OPERATOR) as operator:
        assert (
            operator.post("/api/v1/workflows", json={"type": "Waiter", "id": wid, "args": [60]}).status_code
            == 201
        )
    with secured.client(READER) as reader:
        _error(reader.post(f"/api/v1/workflows/{wid}/terminate"), 403, "forbidden")
        _error(reader.post(f"/api/v1/workflows/{wid}/signal/go", json={"args": [1]}), 403, "forbidden")
    with secured.client(OPERATOR) as operator:
        assert operator.post(f"/api/v1/workflows/{wid}/terminate").status_code == 200

    with opened.client() as browser:  # no tokens: the CSRF header or a bearer is required
        assert browser.get("/api/v1/workflows").status_code == 200
        _error(browser.post("/api/v1/workflows", json={"type": "Waiter"}), 403, "csrf")
        evil = {**CSRF, "Origin": "http://evil.example"}
        _error(browser.post("/api/v1/workflows", json={"type": "Waiter"}, headers=evil), 403, "csrf")
        _error(browser.get("/api/v1/workflows", headers={"Host": "evil.example"}), 403, "forbidden")
        # Every route, pages and static files too (they were served to any Host).
        for path in (
            "/",
            f"/workflows/{wid}",
            "/workers",
            "/static/ui.js",
            "/api/v1/openapi.json",
            "/healthz",
        ):
            _error(browser.get(path, headers={"Host": "evil.example"}), 403, "forbidden")
            assert browser.get(path).status_code == 200, path
    with secured.client(READER) as reader:  # with tokens a Host is any name the server is reached by
        assert reader.get("/healthz", headers={"Host": "durable.internal"}).status_code == 200


def test_workers_schedules_dead_letters(api: Api) -> None:
    ScheduleHandle.create("srv-sched", Schedule(workflow="Waiter", args=(60,), every="1h"), store=api.store)
    with api.open.client(**CSRF) as c:
        workers = c.get("/api/v1/workers").json()
        assert workers["workers"] and "Waiter" in workers["workers"][0]["workflows"]
        assert "default" in workers["queues"]
        assert [s["id"] for s in c.get("/api/v1/schedules").json()["schedules"]] == ["srv-sched"]
        assert c.get("/api/v1/schedules/srv-sched").json()["spec"]["workflow"] == "Waiter"
        _error(c.get("/api/v1/schedules/nope"), 404, "not_found")
        assert c.post("/api/v1/schedules/srv-sched/pause", json={"note": "maintenance"}).json()["paused"]
        described = c.get("/api/v1/schedules/srv-sched").json()
        assert described["paused"] and described["note"] == "maintenance"
        assert c.post("/api/v1/schedules/srv-sched/unpause").json()["paused"] is False
        outcome = c.post("/api/v1/schedules/srv-sched/trigger").json()
        assert outcome["outcome"] == "started", outcome
        triggered = outcome["workflow_id"]
        assert triggered.startswith("srv-sched-")
        again = c.post("/api/v1/schedules/srv-sched/trigger").json()  # the first one is still open
        assert again == {
            "id": "srv-sched",
            "outcome": "skipped",
            "workflow_id": None,
            "reason": "a run is open (overlap skip)",
        }
        c.post(f"/api/v1/workflows/{triggered}/terminate")
        before = c.get("/api/v1/dead-letters").json()["total"]
        for i in range(3):  # parked tasks of two partitions
            api.store.redis.xadd(api.store.keys.dead(i % 2), {"kind": "test", "reason": f"letter {i}"})
            time.sleep(0.002)  # (entry ids of one millisecond tie across partitions)
        page = c.get("/api/v1/dead-letters?limit=2").json()
        # The newest page, and how many are parked in all (the page alone hid the rest).
        assert [d["reason"] for d in page["dead_letters"]] == ["letter 1", "letter 2"], page
        assert page["total"] == before + 3
    ScheduleHandle("srv-sched", store=api.store).delete()


def test_schedules_are_created_backfilled_and_deleted_through_the_api(api: Api) -> None:
    """The API had no route to create or delete a schedule (its docs listed 409 schedule_exists)."""
    body = {"id": "api-sched", "workflow": "Waiter", "args": [60], "every": "1h", "overlap": "allow_all"}
    with api.open.client(**CSRF) as c:
        created = c.post("/api/v1/schedules", json=body)
        assert created.status_code == 201, created.text
        assert created.json()["spec"]["every"] == 3600 and created.json()["spec"]["args"] == [60]
        assert ScheduleHandle("api-sched", store=api.store).describe().spec.workflow == "Waiter"
        _error(c.post("/api/v1/schedules", json=body), 409, "schedule_exists")
        bad = _error(
            c.post("/api/v1/schedules", json={**body, "id": "b", "paused": "no"}), 422, "invalid_argument"
        )
        assert "paused must be True or False" in bad
        _error(c.post("/api/v1/schedules", json={**body, "id": "b", "evry": "1h"}), 422, "invalid_argument")
        _error(
            c.post("/api/v1/schedules", json={"workflow": "Waiter", "every": "1h"}), 422, "invalid_argument"
        )
        unknown = _error(
            c.post("/api/v1/schedules", json={**body, "id": "b", "workflow": "Waitr"}), 422, "unknown_type"
        )
        assert "is not defined in --app apps.basic; did you mean 'Waiter'?" in unknown, unknown
        filled = c.post(
            "/api/v1/schedules/api-sched/backfill",
            json={"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00:00Z"},
        ).json()
        assert filled["scheduled"] == ["2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z"]
        assert filled["started"] == filled["scheduled"], filled
        _error(
            c.post("/api/v1/schedules/api-sched/backfill", json={"start": "2026-01-01"}),
            422,
            "invalid_argument",
        )
        assert c.post("/api/v1/schedules/api-sched/delete").json() == {"id": "api-sched", "deleted": True}
        _error(c.get("/api/v1/schedules/api-sched"), 404, "not_found")
        _error(c.post("/api/v1/schedules/api-sched/delete"), 404, "not_found")
    for started in filled["started"]:
        WorkflowStub.load(f"api-sched-{started}", store=api.store).terminate()


def test_server_refuses_open_non_loopback_and_bad_tokens(durable_redis_url: str) -> None:
    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        environ = {"DURABLE_REDIS_URL": durable_redis_url, "PATH": "/usr/bin:/bin", **(env or {})}
        return subprocess.run(
            [sys.executable, "-m", "workers.cli", "server", *args],
            cwd=ROOT,
            env=environ,
            capture_output=True,
            text=True,
            timeout=60,
        )

    refused = run("--host", "0.0.0.0", "--port", "1")
    assert refused.returncode == 1 and "refusing to listen on 0.0.0.0 without tokens" in refused.stderr
    short = run("--port", "1", env={"DURABLE_SERVER_TOKENS": "operator:short"})
    assert short.returncode == 1 and "shorter than 16 characters" in short.stderr
    role = run("--port", "1", env={"DURABLE_SERVER_TOKENS": f"admin:{OPERATOR}"})
    assert role.returncode == 1 and "unknown role 'admin'" in role.stderr
    assert OPERATOR not in role.stderr


def test_update_waits_a_bounded_time_and_says_what_the_handler_raised(api: Api) -> None:
    """An update call held a server thread until the run closed (40 of them hung every route,
    healthz too), and a handler's own error was a 500: now its outcome, a 422 ``update_failed``
    naming the error, or after ``timeout`` a 202 with the update's id; at most 16 wait at once."""
    served, unserved = _id("counter"), _id("counter-nowhere")
    with api.open.client(**CSRF) as c:
        for wid, queue in ((served, None), (unserved, "nowhere")):
            body = {"type": "Counter", "id": wid, **({"queue": queue} if queue else {})}
            assert c.post("/api/v1/workflows", json=body).status_code == 201
        done = c.post(f"/api/v1/workflows/{served}/update/add", json={"args": [2], "update_id": "u-1"})
        assert done.status_code == 200 and done.json() == {"result": 2, "update_id": "u-1"}, done.text
        message = _error(
            c.post(f"/api/v1/workflows/{served}/update/add", json={"args": [-1]}), 422, "update_failed"
        )
        assert message == "update 'add' raised ValueError: a negative step (-1)"
        pending = c.post(f"/api/v1/workflows/{unserved}/update/add", json={"args": [1], "timeout": 0.5})
        assert pending.status_code == 202, pending.text
        uid = pending.json()["update_id"]
        assert (
            pending.json()["pending"] is True
            and "POST again with this update_id" in pending.json()["message"]
            and "no live worker can run it now: no live worker serves queue 'nowhere'"
            in pending.json()["message"]
        )
        again = c.post(
            f"/api/v1/workflows/{unserved}/update/add", json={"update_id": uid, "timeout": 0.2, "args": [1]}
        )
        assert again.status_code == 202 and again.json()["update_id"] == uid
        # Delivered and waiting: listed (as signals are), once however often it was sent.
        described = c.get(f"/api/v1/workflows/{unserved}").json()
        assert described["updates_undecided"] == [{"name": "add", "id": uid}], described
        _error(
            c.post(f"/api/v1/workflows/{served}/update/add", json={"timeout": 61}), 422, "invalid_argument"
        )
        # Named as the body field it is (it said "invalid command id").
        bad_id = c.post(f"/api/v1/workflows/{served}/update/add", json={"args": [1], "update_id": "<x>"})
        assert _error(bad_id, 422, "invalid_argument").startswith("invalid update_id '<x>': use 1-200")

    def waits() -> int:
        with api.open.client(**CSRF) as client:
            url = f"/api/v1/workflows/{unserved}/update/add"
            return client.post(url, json={"args": [1], "timeout": 3}, timeout=30).status_code

    with ThreadPoolExecutor(17) as pool:
        calls = [pool.submit(waits) for _ in range(17)]
        with api.open.client() as c:  # every other route still answers meanwhile
            assert c.get("/healthz", timeout=5).status_code == 200
        statuses = sorted(call.result() for call in calls)
    assert statuses == [202] * 16 + [429], statuses
    with api.open.client(**CSRF) as c:
        c.post(f"/api/v1/workflows/{served}/signal/stop")
        c.post(f"/api/v1/workflows/{unserved}/terminate")


def test_update_calls_whose_clients_hung_up_give_their_slots_back(api: Api) -> None:
    """16 update calls whose clients went away held every waiting slot until their own
    ``timeout``: each update call meanwhile was ``busy``."""
    unserved = _id("counter-hangup")
    url = f"/api/v1/workflows/{unserved}/update/add"
    with api.open.client(**CSRF) as c:
        body = {"type": "Counter", "id": unserved, "queue": "nowhere"}
        assert c.post("/api/v1/workflows", json=body).status_code == 201

    def hangs_up() -> None:
        with api.open.client(**CSRF) as client, pytest.raises(httpx.ReadTimeout):
            client.post(url, json={"args": [1], "timeout": 60}, timeout=1.0)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda _: hangs_up(), range(16)))
    with api.open.client(**CSRF) as c:
        # Within a slice (1 s) and the watch's poll, not after the 60 s they asked for.
        wait_for(
            lambda: c.post(url, json={"args": [1], "timeout": 0}).status_code == 202, timeout=10, interval=0.2
        )
        c.post(f"/api/v1/workflows/{unserved}/terminate")


def test_a_stopping_server_answers_waiting_update_calls_with_their_update_id(
    redis_url: str, tmp_path: Path
) -> None:
    """SIGTERM (every deploy) cut waiting update calls off at the graceful timeout with a
    plain-text 500: delivered, their callers lost the id they need to wait on without running
    the update twice. They answer 202 with it, as at their timeout."""
    server = ServerProc(redis_url, tmp_path / "server.log")
    try:
        wid = _id("counter-stop")
        with server.client(**CSRF) as c:
            body = {"type": "Counter", "id": wid, "queue": "nowhere"}  # no worker: the updates wait
            assert c.post("/api/v1/workflows", json=body).status_code == 201

            def update(i: int) -> httpx.Response:
                body = {"args": [1], "update_id": f"u-stop-{i}", "timeout": 60}
                return httpx.post(
                    f"{server.url}/api/v1/workflows/{wid}/update/add", json=body, headers=CSRF, timeout=30
                )

            with ThreadPoolExecutor(2) as pool:
                calls = [pool.submit(update, i) for i in range(2)]
                wait_for(lambda: len(c.get(f"/api/v1/workflows/{wid}").json()["updates_undecided"]) == 2)
                stopped = time.monotonic()
                server.proc.send_signal(signal.SIGTERM)
                answers = [call.result() for call in calls]
        assert time.monotonic() - stopped < 4  # within a slice, not at the graceful timeout (5 s)
        for i, answer in enumerate(answers):
            assert answer.status_code == 202, answer.text
            assert answer.json()["update_id"] == f"u-stop-{i}" and answer.json()["pending"] is True
            assert "the server is stopping" in answer.json()["message"]
    finally:
        server.stop()


def test_a_server_on_another_loopback_address_answers_requests_to_it(redis_url: str, tmp_path: Path) -> None:
    """`--host 127.0.0.2` was accepted as loopback, then every request to it was a 403 saying it
    was not a loopback host (the Host rule knew 127.0.0.1, localhost and ::1 only)."""
    server = ServerProc(redis_url, tmp_path / "server.log", host="127.0.0.2")
    try:
        assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
        assert httpx.get(f"{server.url}/", timeout=10).status_code == 200
        # A name that only resolves there (DNS rebinding) is still refused.
        refused = httpx.get(f"{server.url}/healthz", headers={"Host": "127.0.0.2.evil.example"}, timeout=10)
        assert refused.status_code == 403, refused.text
    finally:
        server.stop()


def test_a_server_started_before_its_redis_waits_for_it(fresh_redis, tmp_path: Path) -> None:  # noqa: ANN001
    """It exited (rc 1) with Redis not up yet, where a worker waits: a server started with its
    Redis (a compose file, a reboot) stayed down."""
    fresh_redis.stop()
    log, waiting = tmp_path / "server.log", "durable server startup (Redis at"
    test_over = threading.Event()

    def start_redis_once_the_server_waits() -> None:  # a fixed delay raced a slow server start
        deadline = time.monotonic() + 30
        while not test_over.is_set() and time.monotonic() < deadline:
            if log.exists() and waiting in log.read_text(errors="replace"):
                fresh_redis.ensure()
                return
            time.sleep(0.1)

    later = threading.Thread(target=start_redis_once_the_server_waits)
    later.start()
    try:
        server = ServerProc(fresh_redis.url, log)  # ready once Redis answers
        try:
            assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
        finally:
            server.stop()
    finally:  # before the fixture stops Redis: a start after that would outlive the test
        test_over.set()
        later.join()
    assert waiting in log.read_text()


def test_read_tokens_without_a_hook_secret_are_warned_of(redis_url: str, tmp_path: Path) -> None:
    """A read token sees hook tokens handed to activities (histories, queries); without a hook
    secret the token alone resumes the hook, and nothing said so."""
    env = {"DURABLE_SERVER_TOKENS": f"operator:{OPERATOR},read:{READER}"}
    server = ServerProc(redis_url, tmp_path / "server.log", env=env)
    server.stop()
    said = (tmp_path / "server.log").read_text()
    assert "read tokens are configured but no hook secret" in said, said
    signed = ServerProc(
        redis_url, tmp_path / "signed.log", env={**env, "DURABLE_SERVER_HOOK_SECRET": HOOK_SECRET}
    )
    signed.stop()
    assert "no hook secret" not in (tmp_path / "signed.log").read_text()
