"""The CLI in the test process (click's runner), for tests that read what a command prints."""

from __future__ import annotations

from click.testing import CliRunner

from workers.cli import cli


def cli_ok(*args: str) -> str:
    """What ``durable ARGS`` prints, asserting it succeeded. Wide (400 columns), so that tables
    do not fold the cells a test reads."""
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False, env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    return result.output
