"""Issue 14 item 9: namespaces keep apps on one Redis apart; the ACL recipe confines one.

Two apps on one Redis used to share every key (the default prefix): each one's workers
claimed the other's tasks and parked the workflow types they did not know. Each app now
takes its own namespace (``--namespace``, ``DURABLE_NAMESPACE``, ``RedisStore(namespace=)``),
and an ACL user limited to ``~<namespace>:*`` runs whole workflows and is refused elsewhere.
"""

from __future__ import annotations

import logging
import os
import time

import pytest
import redis
from apps.basic import EVERYTHING_RESULT, Everything, Hooked, Sequence
from click.testing import CliRunner
from procs import workers

from durable import WorkflowStub, config
from durable.errors import ConfigurationError
from durable.store.embedded import EmbeddedRedis
from durable.store.redis_store import RedisStore
from durable.testing import TestEnvironment
from workers.cli import cli

ACL_RULES = ("on", "+@all", "-@dangerous")  # the recipe of docs/security.md, plus its key pattern


def acl_user(server: EmbeddedRedis, name: str, password: str) -> str:
    """Create ACL user ``name`` limited to namespace ``name``'s keys; its URL on ``server``."""
    admin = redis.Redis.from_url(server.url)
    try:
        admin.execute_command("ACL", "SETUSER", name, "reset", *ACL_RULES, f">{password}", f"~{name}:*")
    finally:
        admin.close()
    return f"unix://{name}:{password}@{server.socket_path}"


def wait_for(predicate, timeout: float = 20.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


# --------------------------------------------------------------------------- settings


def test_namespace_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DURABLE_NAMESPACE", raising=False)
    monkeypatch.delenv("DURABLE_PREFIX", raising=False)
    assert config.namespace() == config.DEFAULT_NAMESPACE == "durable"
    monkeypatch.setenv("DURABLE_PREFIX", "legacy")  # the older name still works
    assert config.namespace() == config.key_prefix() == "legacy"
    monkeypatch.setenv("DURABLE_NAMESPACE", "shop")
    with pytest.raises(ConfigurationError, match="disagree"):
        config.namespace()
    monkeypatch.delenv("DURABLE_PREFIX")
    assert config.namespace() == "shop"
    assert config.namespace("billing") == "billing"  # explicit wins
    for bad in ("", "a:b", "a{0}", "shop*", "x" * 65, "a b"):
        with pytest.raises(ConfigurationError, match="namespace"):
            config.check_namespace(bad)


def test_store_takes_the_namespace(redis_url: str, redis_client: redis.Redis) -> None:
    store = RedisStore(redis_url, namespace="shop")
    try:
        assert store.keys.prefix == "shop"
        stub = WorkflowStub.make(Sequence, id="ns-1", store=store)
        stub.start(2)
    finally:
        store.close()
    keys = [k.decode() for k in redis_client.keys("*")]
    assert keys and all(k.startswith("shop:") for k in keys), keys
    with pytest.raises(ConfigurationError, match="namespace"):
        RedisStore(redis_url, namespace="shop:eu")


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("unix:///tmp/x/redis.sock", True),
        ("redis://localhost:6379/0", True),
        ("redis://:pw@127.0.0.1:6379", True),
        ("rediss://[::1]:6380", True),
        ("redis+cluster://127.0.0.1:7000,127.0.0.1:7001", True),
        ("redis://redis.internal:6379", False),
        ("redis://10.0.0.5", False),
        ("redis+cluster://127.0.0.1:7000,10.0.0.7:7001", False),
    ],
)
def test_is_local_redis(url: str, local: bool) -> None:
    assert config.is_local_redis(url) is local


def test_default_namespace_on_a_shared_redis_warns(caplog: pytest.LogCaptureFixture) -> None:
    url = "redis://user:s3cret@redis-h6-test.invalid:6379/0"
    with caplog.at_level(logging.WARNING, logger="durable"):
        assert config.warn_if_shared_default(url, "durable")
        assert not config.warn_if_shared_default(url, "durable")  # once per Redis
        assert not config.warn_if_shared_default("redis://other-h6.invalid", "shop")
        assert not config.warn_if_shared_default("unix:///tmp/x.sock", "durable")
    [record] = caplog.records
    assert "default namespace" in record.getMessage() and "DURABLE_NAMESPACE" in record.getMessage()
    assert "s3cret" not in record.getMessage()


def test_cli_namespace_option(redis_url: str, redis_client: redis.Redis) -> None:
    before = {var: os.environ.get(var) for var in ("DURABLE_NAMESPACE", "DURABLE_PREFIX")}
    runner = CliRunner()
    result = runner.invoke(cli, ["--namespace", "shop", "start", "Sequence", "2", "--id", "cli-ns"])
    assert result.exit_code == 0, result.output
    assert redis_client.keys("durable:*") == []
    assert any(k.startswith(b"shop:") for k in redis_client.keys("*"))
    status = runner.invoke(cli, ["--namespace", "shop", "status", "cli-ns"])
    # No worker runs in the namespace: the status says so (workers of other namespaces do not count).
    assert status.exit_code == 0, status.output
    assert status.output.startswith("pending (blocked: no live worker serves queue 'default'"), status.output
    elsewhere = runner.invoke(cli, ["status", "cli-ns"])  # the default namespace has no such run
    assert elsewhere.exit_code == 1, elsewhere.output
    # The environment is restored after the command (the CLI runs in-process here).
    assert {var: os.environ.get(var) for var in before} == before
    bad = runner.invoke(cli, ["--namespace", "a:b", "status", "x"])
    assert bad.exit_code == 2 and "namespace 'a:b' is not valid" in bad.output


# --------------------------------------------------------------------------- isolation


def test_acl_user_runs_its_namespace_and_is_refused_elsewhere(fresh_redis: EmbeddedRedis) -> None:
    url = acl_user(fresh_redis, "shop", "shop-pw")
    store = RedisStore(url, namespace="shop")
    try:
        with TestEnvironment(store=store) as env:
            stub = env.start(Everything, 10)
            wait_for(lambda: stub.query("progress")["stage"] in ("signal", "bumps"))
            stub.signal("approve", "alice")
            stub.signal("bump", 1)
            stub.signal("bump", 1)
            assert stub.result(timeout=30) == EVERYTHING_RESULT
            hooked = env.start(Hooked)
            token = wait_for(lambda: hooked.query("hook_token"))
            WorkflowStub.resume_hook(str(token), {"paid": True}, store=store)
            assert hooked.result(timeout=30) == {"paid": True}
    finally:
        store.close()
    runner = CliRunner()  # the CLI as that user
    for command in (["list"], ["describe", stub.id], ["history", stub.id], ["workers"]):
        result = runner.invoke(cli, ["--redis", url, "--namespace", "shop", *command])
        assert result.exit_code == 0, (command, result.output)
    purge = runner.invoke(
        cli, ["--redis", url, "--namespace", "shop", "purge", "--closed-before", "2100-01-01", "--yes"]
    )
    assert purge.exit_code == 0 and "purged 3 run(s)" in purge.output, purge.output  # with the child
    client = redis.Redis.from_url(url)
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.set("billing:secret", "x")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.get("durable:meta")
        # Keys a script builds itself are checked too (Redis 6.2 says so as a script error).
        with pytest.raises(redis.exceptions.ResponseError, match="can't access|No permissions"):
            client.eval("return redis.call('GET', 'billing:secret')", 0)
        with pytest.raises(redis.exceptions.NoPermissionError):
            RedisStore(url, namespace="billing")
    finally:
        client.close()
    admin = redis.Redis.from_url(fresh_redis.url)
    try:
        namespaces = {k.split(b":", 1)[0] for k in admin.keys("*")}
    finally:
        admin.close()
    assert namespaces == {b"shop"}


def test_two_apps_on_one_redis_keep_apart(fresh_redis: EmbeddedRedis) -> None:
    """Two apps, each its own ACL user and namespace, the same queue name, real worker processes:
    every run completes and no task is parked for an unknown type (the bug: each app's workers
    took the other's tasks)."""
    shop_url = acl_user(fresh_redis, "shop", "shop-pw")
    billing_url = acl_user(fresh_redis, "billing", "billing-pw")
    shop = RedisStore(shop_url, namespace="shop")
    billing = RedisStore(billing_url, namespace="billing")
    try:
        with (
            workers(shop_url, extra=("--processes", "2"), env={"DURABLE_NAMESPACE": "shop"}),
            workers(billing_url, app="apps.retention", env={"DURABLE_NAMESPACE": "billing"}),
        ):
            stubs = [WorkflowStub.make(Sequence, id=f"s{i}", store=shop).start(3) for i in range(4)]
            stubs += [WorkflowStub.make("Steps", id=f"b{i}", store=billing).start(3) for i in range(4)]
            assert [s.result(timeout=60) for s in stubs] == [3] * 4 + [6] * 4
            # Each namespace's registry lists its own workers only: 2 processes and 1.
            # (the second shop process may register after the runs are done: wait for it)
            wait_for(lambda: len(shop.live_workers()) == 2, timeout=30)
            assert len(billing.live_workers()) == 1
        assert shop.dead_letters() == [] and billing.dead_letters() == []
    finally:
        shop.close()
        billing.close()
