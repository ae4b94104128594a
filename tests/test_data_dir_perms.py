"""Issue 14 item 11: the embedded server's data dir and files are private to their owner."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from durable.errors import ConfigurationError
from durable.store.embedded import EmbeddedRedis


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    data = tmp_path / "home" / ".durable"
    data.mkdir(parents=True, mode=0o755)
    data.chmod(0o755)  # an existing, world-readable dir: what the issue found
    server = EmbeddedRedis(data)
    try:
        yield server
    finally:
        server.stop()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_existing_world_readable_dir_is_tightened_and_files_are_private(server: EmbeddedRedis) -> None:
    url = server.ensure()
    client = redis.Redis.from_url(url)
    try:
        client.set("secret", "4111 1111 1111 1111")
        client.execute_command("BGREWRITEAOF")  # the rewrite creates new files too
        client.set("after", "1")
    finally:
        client.close()
    assert _mode(server.data_dir) == 0o700
    files = [p for p in server.data_dir.rglob("*") if p.is_file()]
    assert any("appendonly" in p.name for p in files), files
    for path in files:
        if path.name != ".gitignore":
            assert _mode(path) & 0o077 == 0, f"{path.name} is {oct(_mode(path))}"


def test_gitignore_is_dropped_and_kept(tmp_path: Path) -> None:
    data = tmp_path / ".durable"
    server = EmbeddedRedis(data)
    try:
        server.ensure()
        ignore = data / ".gitignore"
        assert ignore.read_text().splitlines()[-1] == "*"
        ignore.write_text("custom\n")  # a user's own file is left alone
        server.stop()
        server.ensure()
        assert ignore.read_text() == "custom\n"
    finally:
        server.stop()
    assert _mode(data) == 0o700


def test_a_dir_that_cannot_be_made_private_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user's dir: chmod is refused (simulated: the suite may run as root, who may chmod)."""
    data = tmp_path / "theirs"
    data.mkdir(mode=0o755)
    data.chmod(0o755)

    def refuse(self: Path, mode: int) -> None:
        raise PermissionError(1, "Operation not permitted", str(self))

    monkeypatch.setattr(Path, "chmod", refuse)
    with pytest.raises(ConfigurationError, match=r"cannot be made private \(0700\).*DURABLE_HOME"):
        EmbeddedRedis(data).ensure()
