"""Issue 14 item 7: hook tokens are derived, never stored, shown masked, expire with their
wait, go when their run closes, and are resumed by one script."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from scenarios import replay_next_decision
from waiting import wait_for

from durable import (
    HookError,
    SignalTimeout,
    Workflow,
    WorkflowClosed,
    WorkflowStub,
    activity,
    await_hook,
    await_signal,
    create_hook,
    hooktokens,
    query,
)
from durable import events as ev
from durable.store.redis_store import RedisStore
from workers.cli import cli


def ht_echo(value: str) -> str:
    return value


class HandsOut(Workflow):
    """Hands the token to an activity (compared on replay) and awaits the hook."""

    def __init__(self) -> None:
        self.token = ""

    @query
    def hook_token(self) -> str:
        return self.token

    def handle(self) -> Any:
        hook = create_hook("approval", {"order": 7})
        self.token = hook.token
        sent = activity(ht_echo, hook.token)
        return [sent == hook.token, await_hook(hook)]


class Expiring(Workflow):
    def __init__(self) -> None:
        self.token = ""

    @query
    def hook_token(self) -> str:
        return self.token

    def handle(self) -> Any:
        hook = create_hook("approval")
        self.token = hook.token
        try:
            return await_hook(hook, timeout=0.3)
        except SignalTimeout:
            pass
        try:
            await_hook(hook)
        except SignalTimeout as exc:
            expired = str(exc)
        return [expired, await_signal("go")]


class Abandons(Workflow):
    def __init__(self) -> None:
        self.token = ""

    @query
    def hook_token(self) -> str:
        return self.token

    def handle(self, wait: bool) -> Any:
        self.token = create_hook("never-awaited").token
        return await_signal("go") if wait else "done"


def scan_for(client: redis.Redis, needle: bytes) -> list[str]:
    """Every key whose name or content holds ``needle`` (all data types)."""
    hits = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        if kind == "string":
            blobs = [client.get(key) or b""]
        elif kind == "hash":
            blobs = [b for kv in client.hgetall(key).items() for b in kv]
        elif kind == "list":
            blobs = client.lrange(key, 0, -1)
        elif kind == "set":
            blobs = list(client.smembers(key))
        elif kind == "zset":
            blobs = [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
        else:  # stream
            blobs = [b for _, fields in client.xrange(key) for kv in fields.items() for b in kv]
        if needle in key or any(needle in b for b in blobs):
            hits.append(key.decode())
    return hits


def hook_entries(store: RedisStore) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for p in range(store.keys.partitions):
        out.update(store.redis.hgetall(store.keys.hooks(p)))
    return out


def test_the_token_is_never_stored_and_replay_derives_it_again(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(HandsOut).start()
    token = wait_for(lambda: stub.query("hook_token"))
    wait_for(lambda: stub.status() == "suspended" and len(stub.history()) >= 4)
    # The activity got the token as an argument: a user payload, which the payload codec
    # encrypts when configured. Nothing durable itself writes holds it.
    ref = store.ref(stub.id)
    hits = set(scan_for(store.redis, token.encode()))
    assert hits <= {store.keys.history(ref.partition, ref.run_id), store.keys.log(ref.partition, ref.run_id)}
    created = next(e for e in store.history(ref) if isinstance(e.event, ev.HookCreated))
    assert created.event.token == hooktokens.digest(token) and token.encode() not in created.raw
    assert list(hook_entries(store)) == [hooktokens.digest(token).encode()]
    replay_next_decision(worker, stub)  # the next decision replays: the token is derived again
    WorkflowStub.resume_hook(token, "yes")
    assert stub.result(timeout=10) == [True, "yes"]
    assert hook_entries(store) == {}


def test_no_plaintext_token_anywhere_in_redis(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(Abandons).start(True)
    token = wait_for(lambda: stub.query("hook_token"))
    wait_for(lambda: stub.status() == "suspended")
    assert scan_for(store.redis, token.encode()) == []
    assert scan_for(store.redis, token.split(".", 1)[1][:12].encode()) == []


def test_history_and_its_json_export_show_the_token_masked(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(Abandons).start(True)
    token = wait_for(lambda: stub.query("hook_token"))
    wait_for(lambda: stub.status() == "suspended")
    digest = hooktokens.digest(token)
    for args in (["history", stub.id], ["history", stub.id, "--json"]):
        out = CliRunner().invoke(cli, args, catch_exceptions=False).output
        assert "HookCreated" in out
        assert token not in out and token.split(".", 1)[1][:8] not in out and digest not in out, out
    exported = json.loads(CliRunner().invoke(cli, ["history", stub.id, "--json"]).output)
    created = next(item for item in exported if item["type"] == "HookCreated")
    assert created["data"]["token"] == hooktokens.mask(digest)
    assert token.encode() not in base64.b64decode(created["raw"])
    assert [e.data["token"] for e in stub.history() if e.type == "HookCreated"] == [hooktokens.mask(digest)]


def test_a_token_expires_with_its_await_hook_deadline(worker, store: RedisStore) -> None:
    stub = WorkflowStub.make(Expiring).start()
    token = wait_for(lambda: stub.query("hook_token"))
    wait_for(lambda: hook_entries(store) == {} and stub.status() == "suspended", timeout=10)
    with pytest.raises(HookError) as info:
        WorkflowStub.resume_hook(token, "too late")
    assert token not in str(info.value) and token.split(".", 1)[1][:6] not in str(info.value)
    stub.signal("go", "on")
    expired, go = stub.result(timeout=10)
    assert "expired" in expired and go == "on"


@pytest.mark.parametrize("how", ["completed", "terminated"])
def test_tokens_go_when_the_run_closes(worker, store: RedisStore, how: str) -> None:
    stub = WorkflowStub.make(Abandons).start(how == "terminated")
    token = wait_for(lambda: stub.query("hook_token"))
    if how == "terminated":
        wait_for(lambda: stub.status() == "suspended")
        assert len(hook_entries(store)) == 1
        stub.terminate("done with it")
    else:
        assert stub.result(timeout=10) == "done"
    assert hook_entries(store) == {}
    run = store.redis.hgetall(store.keys.run(store.ref(stub.id).partition, stub.run_id or ""))
    assert b"hooks" not in run
    with pytest.raises(HookError):
        WorkflowStub.resume_hook(token, 1)


def test_resume_is_one_script_that_uses_up_the_token_and_delivers(store: RedisStore) -> None:
    """No worker: the payload must be in the inbox once the call returns, and a second
    resume must fail; both happen in the one script (no window to crash in between)."""
    stub = WorkflowStub.make(Abandons, store=store).start(True)
    ref = store.ref(stub.id)
    token = hooktokens.derive(store.hook_secrets()[0], f"{ref.partition}.", ref.run_id, "1")
    digest = hooktokens.digest(token)
    # What the first decision commits (the run's hook list and the routing entry).
    store.redis.hset(store.keys.hooks(ref.partition), digest, f"{ref.run_id}|1")
    store.redis.hset(store.keys.run(ref.partition, ref.run_id), "hooks", f" 1={digest}")
    calls: list[Any] = []
    original = store._run_script
    store._run_script = lambda name, keys, args: calls.append(name) or original(name, keys, args)  # type: ignore[method-assign]
    try:
        WorkflowStub.resume_hook(token, {"paid": True}, store=store)
    finally:
        store._run_script = original  # type: ignore[method-assign]
    assert calls == ["resume_hook"]
    inbox = [ev.decode(raw) for raw in store.redis.lrange(store.keys.inbox(ref.partition, ref.run_id), 0, -1)]
    assert [(e.type, getattr(e.event, "id", "")) for e in inbox][-1] == ("HookResumed", "1")
    assert hook_entries(store) == {}
    with pytest.raises(HookError):
        WorkflowStub.resume_hook(token, {}, store=store)


def test_a_token_of_a_closed_run_is_refused_and_deleted(store: RedisStore) -> None:
    stub = WorkflowStub.make(Abandons, store=store).start(True)
    ref = store.ref(stub.id)
    store.redis.hset(
        store.keys.hooks(ref.partition), hooktokens.digest(f"{ref.partition}.x"), f"{ref.run_id}|1"
    )
    stub.terminate("gone")
    store.redis.hset(
        store.keys.hooks(ref.partition), hooktokens.digest(f"{ref.partition}.x"), f"{ref.run_id}|1"
    )
    with pytest.raises(WorkflowClosed):
        WorkflowStub.resume_hook(f"{ref.partition}.x", 1, store=store)
    assert hook_entries(store) == {}


def test_malformed_tokens_are_refused_without_echo(store: RedisStore) -> None:
    for bad in ("secret-value-without-partition", "99.secret-value", "0.secret-value", "².secret-value"):
        with pytest.raises(HookError) as info:
            WorkflowStub.resume_hook(bad, store=store)
        assert "secret" not in str(info.value)


def test_a_rotated_secret_still_derives_older_tokens(
    worker, store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(hooktokens.ENV, "first-secret")
    stub = WorkflowStub.make(Abandons).start(True)
    token = wait_for(lambda: stub.query("hook_token"))
    assert token == hooktokens.derive(b"first-secret", token.split(".")[0] + ".", stub.run_id or "", "1")
    monkeypatch.setenv(hooktokens.ENV, "second-secret,first-secret")
    assert stub.query("hook_token") == token  # replayed under the new list
    monkeypatch.setenv(hooktokens.ENV, "second-secret")
    assert "unavailable" in stub.query("hook_token")  # the old secret dropped: not derivable
