"""A Redis that will not take the connection says why, with what to do.

At ``maxclients`` Redis answers a new connection with ``ERR max number of clients reached``
and closes it (often before the client reads the reply: a broken pipe). The embedded
server's check took that for a server that does not answer, waited 5 s and said "stopped by
a signal?"; the CLI said only "Broken pipe". A Redis that requires a password the URL lacks
(or has wrong), or a URL pointing at another service: the CLI printed redis-py's words
("HELLO must be called with the client already authenticated ...", "Protocol error, got
"<" as reply type byte") and a client call raised redis-py's exceptions, not a
``DurableError``. Real servers and processes; every one a test starts is stopped.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from apps.basic import Sequence
from procs import durable_cli
from redis import exceptions as rexc

from durable import WorkflowStub
from durable.errors import ConfigurationError
from durable.store.connect import closed_by_redis, is_max_clients, unavailable_kind, unsupported_server
from durable.store.embedded import EmbeddedRedis
from durable.store.outage import unavailable_error
from durable.store.redis_store import RedisStore

ROOT = Path(__file__).resolve().parents[1]
REMEDY = "raise maxclients (CONFIG SET maxclients and redis.conf)"


def test_a_refused_connection_is_its_own_kind_with_its_remedy() -> None:
    refused = rexc.ConnectionError("max number of clients reached")
    assert is_max_clients(refused) and unavailable_kind(refused) == "maxclients"
    error = unavailable_error(refused, "redis://h:6379", "start()", 10)
    assert str(error).startswith("Redis at redis://h:6379 refuses commands for now (maxclients: ")
    assert REMEDY in str(error) and error.kind == "maxclients"
    lost = rexc.ConnectionError("Connection closed by server.")
    assert not is_max_clients(lost) and unavailable_kind(lost) == "connection lost"
    broken = rexc.ConnectionError("Error 32 while writing to socket. Broken pipe.")
    broken.__cause__ = BrokenPipeError(32, "Broken pipe")
    assert closed_by_redis(broken) and not closed_by_redis(lost)


def test_an_embedded_server_at_maxclients_is_named_not_waited_for(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / ".durable")
    server.ensure()
    holder = redis.Redis(unix_socket_path=str(server.socket_path))
    try:
        holder.config_set("maxclients", 1)  # this connection is the one
        began = time.monotonic()
        assert EmbeddedRedis(tmp_path / ".durable").ensure() == server.url  # up: its clients say why
        assert time.monotonic() - began < 2.0  # it waited 5 s for a "stalled" server
        env = {k: v for k, v in os.environ.items() if k not in ("DURABLE_REDIS_URL", "DURABLE_HOME")}
        env["PYTHONPATH"] = str(ROOT)
        for _ in range(3):  # the reply is read, or the connection found closed: both named
            done = subprocess.run(
                [sys.executable, "-m", "workers.cli", "status", "any"],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 1, done
            assert done.stderr.startswith(f"error: cannot reach Redis at {server.url}: "), done.stderr
            assert REMEDY in done.stderr and "has not answered" not in done.stderr, done.stderr
        assert server.pid is not None and EmbeddedRedis(tmp_path / ".durable").pid == server.pid
    finally:
        holder.config_set("maxclients", 10000)
        holder.close()
        server.stop()


def test_a_login_redis_refuses_is_named_with_what_to_do(
    fresh_redis: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = redis.Redis.from_url(fresh_redis.url)
    store = RedisStore(fresh_redis.url)  # logged in before the password: its connections stay
    admin.config_set("requirepass", "s3cret-pw")
    try:
        none = fresh_redis.url
        wrong = none.replace("unix://", "unix://:nope@")
        for url, why in ((none, "it requires a password and none was given"), (wrong, "invalid username")):
            done = durable_cli(url, "status", "any")
            assert done.returncode == 1, done
            assert done.stderr.startswith("error: Redis at "), done.stderr
            assert f"refused the login ({why}" in done.stderr and "password in the URL" in done.stderr
            assert "nope" not in done.stderr  # the wrong password is masked
            worker = durable_cli(url, "worker", "--app", "apps.basic")  # ends at once: it cannot log in
            assert worker.returncode == 1 and "refused the login" in worker.stderr, worker.stderr
            assert "Traceback" not in worker.stderr, worker.stderr
        # The client's call: a DurableError at once (a password stays wrong: nothing to wait out).
        monkeypatch.setenv("DURABLE_REDIS_URL", none)
        began = time.monotonic()
        with pytest.raises(ConfigurationError, match=r"refused the login \(it requires a password"):
            WorkflowStub.make(Sequence).start(1)
        assert time.monotonic() - began < 5
    finally:
        store.redis.config_set("requirepass", "")
        store.close()
        admin.close()


class _NotRedis(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # quiet
        pass


def test_a_url_pointing_at_another_service_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotRedis)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"redis://127.0.0.1:{server.server_address[1]}"
    try:
        done = durable_cli(url, "status", "any")
        assert done.returncode == 1, done
        assert done.stderr.startswith(f"error: the server at {url} does not answer as Redis does ("), (
            done.stderr
        )
        assert "check the URL's host and port" in done.stderr
        monkeypatch.setenv("DURABLE_REDIS_URL", url)
        with pytest.raises(ConfigurationError, match="does not answer as Redis does"):
            WorkflowStub.make(Sequence).start(1)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_redis_older_than_6_2_is_refused_naming_its_version(redis_url: str) -> None:
    """Checked when a store opens (``INFO server``): before, a worker on Redis 6.0 ran until
    its first reclaim's XAUTOCLAIM failed in a script. No older server is at hand here, so the
    sentence is checked on INFO replies, and a real (newer) server is taken."""
    for version in ("5.0.7", "6.0.16", "6.1"):
        said = unsupported_server("redis://db:6379", {"redis_version": version})
        assert said is not None and said.startswith(f"Redis at redis://db:6379 is version {version};")
        assert "needs Redis 6.2 or newer" in said
    for fine in ("6.2.0", "6.2", "6.2.14", "7.2.4", "8.0.0", ""):
        assert unsupported_server("redis://db:6379", {"redis_version": fine}) is None
    assert unsupported_server("redis://db:6379", {}) is None
    version = redis.Redis.from_url(redis_url).info("server")["redis_version"]
    assert unsupported_server(redis_url, {"redis_version": version}) is None
    RedisStore(redis_url).close()  # opens: the check passes on the server the suite runs
