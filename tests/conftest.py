"""Shared fixtures: a real Redis for the test suite (never a fake).

The Redis, the store and the worker come from durable's own pytest plugin
(:mod:`durable.testing`, registered below): one embedded ``redis-server`` runs for the whole
session in a temporary dir and is stopped when the session ends. Each test that
asks for ``redis_url`` gets it freshly flushed, with ``DURABLE_REDIS_URL``
pointing at it so that code and subprocesses under test find it. The fixtures
below are the suite's short names for the plugin's.

Tests that kill or restart Redis use ``fresh_redis``, a private server of their
own, so the shared one is never disturbed.

Add further fixtures below the section they belong to.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

# Before the import below: the plugin's asserts get pytest's rewriting like any plugin's.
pytest.register_assert_rewrite("durable.testing")

import redis  # noqa: E402

import durable.testing  # noqa: E402
from durable.store.embedded import EmbeddedRedis  # noqa: E402
from durable.store.redis_store import RedisStore  # noqa: E402
from durable.testing import TestEnvironment  # noqa: E402
from workers.worker import Worker  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """Register this checkout's ``durable.testing`` as the suite's plugin.

    Under pytest-xdist (``-n 2``, pyproject.toml) each worker runs with ``COLUMNS=80``, a
    terminal's width, while the CLI output the tests read goes to a pipe (160 columns:
    ``workers/cli/render.py``); they are dropped so the tests see what a pipe gets.

    Started as a background job of a shell without job control (``nohup ... &``, some CI
    runners), the suite inherits SIGINT ignored, and so would every process it starts: a test's
    Ctrl-C to a CLI process would do nothing. The suite takes SIGINT back, as a foreground shell
    gives it, so the processes it starts get it as users' do.

    Users get the plugin from the installed package's ``pytest11`` entry point. The suite
    blocks that one (``-p no:durable.testing`` in pyproject.toml: it would import durable
    from where the package is installed, before ``pythonpath`` puts this checkout first) and
    registers the checkout's module under a name of its own, which the block does not cover.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for name in ("COLUMNS", "LINES"):
            os.environ.pop(name, None)
    if not config.pluginmanager.is_registered(durable.testing):
        config.pluginmanager.register(durable.testing, "durable.testing.suite")


# --------------------------------------------------------------------------- Redis


@pytest.fixture
def redis_server(durable_redis_server: EmbeddedRedis | None) -> EmbeddedRedis:
    """The session's shared embedded Redis (``durable_redis_server``)."""
    if durable_redis_server is None:
        pytest.skip("the suite runs on a Redis given by $DURABLE_TEST_REDIS_URL")
    return durable_redis_server


@pytest.fixture
def redis_url(durable_clean_redis_url: str) -> str:
    """URL of the shared server, emptied and exported as ``DURABLE_REDIS_URL``."""
    return durable_clean_redis_url


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


@pytest.fixture
def killable_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """As ``fresh_redis``, with ``appendfsync always``: a test may SIGKILL it and start it again
    on its AOF (``.kill()``, ``.ensure()``) without losing an acknowledged write."""
    server = EmbeddedRedis(tmp_path / "redis", appendfsync="always")
    server.ensure()
    try:
        yield server
    finally:
        server.stop()


# ------------------------------------------------------------------ durable runtime


@pytest.fixture
def store(durable_store: RedisStore) -> RedisStore:
    """A RedisStore on the flushed shared server (``durable_store``)."""
    return durable_store


@pytest.fixture(params=["queued", "eager"])
def worker(durable_store: RedisStore, request: pytest.FixtureRequest) -> Iterator[Worker]:
    """A worker running in a thread of the test process, stopped after the test.

    Every test using it runs twice: activities through the task streams, and in
    eager mode (the worker runs them itself and commits each result with the
    next decision).
    """
    with TestEnvironment(store=durable_store, eager=request.param == "eager") as env:
        yield env.worker
