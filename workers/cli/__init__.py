"""The ``durable`` command: run workers, start and drive runs, inspect and replay histories.

Every command talks to the Redis given by ``--redis URL``, else
``DURABLE_REDIS_URL``, else the embedded server in ``.durable/``: started on
demand by the commands that create work (``worker``, ``dev``, ``start``,
``demo``); those that address existing runs only restart the project's own server
when its data is in ``.durable/`` (they say so when there is none). Errors exit with status 1 and one line on stderr, ``error: ...`` (no
traceback), naming the Redis used with its password masked.

Arguments of workflows, signals and queries are JSON values: each positional
is parsed with ``json.loads`` and, if that fails, taken as a plain string
(``durable start Greet alice`` passes ``"alice"``; ``durable start Add 1 2``
passes two integers; quote JSON strings that look like numbers: ``'"42"'``).

The package is a thin layer over :mod:`durable`:

* :mod:`~workers.cli.core` -- the group, its state (which Redis), error lines, ``--app`` loading;
* :mod:`~workers.cli.runs`, :mod:`~workers.cli.inspect`, :mod:`~workers.cli.worker`,
  :mod:`~workers.cli.fleet`, :mod:`~workers.cli.tools`, :mod:`~workers.cli.schedule`,
  :mod:`~workers.cli.server` -- the commands;
* :mod:`~workers.cli.render` -- JSON and tables; :mod:`~workers.cli.export` -- the history
  export format of ``durable replay``;
* :mod:`~workers.cli.bootstrap` -- a :class:`~workers.config.WorkerConfig` to a running worker.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.cli import fleet, inspect, purge, repair, runs, schedule, server, tools, worker
from workers.cli.core import CliError, cli, parse_args
from workers.cli.export import export_history, load_export
from workers.cli.render import json_default, to_json
from workers.cli.tools import load_example

__all__ = [
    "CliError",
    "cli",
    "export_history",
    "json_default",
    "load_example",
    "load_export",
    "main",
    "parse_args",
    "to_json",
]

for _command in (
    *runs.COMMANDS,
    *repair.COMMANDS,
    *inspect.COMMANDS,
    *worker.COMMANDS,
    *fleet.COMMANDS,
    *tools.COMMANDS,
    *purge.COMMANDS,
    *schedule.COMMANDS,
    *server.COMMANDS,
):
    cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point (``durable = workers.cli:main``)."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="durable")
