"""The server's parts that need no server process: the runs list's paging, tokens, payloads."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from durable.store.redis_store import RedisStore
from durable.store.workers import FOUND_ON_READ
from workers.server.app import masked_path
from workers.server.auth import AuthConfig, AuthFileError, load_auth
from workers.server.errors import ApiError
from workers.server.ops_routes import hook_payload

TOKEN_A = "a" * 20
TOKEN_B = "b" * 20


def _seed(store: RedisStore, n: int, rng: random.Random) -> list[tuple[int, str]]:
    """``n`` run records spread over the partitions, many created in the same millisecond."""
    made = []
    with store.redis.pipeline(transaction=False) as pipe:
        for i in range(n):
            wid = f"wf-{i:04d}"
            p = store.keys.partition(wid)
            rid = f"R{rng.randrange(10**9):09d}{i:04d}"
            created = 1_000_000 + rng.randrange(12)  # few distinct times: ties everywhere
            status = "completed" if i % 3 else "running"
            pipe.zadd(store.keys.runs(p), {rid: created})
            pipe.hset(
                store.keys.run(p, rid), mapping={"workflow_id": wid, "type": f"T{i % 2}", "status": status}
            )
            made.append((created, rid))
        pipe.execute()
    return made


@pytest.mark.parametrize("limit", [1, 7, 50])
def test_list_pages_never_skip_nor_repeat(store: RedisStore, limit: int) -> None:
    made = _seed(store, 120, random.Random(limit))
    want = sorted(made, reverse=True)
    seen, cursor = [], None
    for _ in range(500):
        page = store.list_runs_page(limit=limit, cursor=cursor)
        assert len(page.runs) <= limit
        seen += [(r["created"], r["run_id"]) for r in page.runs]
        cursor = page.next
        if cursor is None:
            break
    assert seen == want


def test_list_filters_and_scan_cap(store: RedisStore) -> None:
    made = _seed(store, 90, random.Random(3))
    running = store.list_runs_page(status="running", workflow_type="T0", limit=500)
    assert {r["workflow_id"] for r in running.runs} == {f"wf-{i:04d}" for i in range(0, 90, 6)}
    assert running.next is None
    assert [r["workflow_id"] for r in store.list_runs_page(id_prefix="wf-001", limit=500).runs] != []
    assert all(r["workflow_id"].startswith("wf-001") for r in store.list_runs_page(id_prefix="wf-001").runs)
    # A rare filter stops after `scan` candidates with a cursor that resumes the search.
    first = store.list_runs_page(id_prefix="wf-0089", scan=10)
    assert first.scanned == 10 and first.next is not None
    found, cursor = list(first.runs), first.next
    while cursor:
        page = store.list_runs_page(id_prefix="wf-0089", scan=10, cursor=cursor)
        found += page.runs
        cursor = page.next
    assert [r["workflow_id"] for r in found] == ["wf-0089"]
    times = sorted({c for c, _ in made})
    windowed = store.list_runs_page(since_ms=times[2], until_ms=times[4], limit=500).runs
    assert windowed and all(times[2] <= r["created"] <= times[4] for r in windowed)
    assert len(windowed) == sum(1 for c, _ in made if times[2] <= c <= times[4])
    older = store.list_runs_page(cursor=str(times[1]), limit=500).runs  # a bare time: runs before it
    assert {r["created"] for r in older} == {times[0]}


def test_tokens_from_json_toml_and_env(tmp_path: Path) -> None:
    as_json = tmp_path / "auth.json"
    as_json.write_text(json.dumps({"tokens": [{"token": TOKEN_A, "role": "operator", "name": "ann"}]}))
    as_toml = tmp_path / "auth.toml"
    as_toml.write_text(f'hook_secret = "s3cret"\n[[tokens]]\ntoken = "{TOKEN_B}"\nrole = "read-only"\n')
    auth = load_auth(as_json, {"DURABLE_SERVER_TOKENS": f"read:{TOKEN_B}"})
    assert auth.role_of({"authorization": f"Bearer {TOKEN_A}"}) == ("operator", "ann")
    assert auth.role_of({"authorization": f"bearer {TOKEN_B}"})[0] == "read"
    toml = load_auth(as_toml, {})
    assert toml.hook_secret == b"s3cret" and toml.role_of({"authorization": f"Bearer {TOKEN_B}"})[0] == "read"
    with pytest.raises(ApiError) as missing:
        toml.role_of({})
    assert missing.value.code == "unauthorized"
    assert AuthConfig().role_of({}) == ("operator", "anonymous")  # no tokens: open (loopback only)
    bad = tmp_path / "bad.json"
    for content, message in [
        ("{", "cannot read auth file"),
        ('{"tokens": {}}', "'tokens' list"),
        ('{"tokens": [{"token": "x"}]}', "needs 'token' and 'role'"),
        (json.dumps({"tokens": [{"token": "short", "role": "operator"}]}), "shorter than 16"),
        (  # the later entry's role won: an operator's token became read-only, or the reverse
            json.dumps(
                {"tokens": [{"token": TOKEN_A, "role": "operator"}, {"token": TOKEN_A, "role": "read"}]}
            ),
            "listed twice",
        ),
    ]:
        bad.write_text(content)
        with pytest.raises(AuthFileError, match=message) as err:
            load_auth(bad, {})
        assert 'short"' not in str(err.value)
    with pytest.raises(AuthFileError, match="role:token"):
        load_auth(None, {"DURABLE_SERVER_TOKENS": TOKEN_A})
    # /dev/zero given by mistake grew the server to 2.5 GB in 5 s; a big file is no token file.
    for endless in (Path("/dev/zero"), tmp_path / "big.json"):
        if endless.name == "big.json":
            endless.write_bytes(b" " * (2 * 1024 * 1024))
        with pytest.raises(AuthFileError, match="not a regular file of at most 1,048,576 bytes"):
            load_auth(endless, {})


def test_hook_payloads_and_masked_paths() -> None:
    assert hook_payload(b'{"a": 1}', "application/json") == {"a": 1}
    assert hook_payload(b"[1, 2]", "") == [1, 2]
    assert hook_payload(b"plain words", "") == "plain words"
    assert hook_payload(b"a=1&b=2", "application/x-www-form-urlencoded") == "a=1&b=2"
    assert hook_payload(b"\xff\xfe", "application/octet-stream") == b"\xff\xfe"
    assert hook_payload(b"", "application/json") is None
    with pytest.raises(ApiError):
        hook_payload(b"{oops", "application/json")
    assert masked_path("/api/v1/hooks/3.abcdef") == "/api/v1/hooks/***"
    assert masked_path("/api/v1/workflows/x") == "/api/v1/workflows/x"


def test_the_ui_knows_the_same_blocked_kinds_found_on_read_as_the_library() -> None:
    """The pages offer no repair for these kinds; their copy of the list must not drift."""
    source = (Path(__file__).parent.parent / "workers/server/static/ui.js").read_text()
    listed = re.search(r"const FOUND_ON_READ = new Set\(\[([^\]]*)\]\)", source)
    assert listed is not None
    assert set(re.findall(r'"([a-z_]+)"', listed.group(1))) == set(FOUND_ON_READ)


def test_a_redis_password_refused_is_not_answered_try_again() -> None:
    """A wrong Redis password answered ``redis_unavailable ... try again``: retrying cannot help."""
    import redis

    from workers.server.errors import from_exception

    error = from_exception(redis.exceptions.AuthenticationError("invalid username-password pair"))
    assert error.code == "redis_unavailable" and "check the password" in error.message
    assert "try again" in from_exception(redis.exceptions.ConnectionError("refused")).message


def test_redis_refusing_commands_for_now_is_a_503_not_a_500() -> None:
    """A cluster down (CLUSTERDOWN) or a busy script answered 500 ``internal`` with a traceback
    logged per request: clients retry a 503, and a signal's caller can."""
    import redis

    from workers.server.errors import from_exception

    for exc in (
        redis.exceptions.ClusterDownError("The cluster is down"),
        redis.exceptions.ResponseError("BUSY Redis is busy running a script. You can only call SCRIPT KILL"),
    ):
        error = from_exception(exc)
        assert (error.code, error.status) == ("redis_unavailable", 503), (exc, error)
        assert "try again" in error.message
