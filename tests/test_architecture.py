"""The shape of the library: stored event names are pinned, and its modules import no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

from test_layout import _cycles, _graph

import durable
from durable import errors
from durable import events as ev

ROOT = Path(durable.__file__).parent

#: Every event type name written to history. Stored data: a name here never changes.
STORED_EVENT_TYPES = {
    "ActivityCancelled",
    "ActivityCompleted",
    "ActivityFailed",
    "ActivityScheduled",
    "CancelRequested",
    "SearchAttributesUpserted",
    "MemoUpserted",
    "ChildCompleted",
    "ChildFailed",
    "ChildStarted",
    "HookCreated",
    "HookResumed",
    "SideEffectRecorded",
    "SignalReceived",
    "SignalWaitStarted",
    "TimerCancelled",
    "TimerFired",
    "TimerStarted",
    "UpdateAccepted",
    "UpdateCompleted",
    "UpdateRejected",
    "UpdateRequested",
    "VersionMarker",
    "WorkflowCancelled",
    "WorkflowCompleted",
    "WorkflowContinuedAsNew",
    "WorkflowFailed",
    "WorkflowStarted",
    "WorkflowTerminated",
    "WorkflowTimeoutFired",
}


def test_stored_event_type_names_are_pinned() -> None:
    assert set(ev.CATALOG) == STORED_EVENT_TYPES
    for name, cls in ev.CATALOG.items():
        assert "TYPE" in vars(cls), f"{cls.__name__} must name its stored type explicitly"
        assert name == cls.TYPE
    assert set(ev.STATUS_OF_CLOSING) == {cls.TYPE for cls in ev.CLOSING}


#: Events a decision writes and replay checks against the code; an input event here (or a command
#: missing) changes what replay compares, so the set is pinned too.
COMMAND_EVENT_TYPES = {
    "ActivityCancelled", "ActivityScheduled", "ChildStarted", "HookCreated", "MemoUpserted",
    "SearchAttributesUpserted", "SideEffectRecorded", "SignalWaitStarted", "TimerCancelled",
    "TimerStarted", "UpdateCompleted", "VersionMarker", "WorkflowCancelled", "WorkflowCompleted",
    "WorkflowContinuedAsNew", "WorkflowFailed",
}  # fmt: skip


def test_command_events_are_pinned() -> None:
    assert {cls.TYPE for cls in ev.CATALOG.values() if cls.is_command} == COMMAND_EVENT_TYPES


def test_event_classes_do_not_share_names_with_errors() -> None:
    error_names = {name for name, obj in vars(errors).items() if isinstance(obj, type)}
    for cls in ev.CATALOG.values():
        assert cls.__name__ not in error_names
        assert cls.__name__ in (cls.TYPE, cls.TYPE + "Event")


def test_an_event_encodes_its_stored_type_name() -> None:
    event = ev.ActivityFailedEvent(id="1", error=b"x")
    entry = ev.decode(ev.encode(event, 5), seq=1)
    assert entry.type == "ActivityFailed" and entry.event == event


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _top_level_imports(path: Path, modules: set[str]) -> set[str]:
    """The durable modules ``path`` imports when it is imported (not under TYPE_CHECKING)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {m for m in found if m in modules and m != name}


def test_no_import_cycle_among_the_librarys_modules() -> None:
    # tests/test_layout.py checks workers/ the same way.
    assert _cycles(_graph("durable")) == []


def test_replay_and_the_workflow_api_import_no_store() -> None:
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    pure = [n for n in paths if n.startswith("durable.replay") or n in LEAVES | {"durable.workflow"}]
    for name in pure:
        imported = _top_level_imports(paths[name], set(paths))
        assert not [m for m in imported if m.startswith("durable.store")], name


#: Modules the others build on; each imports at most errors, options and immutable.
LEAVES = {
    "durable.errors",
    "durable.immutable",
    "durable.options",
    "durable.ids",
    "durable.runtime",
    "durable.registry",
}


def test_leaf_modules_import_only_errors_options_and_immutable() -> None:
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    # The registry wraps handlers whose parameters are pydantic models (durable.typed_args,
    # itself a leaf over codec.models); nothing else is allowed below a leaf.
    extra = {"durable.registry": {"durable.typed_args"}}
    for name in LEAVES:
        imported = _top_level_imports(paths[name], set(paths))
        allowed = {"durable.errors", "durable.options", "durable.immutable", *extra.get(name, ())}
        assert imported <= allowed, (name, imported)


def test_no_function_level_import_of_durables_own_modules() -> None:
    # A function-level import of a sibling module is how a cycle hides; outside durable
    # (workers, optional dependencies) one may be fine. store/ speaks for itself.
    found = []
    for path in ROOT.rglob("*.py"):
        if "store" in path.relative_to(ROOT).parts:
            continue
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                for node in ast.walk(fn):
                    if (
                        isinstance(node, ast.ImportFrom)
                        and (node.level or (node.module or "").startswith("durable"))
                        or isinstance(node, ast.Import)
                        and any(a.name.startswith("durable") for a in node.names)
                    ):
                        found.append(f"{path.name}:{node.lineno}")
    assert not found
