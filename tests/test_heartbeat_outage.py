"""An activity that heartbeats through a Redis outage goes on, and is not timed out for the
heartbeats the outage kept from being written.

Its heartbeat raised redis's ConnectionError into the activity's code (documented to raise only
ActivityCancelledError), and once Redis was back the schedulers failed every heartbeating
attempt whose deadline had passed meanwhile (``timed out (heartbeat)``): a 12 s Redis restart
failed the run of an activity on its last attempt (an acceptance tester's). A real Redis
(``appendfsync always``), SIGKILLed and started again on its AOF; a worker in a thread.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from apps.failures import HeartbeatsThroughOutages
from test_redis_oom_surface import kept_full
from waiting import wait_for

from durable.store.embedded import EmbeddedRedis
from durable.store.redis_store import RedisStore
from durable.testing import TestEnvironment

pytestmark = pytest.mark.fault


def test_an_activity_heartbeating_through_a_redis_restart_goes_on_and_completes(
    killable_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    log = tmp_path / "beats.log"
    store = RedisStore(killable_redis.url)
    with TestEnvironment(store=store) as env:
        stub = env.start(HeartbeatsThroughOutages, str(log), 12.0, id="beats")
        wait_for(lambda: log.exists(), timeout=20)
        time.sleep(1.0)
        killable_redis.kill()
        time.sleep(5.0)  # more than the activity's heartbeat timeout (2 s)
        killable_redis.ensure()
        assert stub.result(timeout=60) == "done"
    assert log.read_text().splitlines() == ["began attempt 1"]


def test_an_activity_heartbeating_while_redis_refuses_writes_goes_on_and_completes(
    fresh_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    # At maxmemory its heartbeat raised the refused script's error (an opaque script hash) into
    # the activity, and spent an attempt.
    log = tmp_path / "beats.log"
    store = RedisStore(fresh_redis.url)
    client = redis.Redis.from_url(fresh_redis.url)
    try:
        with TestEnvironment(store=store) as env:
            stub = env.start(HeartbeatsThroughOutages, str(log), 12.0, id="beats-oom")
            wait_for(lambda: log.exists(), timeout=20)
            with kept_full(client):
                time.sleep(5.0)  # more than the activity's heartbeat timeout (2 s)
            assert stub.result(timeout=60) == "done"
    finally:
        client.close()
    assert log.read_text().splitlines() == ["began attempt 1"]
