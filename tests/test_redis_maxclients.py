"""Redis at ``maxclients`` refuses new connections: every surface names it and the remedy.

It answers a new connection with ``ERR max number of clients reached`` and closes it (often
before the client reads the reply: a broken pipe). The embedded server's check took that for
a server that does not answer, waited 5 s and said "stopped by a signal?"; the CLI said only
"Broken pipe". Real servers; every one a test starts is stopped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import redis
from redis import exceptions as rexc

from durable.store.connect import closed_by_redis, is_max_clients, unavailable_kind
from durable.store.embedded import EmbeddedRedis
from durable.store.outage import unavailable_error

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
