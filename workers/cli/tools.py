"""Commands around the engine: replay and check (no Redis), demo, hook resume."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import click
from rich.text import Text

from durable import DurableError, NondeterminismError, WorkflowStub, registry
from durable.replay import replay_history
from workers.cli.core import (
    CliError,
    CliState,
    DurableGroup,
    Seconds,
    load_apps,
    one_line,
    parse_args,
    pass_state,
)
from workers.cli.export import history_files, load_export
from workers.cli.render import console, history_table, to_json
from workers.config import mask_url
from workers.lint import check_modules, findings_table

from .render import echo

__all__ = ["COMMANDS", "load_example"]


@click.command()
@click.argument("target", metavar="FILE_OR_DIR", type=click.Path(path_type=Path))
@click.option(
    "--app", "apps", multiple=True, required=True, metavar="MODULE", help="Module(s) with today's code."
)
def replay(target: Path, apps: tuple[str, ...]) -> None:
    """Replay exported histories (`durable history ID --json`) against today's code.

    Prints OK or DIVERGED per file; exits 1 if any diverged or could not be read.
    Needs no Redis.
    """
    load_apps(apps)
    bad = 0
    for path in history_files(target):
        try:
            entries = load_export(path)
        except (DurableError, CliError) as exc:
            bad += 1
            said = one_line(exc)  # most start with the file's name; an entry's decode error not
            echo(f"ERROR {said}" if said.startswith(str(path)) else f"ERROR {path}: {said}")
            continue
        try:
            replay_history(entries)
        except NondeterminismError as exc:
            bad += 1
            echo(f"DIVERGED {path}: {one_line(exc)}")
        except (DurableError, CliError) as exc:
            bad += 1
            echo(f"ERROR {path}: {one_line(exc)}")
        else:
            echo(f"OK {path} ({len(entries)} events)")
    if bad:
        sys.exit(1)


@click.command()
@click.option(
    "--app", "apps", multiple=True, required=True, metavar="MODULE", help="Module(s) with the workflows."
)
@click.option("--json", "as_json", is_flag=True, help="Print the findings as a JSON array.")
def check(apps: tuple[str, ...], as_json: bool) -> None:
    """Lint the workflows of the --app modules for calls that break replay.

    Flags wall-clock reads, randomness, environment, network, file I/O,
    threads and time.sleep inside Workflow subclasses, each with file:line
    and the durable alternative. Exits 1 if anything is flagged, 0 if not.
    Silence a line with `# durable: ignore`. Needs no Redis.
    """
    findings, classes = check_modules(load_apps(apps))
    for clash in registry.name_clashes(apps):  # not a replay problem: said, not counted
        echo(f"warning: {clash}", err=True)
    if not classes:  # "OK ... in 0 workflow class(es)" read as a pass (a package importing none)
        raise CliError(
            f"--app {', '.join(apps)} defines no Workflow subclass: name the module(s) that define them "
            "(a package's __init__ that does not import its workflow modules defines none)"
        )
    if as_json:
        echo(to_json([f.to_dict() for f in findings], indent=1))
    elif findings:
        console().print(findings_table(findings))
    else:
        echo(f"OK: no determinism problems in {classes} workflow class(es)")
    if findings:
        sys.exit(1)


def load_example(name: str = "order") -> ModuleType:
    """``examples/<name>.py`` of the source checkout, imported as ``examples.<name>``.

    ``examples`` is not an installed package, so it is found next to the
    ``workers`` package (an editable install or a checkout) when it cannot be imported.
    """
    module_name = f"examples.{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
    if path.is_file():
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(module_name, None)
                raise
            return module
    try:
        return importlib.import_module(module_name)
    except ImportError:
        raise CliError(
            f"the demo needs examples/{name}.py from the durable source checkout (looked in {path.parent}); "
            "run it from a checkout installed with `pip install -e .`"
        ) from None


@click.command()
@click.option(
    "--timeout", type=Seconds(), default=60.0, show_default=True, help="Seconds to wait for the result."
)
@pass_state
def demo(state: CliState, timeout: float) -> None:
    """Run the order demo: a worker thread, one order workflow, its approval signal, its history."""
    example = load_example("order")
    store = state.store
    out = console()
    out.print(Text.assemble(("durable demo", "bold"), f": Redis at {mask_url(store.url or '')}"))
    summary = example.demo(store, timeout=timeout)
    out.print(
        Text.assemble("workflow ", (summary["workflow_id"], "bold"), f", run {summary['run_id']}: completed")
    )
    out.print_json(to_json(summary["result"]))
    out.print(history_table(summary["history"], title="history"))


@click.group(cls=DurableGroup)
def hook() -> None:
    """Hooks: durable callbacks a workflow creates with create_hook()."""


@hook.command(name="resume")
@click.argument("token", metavar="TOKEN")
@click.argument("payload", metavar="[PAYLOAD_JSON]", required=False, default=None)
@pass_state
def hook_resume(state: CliState, token: str, payload: str | None) -> None:
    """Deliver PAYLOAD_JSON (default: null) to the hook with TOKEN; a token works once.

    PAYLOAD_JSON is a JSON value, or a plain string when it is not valid JSON.
    An unknown or used token exits 1 with one error line.
    """
    value = parse_args([payload])[0] if payload is not None else None
    WorkflowStub.resume_hook(token, value, store=state.existing_store)
    echo("hook resumed")


COMMANDS = [replay, check, demo, hook]
