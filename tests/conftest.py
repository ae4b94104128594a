"""Shared fixtures: a real Redis for the test suite (never a fake).

One embedded ``redis-server`` (see :mod:`durable.store.embedded`) runs for the
whole session in a temporary dir and is stopped when the session ends. Each test
that asks for ``redis_url`` gets it freshly flushed, with ``DURABLE_REDIS_URL``
pointing at it so that code and subprocesses under test find it.

Tests that kill or restart Redis use ``fresh_redis``, a private server of their
own, so the shared one is never disturbed.

Add further fixtures below the section they belong to.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from durable.store.embedded import EmbeddedRedis
from durable.store.redis_store import RedisStore
from workers.worker import Worker, WorkerThread

# --------------------------------------------------------------------------- Redis


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """The session's shared embedded Redis: started once, stopped at session end."""
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    server.ensure()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis, monkeypatch: pytest.MonkeyPatch) -> str:
    """URL of the shared server, emptied (FLUSHALL) and exported as ``DURABLE_REDIS_URL``."""
    url = redis_server.ensure()  # restarts it if a test took it down
    with redis.Redis.from_url(url) as client:
        client.flushall()
    monkeypatch.setenv("DURABLE_REDIS_URL", url)
    return url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client of the (flushed) shared server, closed after the test."""
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def fresh_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A private, started embedded Redis in its own dir, for tests that kill or restart it.

    Stopped at teardown, whatever state the test left it in.
    """
    server = EmbeddedRedis(tmp_path / "redis")
    server.ensure()
    try:
        yield server
    finally:
        server.stop()


# ------------------------------------------------------------------ durable runtime


@pytest.fixture
def store(redis_url: str) -> Iterator[RedisStore]:
    """A RedisStore on the flushed shared server."""
    s = RedisStore(redis_url)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(params=["queued", "eager"])
def worker(store: RedisStore, request: pytest.FixtureRequest) -> Iterator[Worker]:
    """A worker running in a thread of the test process, stopped after the test.

    Every test using it runs twice: activities through the task streams, and in
    eager mode (the worker runs them itself and commits each result with the
    next decision).
    """
    w = Worker(
        store, concurrency=4, grace=5, claim_idle_ms=2000, block_ms=100, eager=request.param == "eager"
    )
    with WorkerThread(w):
        yield w
