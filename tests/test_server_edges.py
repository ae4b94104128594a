"""``durable server``: odd inputs get a 4xx naming the problem, never a 500, with a real server
process, a real worker and the test Redis."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from procs import spawn_worker, stop
from server_procs import ServerProc
from waiting import wait_for

from durable.store.connect import flush_database
from durable.store.redis_store import RedisStore

CSRF = {"X-Durable-Request": "1", "content-type": "application/json"}


@pytest.fixture(scope="module")
def client(durable_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    flush_database(durable_redis_url)
    store = RedisStore(durable_redis_url)
    worker = spawn_worker(durable_redis_url)
    server = None
    try:
        server = ServerProc(durable_redis_url, tmp_path_factory.mktemp("edges") / "server.log")
        wait_for(store.live_workers, timeout=30)
        with server.client(**CSRF) as c:
            yield c
    finally:
        if server is not None:
            server.stop()
        stop(worker)
        store.close()


def _error(resp: httpx.Response, status: int, code: str) -> str:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["code"] == code, error
    return str(error["message"])


def _start(client: httpx.Client, body: bytes | dict) -> httpx.Response:
    if isinstance(body, dict):
        return client.post("/api/v1/workflows", json=body)
    return client.post("/api/v1/workflows", content=body)


def test_a_deeply_nested_body_is_a_bad_request(client: httpx.Client) -> None:
    body = b'{"type": "Everything", "args": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}"
    assert "nested too deeply" in _error(_start(client, body), 400, "bad_request")


def test_a_deeply_nested_where_is_refused_with_its_position(client: httpx.Client) -> None:
    for where in ("(" * 2000 + "status = 'running'" + ")" * 2000, "not " * 3000 + "status = 'running'"):
        for path in ("/api/v1/workflow-counts", "/api/v1/workflows"):
            message = _error(client.get(path, params={"where": where}), 422, "invalid_argument")
            assert "nested deeper than 64 levels" in message, message
    assert (
        client.get("/api/v1/workflow-counts", params={"where": "((status = 'running'))"}).status_code == 200
    )


@pytest.mark.parametrize(
    ("workflow_id", "says"),
    [(".", "'.' and '..' are not ids"), ("..", "'.' and '..' are not ids"), ("\udcff", "lone surrogate")],
)
def test_ids_a_url_or_utf_8_cannot_carry_are_refused(
    client: httpx.Client, workflow_id: str, says: str
) -> None:
    body = b'{"type": "Everything", "args": [1], "id": "%s"}' % workflow_id.encode("unicode_escape")
    assert says in _error(_start(client, body), 422, "invalid_argument")


def test_a_timeout_past_the_64_bit_range_is_refused_with_the_range(client: httpx.Client) -> None:
    for value in (1e17, 1e308):
        body = {"type": "Everything", "args": [1], "id": f"to-{uuid.uuid4().hex[:6]}", "run_timeout": value}
        assert "must be at most 1e+15 s" in _error(_start(client, body), 422, "invalid_argument")


def test_a_query_with_arguments_its_method_does_not_take_is_refused(client: httpx.Client) -> None:
    workflow_id = f"q-{uuid.uuid4().hex[:8]}"
    assert _start(client, {"type": "Everything", "args": [1], "id": workflow_id}).status_code == 201
    wait_for(
        lambda: client.post(f"/api/v1/workflows/{workflow_id}/query/progress").status_code == 200, timeout=30
    )
    resp = client.post(f"/api/v1/workflows/{workflow_id}/query/progress", json={"args": [1, 2, 3]})
    message = _error(resp, 422, "rejected")
    assert message.startswith("@query 'progress' takes ()"), message
    assert "too many positional arguments" in message


def test_an_id_ending_like_a_route_is_one_id_when_its_slash_is_escaped(client: httpx.Client) -> None:
    """``x/history`` sent as ``x%2Fhistory`` is that run, not the history of run ``x``."""
    base = f"r-{uuid.uuid4().hex[:8]}"
    for workflow_id in (base, f"{base}/history", f"{base}/cancel"):
        assert _start(client, {"type": "Everything", "args": [1], "id": workflow_id}).status_code == 201
    escaped = f"/api/v1/workflows/{base}%2Fhistory"
    described = client.get(escaped)
    assert described.status_code == 200 and described.json()["workflow_id"] == f"{base}/history"
    history = client.get(escaped + "/history").json()
    assert history["workflow_id"] == f"{base}/history" and history["events"][0]["type"] == "WorkflowStarted"
    assert client.get(f"/api/v1/workflows/{base}%2Fcancel").json()["workflow_id"] == f"{base}/cancel"
    # An escaped "%" in an id stays one character.
    odd = f"{base}%2F"
    assert _start(client, {"type": "Everything", "args": [1], "id": odd}).status_code == 201
    assert client.get(f"/api/v1/workflows/{base}%252F").json()["workflow_id"] == odd
    # Unescaped, a child-like id still resolves as before.
    assert client.get(f"/api/v1/workflows/{base}/history").json()["workflow_id"] == base


def test_a_misspelt_body_field_is_refused_with_a_suggestion(client: httpx.Client) -> None:
    """Not started with its arguments silently left out (the run would then fail on them)."""
    workflow_id = f"typo-{uuid.uuid4().hex[:8]}"
    message = _error(
        _start(client, {"type": "Everything", "id": workflow_id, "arg": [1]}), 422, "invalid_argument"
    )
    assert message.startswith(
        "unknown body field 'arg' (did you mean 'args'?); this route takes: type, id, args"
    )
    assert client.get(f"/api/v1/workflows/{workflow_id}").status_code == 404  # nothing was started
    assert _start(client, {"type": "Everything", "id": workflow_id, "args": [1]}).status_code == 201
    message = _error(
        client.post(f"/api/v1/workflows/{workflow_id}/cancel", json={"reson": "x"}), 422, "invalid_argument"
    )
    assert "unknown body field 'reson' (did you mean 'reason'?)" in message
