"""Redis set up to lose durable's data (an evicting ``maxmemory-policy``, no AOF) is said.

Nothing else would say it: eviction deletes keys without an error, and a Redis without an
append-only file loses its writes only when it restarts. So a worker logs a WARNING at its
start, ``durable workers`` prints a ``warning:`` line (``warnings`` in ``--json``), and the
server's ``/healthz`` (still healthy), ``/api/v1/workers`` and the UI's workers page carry them
(the page: ``tests/test_ui.py``). Real processes on a private Redis (``fresh_redis``); every
process a test starts is stopped by pid.
"""

from __future__ import annotations

import json
from pathlib import Path

import redis
from procs import durable_cli, spawn_logged_worker, stop
from server_procs import ServerProc
from waiting import wait_for

from durable.store.embedded import EmbeddedRedis
from durable.store.memory import setup_hazards
from durable.store.redis_store import RedisStore

EVICTS = "Redis evicts keys at its maxmemory"
NO_AOF = "Redis keeps no append-only file"
NEAR = "Redis is at "
NO_FSYNC = "Redis leaves its append-only file to the OS to flush"


def test_setup_hazards_name_eviction_under_a_limit_and_a_missing_aof() -> None:
    safe = {"maxmemory": 0, "maxmemory_policy": "noeviction"}
    assert setup_hazards(safe, {"aof_enabled": 1}) == ()
    # A policy evicts only under a limit: without maxmemory (64-bit) Redis never evicts.
    assert setup_hazards({"maxmemory": 0, "maxmemory_policy": "allkeys-lru"}, {"aof_enabled": 1}) == ()
    for policy in ("allkeys-lru", "volatile-ttl", "allkeys-random"):
        (said,) = setup_hazards({"maxmemory": 3 * 2**30, "maxmemory_policy": policy}, {"aof_enabled": 1})
        assert said.startswith(EVICTS) and f"maxmemory-policy {policy}" in said and "3.0 GiB" in said
        assert "set maxmemory-policy noeviction" in said
    (said,) = setup_hazards(safe, {"aof_enabled": 0})
    assert said.startswith(NO_AOF) and "set appendonly yes" in said
    assert setup_hazards({}, {}) == ()  # INFO that does not say: nothing is guessed
    (said,) = setup_hazards(safe, {"aof_enabled": 1, "appendfsync": "no"})
    assert said.startswith(NO_FSYNC) and "set appendfsync everysec or always" in said
    for fine in ("everysec", "always"):
        assert setup_hazards(safe, {"aof_enabled": 1, "appendfsync": fine}) == ()
    assert [h[:30] for h in setup_hazards(safe, {"aof_enabled": 0, "appendfsync": "no"})] == [NO_AOF[:30]]
    # Near maxmemory under noeviction: said before writes stop (at the limit it is the problem).
    limit = 1000 * 2**20
    for used, said_near in (
        (500, False),
        (799, False),
        (800, True),
        (950, True),
        (998, True),
        (999, False),  # within HEADROOM (1 MiB) of the limit: refused, the views' problem
        (1000, False),
    ):
        state = {"maxmemory": limit, "used_memory": used * 2**20, "maxmemory_policy": "noeviction"}
        near = [h for h in setup_hazards(state, {"aof_enabled": 1}) if h.startswith(NEAR)]
        assert bool(near) == said_near, (used, near)
    (near,) = setup_hazards(
        {"maxmemory": limit, "used_memory": 850 * 2**20, "maxmemory_policy": "noeviction"}, {"aof_enabled": 1}
    )
    assert (
        near.startswith("Redis is at 85% of its maxmemory (850.0 MiB of 1000.0 MiB)")
        and "durable purge" in near
    )


def test_a_redis_that_can_lose_data_is_said_by_workers_the_cli_and_the_server(
    fresh_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    url = fresh_redis.url
    client = redis.Redis.from_url(url)
    store = RedisStore(url)
    client.config_set("maxmemory", 2**30)
    client.config_set("maxmemory-policy", "allkeys-lru")
    client.config_set("appendonly", "no")
    worker_log = tmp_path / "worker.log"
    worker = spawn_logged_worker(url, worker_log)
    server = ServerProc(url, tmp_path / "server.log")
    try:
        wait_for(lambda: "serving queues" in worker_log.read_text(), timeout=30)
        log = worker_log.read_text()
        for hazard in (EVICTS, NO_AOF):
            assert [line for line in log.splitlines() if "WARNING" in line and hazard in line], log

        shown = durable_cli(url, "workers")
        assert shown.returncode == 0, shown.stderr
        said = [line for line in shown.stdout.splitlines() if line.startswith("warning: ")]
        assert [line.split(" (")[0] for line in said] == [f"warning: {EVICTS}", f"warning: {NO_AOF}"], (
            shown.stdout
        )
        report = json.loads(durable_cli(url, "workers", "--json").stdout)
        assert [w.split(" (")[0] for w in report["warnings"]] == [EVICTS, NO_AOF]
        assert report["problem"] is None  # nothing refused: runs move meanwhile

        with server.client() as http:
            health = http.get("/healthz")
            assert health.status_code == 200, health.text  # a hazard, not an outage
            assert health.json()["warnings"] == report["warnings"]
            assert http.get("/api/v1/workers").json()["warnings"] == report["warnings"]

            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("appendonly", "yes")
            assert http.get("/healthz").json() == {"status": "ok", "warnings": []}
        assert json.loads(durable_cli(url, "workers", "--json").stdout)["warnings"] == []
        assert "warning:" not in durable_cli(url, "workers").stdout
    finally:
        server.stop()
        stop(worker)
        store.close()
        client.config_set("maxmemory", 0)
        client.close()


def test_a_redis_near_its_maxmemory_is_said_before_writes_stop(fresh_redis: EmbeddedRedis) -> None:
    url = fresh_redis.url
    client = redis.Redis.from_url(url)
    try:
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", int(used / 0.9))  # ~90 % used: writes still accepted
        report = json.loads(durable_cli(url, "workers", "--json").stdout)
        assert report["problem"] is None, report["problem"]
        (near,) = report["warnings"]
        assert near.startswith(NEAR) and "% of its maxmemory" in near and "raise maxmemory" in near
        client.config_set("maxmemory", used * 4)
        assert json.loads(durable_cli(url, "workers", "--json").stdout)["warnings"] == []
    finally:
        client.config_set("maxmemory", 0)
        client.close()


def test_an_aof_never_fsynced_is_said(fresh_redis: EmbeddedRedis) -> None:
    """``appendfsync`` is not in INFO: read with ``CONFIG GET`` in the same round trip (a Redis
    that refuses CONFIG says nothing of it)."""
    url = fresh_redis.url
    client = redis.Redis.from_url(url)
    try:
        client.config_set("appendfsync", "no")
        (said,) = json.loads(durable_cli(url, "workers", "--json").stdout)["warnings"]
        assert said.startswith(NO_FSYNC), said
        client.config_set("appendfsync", "everysec")
        assert json.loads(durable_cli(url, "workers", "--json").stdout)["warnings"] == []
    finally:
        client.config_set("appendfsync", "everysec")
        client.close()
