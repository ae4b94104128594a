"""``durable server``: odd inputs get a 4xx naming the problem, never a 500, with a real server
process, a real worker and the test Redis."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from procs import durable_cli, spawn_worker, stop
from server_procs import ServerProc
from waiting import wait_for

from durable import WorkflowStub
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


def test_a_query_whose_handler_raises_is_refused_naming_it(client: httpx.Client) -> None:
    """It answered 500 "internal" (and logged a traceback as the server's own fault)."""
    workflow_id = f"qr-{uuid.uuid4().hex[:8]}"
    assert _start(client, {"type": "Everything", "args": [1], "id": workflow_id}).status_code == 201
    url = f"/api/v1/workflows/{workflow_id}/query/field"
    wait_for(lambda: client.post(url, json={"args": ["stage"]}).status_code == 200, timeout=30)
    message = _error(client.post(url, json={"args": ["nope"]}), 422, "rejected")
    assert message == "@query 'field' of workflow 'Everything' raised KeyError: 'nope'", message


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


# Values that passed a ``str.isdigit`` check and then failed ``int()`` (a 500), and others that
# parse as one thing in one place and another elsewhere.
ODD_VALUES = [
    "", "-", "--5", "²", "٣", "１２", "9" * 5000, "9" * 30, "-0", "1e3", " 1", "\x00", "%", "/", ":",
    "1:", "²:x", "-1:x", "2026-13-40", "9999-12-31T23:59:59", "0001-01-01T00:00:00+14:00", "(", "'",
    "\\", "é" * 300, "x" * 5000, "NaN", "[]", "\U0001f600", "1.x", "².x", "0.abc.def",
]  # fmt: skip


@pytest.mark.parametrize("name", ["since", "until"])
@pytest.mark.parametrize("value", ["--5", "²", pytest.param("9" * 5000, id="5000-digits")])
@pytest.mark.parametrize("where", [None, "status = 'running'"])
def test_a_time_int_cannot_read_is_refused_naming_its_parameter(
    client: httpx.Client, name: str, value: str, where: str | None
) -> None:
    params = {name: value, **({"where": where} if where else {})}
    message = _error(client.get("/api/v1/workflows", params=params), 422, "invalid_argument")
    assert message == f"query parameter {name!r} must be UTC ms or an ISO 8601 time", message


@pytest.mark.parametrize("before", ["²:01J", pytest.param("9" * 5000, id="5000-digits"), "-1:01J"])
def test_a_searched_list_refuses_a_cursor_int_cannot_read(client: httpx.Client, before: str) -> None:
    params = {"where": "status = 'running'", "before": before}
    message = _error(client.get("/api/v1/workflows", params=params), 422, "invalid_argument")
    assert message.startswith("'before' must be the 'next' cursor of a page"), message


def test_a_hook_token_with_an_odd_partition_is_an_unknown_token(client: httpx.Client) -> None:
    for token in ("².abc", "9" * 5000 + ".abc", "-1.abc"):
        message = _error(client.post(f"/api/v1/hooks/{token}", json={}), 409, "hook_token_unusable")
        assert message.startswith("unknown or already used hook token"), message


def test_a_hook_body_nested_too_deeply_is_a_bad_request(client: httpx.Client) -> None:
    body = b"[" * 5000 + b"]" * 5000
    resp = client.post("/api/v1/hooks/0.abc", content=body, headers={"content-type": "application/json"})
    assert "nested too deeply" in _error(resp, 400, "bad_request")


def test_no_odd_value_anywhere_gets_a_server_error(client: httpx.Client) -> None:
    """Every route, with each odd value in each query parameter, path parameter and (for POSTs)
    as the body: a 4xx with a JSON error naming the problem, never a 5xx, and the server lives."""
    from workers.server.app import ENDPOINTS

    def fill(path: str, value: str = "odd-w") -> str:
        for name in ("{id}", "{name}", "{token}"):
            path = path.replace(name, value)
        return path

    answered: list[tuple[int, str, str, str]] = []

    def send(method: str, path: str, **kw: Any) -> None:
        resp = client.request(method, path, **kw)
        answered.append((resp.status_code, method, path[:80], str(kw)[:80]))
        if resp.status_code >= 400:
            assert resp.json()["error"]["message"], (method, path, kw, resp.text)

    for e in ENDPOINTS:
        for value in ODD_VALUES:
            for param in e.params:
                send(e.method, fill(e.path), params={param.name: value})
            quoted = urllib.parse.quote(value, safe="")
            if "{" in e.path and quoted:
                send(e.method, fill(e.path, quoted), json={} if e.method == "POST" else None)
            if e.method == "POST":
                send(e.method, fill(e.path), content=value.encode("utf-8", "surrogatepass"))
                send(e.method, fill(e.path), json={"args": value, "reason": value, "type": value})
    errors = [a for a in answered if a[0] >= 500]
    assert not errors, errors[:10]
    assert len(answered) > 1000 and {a[0] for a in answered} >= {200, 404, 422}
    assert client.get("/healthz").status_code == 200


ODD_JSON: list[Any] = [
    None, True, -1, 0, 1e308, 10**30, "", "²", "nan", "x" * 5000, [], {}, [[[]]],
    {"a": {"b": [1]}}, {"": 1}, ["x"] * 100,
]  # fmt: skip


def test_no_odd_body_field_gets_a_server_error(client: httpx.Client) -> None:
    """Each body field a route reads, given each odd JSON value (the rest of the body valid):
    a 2xx or a 4xx naming the problem, never a 5xx."""
    from workers.server.app import ENDPOINTS

    workflow_id = f"fields-{uuid.uuid4().hex[:8]}"
    assert _start(client, {"type": "Everything", "args": [1], "id": workflow_id}).status_code == 201
    answered: list[tuple[int, str, str, str]] = []
    for e in ENDPOINTS:
        for field in e.fields or ():
            for value in ODD_JSON:
                path = e.path.replace("{id}", workflow_id).replace("{name}", "progress")
                body: dict[str, Any] = {field: value}
                if e.path == "/api/v1/workflows":
                    body = {"type": "Everything", "args": [1], "id": f"f-{uuid.uuid4().hex[:8]}", **body}
                resp = client.post(path, json=body)
                answered.append((resp.status_code, path, field, repr(value)[:40]))
                if resp.status_code >= 400:
                    assert resp.json()["error"]["message"], (path, body, resp.text)
    errors = [a for a in answered if a[0] >= 500]
    assert not errors, errors[:10]
    assert len(answered) > 200 and {a[0] for a in answered} & {200, 201} and 422 in {a[0] for a in answered}


def _strict(text: str) -> Any:
    """JSON as a browser reads it: no NaN or Infinity."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_nan_and_infinity_are_valid_json_out_and_refused_in(
    client: httpx.Client, durable_redis_url: str
) -> None:
    """A NaN argument was written out as `NaN`: the run page's JSON.parse failed and showed
    nothing; NaN in a request body was taken (Python reads it, no other JSON parser does)."""
    store = RedisStore(durable_redis_url)
    try:
        stub = WorkflowStub.make("Everything", id=f"nan-{uuid.uuid4().hex[:6]}", store=store)
        stub.start(float("nan"))
        history = _strict(client.get(f"/api/v1/workflows/{stub.id}/history").text)
        started = history["events"][0]
        assert started["data"]["args"] == [{"$float": "nan"}], started
        _strict(client.get(f"/api/v1/workflows/{stub.id}").text)  # parses, whatever state it is in
        stub.terminate("done")
    finally:
        store.close()
    for constant in ("NaN", "Infinity", "-Infinity"):
        body = b'{"type": "Everything", "args": [' + constant.encode() + b"]}"
        assert "is not a JSON number" in _error(_start(client, body), 400, "bad_request")
    big = b'{"type": "Everything", "args": [1e999]}'  # Python reads it as infinity
    assert "out of a float's range" in _error(_start(client, big), 400, "bad_request")


def test_a_control_character_forges_no_log_line_and_no_name(durable_redis_url: str, tmp_path: Any) -> None:
    """A path with %0A wrote a line of the client's choosing into the access log (%00 a NUL byte),
    unauthenticated; a signal name with a newline was taken and delivered."""
    server = ServerProc(durable_redis_url, tmp_path / "server.log")
    try:
        with server.client(**CSRF) as c:
            c.get("/api/v1/x%0A2026-01-01 INFO durable.server.access: GET /api/v1/FORGED 200%00")
            wid = f"ctl-{uuid.uuid4().hex[:6]}"
            assert _start(c, {"type": "Everything", "args": [1], "id": wid}).status_code == 201
            resp = c.post(f"/api/v1/workflows/{wid}/signal/go%0Anow", json={"args": []})
            assert "holds a control character" in _error(resp, 422, "invalid_argument")
    finally:
        server.stop()
    lines = server.log.read_bytes().splitlines()
    assert not any(line.startswith(b"2026-01-01") for line in lines), lines
    assert b"\x00" not in server.log.read_bytes()
    assert any(b"/api/v1/x\\n2026-01-01" in line for line in lines), lines


def test_repair_moves_a_pinned_run_back_to_unversioned_workers(
    client: httpx.Client, durable_redis_url: str
) -> None:
    """The blocked reason says `--unversioned`, but the API (and the UI's Repair) had no way to
    do it: an empty build_id answered "requeued" and moved nothing."""
    wid = f"unpin-{uuid.uuid4().hex[:6]}"
    assert _start(client, {"type": "Everything", "args": [1], "id": wid}).status_code == 201
    store = RedisStore(durable_redis_url)
    try:
        wait_for(lambda: client.get(f"/api/v1/workflows/{wid}").json()["pending"], timeout=30)
        store.repin(wid, "v-gone")  # pinned to a build no worker serves
        assert client.get(f"/api/v1/workflows/{wid}").json()["blocked_kind"] == "no_live_worker"
        url = f"/api/v1/workflows/{wid}/repair"
        assert "not both" in _error(
            client.post(url, json={"build_id": "v2", "unversioned": True}), 422, "invalid_argument"
        )
        assert "use 1-100 characters" in _error(
            client.post(url, json={"build_id": "v 2"}), 422, "invalid_argument"
        )
        moved = client.post(url, json={"unversioned": True})
        assert moved.status_code == 200 and moved.json()["build_id"] is None, moved.text
        assert not store.run_record(store.ref(wid)).get("build")
        assert client.get(f"/api/v1/workflows/{wid}").json()["blocked"] is None
        client.post(f"/api/v1/workflows/{wid}/terminate", json={"reason": "done"})
    finally:
        store.close()


def test_a_port_in_use_is_one_error_line(durable_redis_url: str, tmp_path: Any) -> None:
    """It printed "durable server on http://...", then uvicorn's multi-line [Errno 98] block, and
    exited 3."""
    first = ServerProc(durable_redis_url, tmp_path / "first.log")
    try:
        second = durable_cli(durable_redis_url, "server", "--port", str(first.port))
    finally:
        first.stop()
    assert second.returncode == 1, second.stdout + second.stderr
    assert second.stderr.splitlines() == [
        f"error: cannot listen on 127.0.0.1:{first.port}: Address already in use (another process "
        f"listens there: stop it, or give --port) (redis: {durable_redis_url})"
    ], second.stderr
    assert "durable server on" not in second.stdout


def test_no_redirect_takes_its_host_from_the_request_and_a_dropped_body_is_no_error(
    durable_redis_url: str, tmp_path: Any
) -> None:
    """``/workers/`` answered 307 to ``http://<the request's Host>/workers`` (a cache behind a
    proxy could keep a redirect elsewhere): a JSON 404 now. A client that closed the connection
    mid-body was logged as an unexpected error with a traceback, at will."""
    server = ServerProc(durable_redis_url, tmp_path / "server.log")
    try:
        with server.client(**CSRF) as c:
            for path in ("/workers/", "/api/v1/schedules/"):
                resp = c.get(path, follow_redirects=False)
                assert resp.status_code == 404 and "location" not in resp.headers, (path, resp.headers)
                assert resp.json()["error"]["code"] == "not_found"
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(
                b"POST /api/v1/workflows HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Durable-Request: 1\r\n"
                b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"type"'
            )
        with server.client() as c:
            wait_for(lambda: c.get("/healthz").status_code == 200, timeout=10)
        time.sleep(0.5)
    finally:
        server.stop()
    log = server.log.read_text()
    assert "unexpected error" not in log and "Traceback" not in log, log


def test_integers_are_ascii_digits_and_batch_errors_speak_of_where(client: httpx.Client) -> None:
    """``?after=1_0``, ``+5`` and a fullwidth digit were read as numbers (int()); a batch's bad
    expression said ``--where``, the CLI's word."""
    wid = f"ints-{uuid.uuid4().hex[:6]}"
    assert _start(client, {"type": "Waiter", "args": [60], "id": wid}).status_code == 201
    for after in ("1_0", "+5", "\uff11"):
        message = _error(
            client.get(f"/api/v1/workflows/{wid}/history", params={"after": after}), 422, "invalid_argument"
        )
        assert "'after' must be an integer" in message, (after, message)
    assert client.get(f"/api/v1/workflows/{wid}/history", params={"after": "0"}).status_code == 200
    message = _error(client.post("/api/v1/batch/cancel", json={"where": "type = "}), 422, "invalid_argument")
    assert "--where" not in message and message.startswith("where syntax error"), message
    client.post(f"/api/v1/workflows/{wid}/terminate")


def test_a_signal_with_start_takes_no_field_it_would_ignore(client: httpx.Client) -> None:
    """Unknown top-level fields were refused, a misspelt one inside ``signal`` ignored."""
    body = {"type": "Waiter", "args": [60], "signal": {"name": "go", "args": [1], "arg": 2}}
    message = _error(_start(client, body), 422, "invalid_argument")
    assert """'signal' must be {"name": str, "args": [...]}""" in message
