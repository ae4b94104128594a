"""The registry of workflow and activity definitions, keyed by durable name.

A durable name is what history and tasks record, so it must mean one thing:
a second, different definition under a taken name is refused when it is
defined. Re-defining the *same* object (a module imported twice, e.g. as
``__main__`` and by name) replaces the entry quietly.

This module imports neither :mod:`durable.activity` nor :mod:`durable.workflow`:
their base classes register each subclass here when it is defined.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ConfigurationError, UnknownTypeError
from .options import RetryPolicy, Seconds, to_seconds
from .typed_args import check_call, convert, typed_method

if TYPE_CHECKING:
    from .activity import Activity
    from .store.workers import WorkerRegistry
    from .workflow import Workflow

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:\-]{0,199}$")


@dataclass(frozen=True)
class ActivityDefinition:
    """A registered activity: its name, how to call it, and its defaults."""

    name: str
    fn: Callable[..., Any]
    queue: str | None = None
    retry: RetryPolicy | None = None
    start_to_close_timeout: float | None = None
    schedule_to_close_timeout: float | None = None
    heartbeat_timeout: float | None = None
    origin: str = ""
    module: str = ""
    #: The function whose annotations type the arguments (``fn``, or an Activity's ``handle``).
    annotated: Callable[..., Any] | None = None

    def typed_args(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """``args`` with model-annotated ones validated into their types (:mod:`durable.typed_args`).

        Raises:
            SerializationError: an argument does not validate (naming the field).
        """
        target = self.annotated or self.fn
        skip = 1 if self.annotated is not None else 0
        return convert(target, tuple(args), f"activity {self.name!r}", skip=skip)


_workflows: dict[str, type[Workflow]] = {}
_activities: dict[str, ActivityDefinition] = {}
#: Registered Activity subclasses -> their durable names.
_activity_classes: dict[type, str] = {}


def _origin(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')}"


def _same_origin(a: str, b: str) -> bool:
    # A script run as __main__ and later imported by name is the same definition.
    return (
        a == b
        or a.split(".", 1)[-1] == b.split(".", 1)[-1]
        and "__main__" in (a.split(".")[0], b.split(".")[0])
    )


def check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigurationError(
            f"invalid {what} name {name!r}: use 1-200 characters from letters, digits, _ . : -, "
            "starting with a letter or _"
        )
    return name


def register_workflow_class(cls: type[Workflow]) -> None:
    name = check_name(cls.__dict__.get("name") or cls.__name__, "workflow")
    cls.name = name
    existing = _workflows.get(name)
    if existing is not None and existing is not cls and not _same_origin(_origin(existing), _origin(cls)):
        raise ConfigurationError(
            f"workflow name {name!r} is already taken by {_origin(existing)}; "
            f"set a distinct `name = ...` on {_origin(cls)}"
        )
    _workflows[name] = cls
    _typed_handlers(cls)


def _typed_handlers(cls: type[Workflow]) -> None:
    """Let the class's handlers take pydantic models from plain values (see durable.typed_args)."""
    typed_method(cls, "handle", f"workflow {cls.name!r}")
    for kind, table in (("signal", cls._signals), ("query", cls._queries)):
        for name, attr in table.items():
            typed_method(cls, attr, f"{kind} {name!r} of workflow {cls.name!r}")
    for name, (attr, validator) in cls._updates.items():
        typed_method(cls, attr, f"update {name!r} of workflow {cls.name!r}")
        if validator:
            typed_method(cls, validator, f"update {name!r} of workflow {cls.name!r}")


def register_activity_class(cls: type[Activity]) -> None:
    name = check_name(cls.__dict__.get("name") or cls.__name__, "activity")
    cls.name = name
    _activity_classes[cls] = name

    def call(*args: Any) -> Any:
        return cls().handle(*args)

    _register_activity(
        ActivityDefinition(
            name=name,
            fn=call,
            queue=cls.queue,
            retry=cls.retry,
            start_to_close_timeout=to_seconds(cls.start_to_close_timeout, f"{name}.start_to_close_timeout"),
            schedule_to_close_timeout=to_seconds(
                cls.schedule_to_close_timeout, f"{name}.schedule_to_close_timeout"
            ),
            heartbeat_timeout=to_seconds(cls.heartbeat_timeout, f"{name}.heartbeat_timeout"),
            origin=_origin(cls),
            module=cls.__module__,
            annotated=cls.handle,
        )
    )


def _register_activity(definition: ActivityDefinition) -> None:
    existing = _activities.get(definition.name)
    if existing is not None and not _same_origin(existing.origin, definition.origin):
        raise ConfigurationError(
            f"activity name {definition.name!r} is already taken by {existing.origin}; "
            f"give {definition.origin} a distinct name"
        )
    _activities[definition.name] = definition


def register_activity(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    queue: str | None = None,
    retry: RetryPolicy | None = None,
    start_to_close_timeout: Seconds | None = None,
    schedule_to_close_timeout: Seconds | None = None,
    heartbeat_timeout: Seconds | None = None,
) -> Any:
    """Register a plain function as an activity (usable as a decorator).

    Plain functions work without it too: ``activity(fn)`` uses ``fn.__name__``
    and a worker finds module-level functions of its ``--app`` modules. Use it
    to set a durable name or defaults, or to refuse a clash at import time.

    Example:
        ```python
        @register_activity(name="send-email", retry=RetryPolicy(max_attempts=3))
        def send_email(to: str) -> None: ...
        ```
    """

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        durable_name = check_name(name or f.__name__, "activity")
        _register_activity(
            ActivityDefinition(
                name=durable_name,
                fn=f,
                queue=queue,
                retry=retry,
                start_to_close_timeout=to_seconds(start_to_close_timeout, "start_to_close_timeout"),
                schedule_to_close_timeout=to_seconds(schedule_to_close_timeout, "schedule_to_close_timeout"),
                heartbeat_timeout=to_seconds(heartbeat_timeout, "heartbeat_timeout"),
                origin=_origin(f),
                module=f.__module__,
            )
        )
        f.__durable_activity__ = durable_name  # type: ignore[attr-defined]
        return f

    return wrap(fn) if fn is not None else wrap


def plain_functions(module: Any) -> list[tuple[str, Any]]:
    """A module's top-level public functions defined there: what a worker serving it runs as
    activities by name (:func:`register_module_functions`)."""
    return [
        (attr, value)
        for attr, value in vars(module).items()
        if callable(value)
        and getattr(value, "__module__", None) == module.__name__
        and type(value).__name__ == "function"
        and not attr.startswith("_")
        and _NAME.match(attr)
    ]


def register_module_functions(module: Any) -> None:
    """Make a module's top-level plain functions callable as activities by name.

    Explicit registrations win; a function whose name is taken is skipped, except by a function
    registered explicitly under that name (``@register_activity(name=...)``): ``activity(fn)``
    of this one would run that one.

    Raises:
        ConfigurationError: such a clash (a rename that kept the old function beside the new).
    """
    for attr, value in plain_functions(module):
        taken = _activities.get(attr)
        if taken is None:
            _activities[attr] = ActivityDefinition(
                name=attr, fn=value, origin=_origin(value), module=module.__name__
            )
        elif not _shadowed(value, taken):
            continue
        elif getattr(taken.fn, "__durable_activity__", None) != attr:
            # Two plain functions of one name (helpers are often alike: `main`): refused only if
            # a workflow calls activity() with the second one; said beforehand (name_clashes()).
            _clashes[attr] = (taken.origin, _origin(value))
        else:
            raise ConfigurationError(
                f"two activities named {attr!r}: {taken.origin} (@register_activity(name={attr!r})) and "
                f"the function {_origin(value)}; activity({attr}) would run the first; rename or "
                "remove one of them"
            )


def activity_name(target: Any) -> str:
    """The durable name an ``activity(target)`` call refers to, without registering anything.

    Args:
        target: An ``Activity`` subclass, a named function, or a name (str).

    Raises:
        ConfigurationError: ``target`` is none of those, or the name is invalid.
    """
    if isinstance(target, str):
        return check_name(target, "activity")
    if isinstance(target, type) and target in _activity_classes:
        return _activity_classes[target]
    if callable(target):
        name = getattr(target, "__durable_activity__", None) or getattr(target, "__name__", None)
        if name and name != "<lambda>":
            return check_name(name, "activity")
        raise ConfigurationError("an activity must be an Activity class, a named function or a name (str)")
    raise ConfigurationError(f"not an activity: {target!r} (use an Activity subclass, a function or a name)")


def activity_definition_for(target: Any) -> ActivityDefinition:
    """The definition an ``activity(target)`` call refers to (class, function or name).

    A plain function that is not registered yet is registered under its name.
    """
    name = activity_name(target)
    found = _activities.get(name)
    if found is not None:
        if found.fn is not target and _shadowed(target, found):  # (the same function: the usual case)
            how = (
                f"@register_activity(name={name!r})"
                if getattr(found.fn, "__durable_activity__", None) == name
                else "a function of that name, registered first"
            )
            raise ActivityNameClash(
                f"activity({_origin(target)}): the activity name {name!r} is registered to "
                f"{found.origin} ({how}), so this call would run that function instead; rename one "
                "of them, or call the activity by its registered function"
            )
        return found
    if isinstance(target, str):
        return ActivityDefinition(name=name, fn=_missing(name))
    found = _activities[name] = ActivityDefinition(
        name=name, fn=target, origin=_origin(target), module=target.__module__
    )
    return found


_clashes: dict[str, tuple[str, str]] = {}


def name_clashes(modules: Iterable[str] | None = None) -> list[str]:
    """Plain functions of the loaded app modules that share a name with another one, in words:
    ``activity()`` of the second is refused (its run blocked) -- say it before a run meets it.
    ``modules``: only clashes one of these modules' functions is in (default: all)."""
    wanted = None if modules is None else set(modules)
    return [
        f"activity name {name!r} is held by {first}; activity({second}) would be refused (its run "
        "blocked): rename one of them if it is an activity"
        for name, (first, second) in sorted(_clashes.items())
        if wanted is None or {first.rsplit(".", 1)[0], second.rsplit(".", 1)[0]} & wanted
    ]


class ActivityNameClash(ConfigurationError):
    """``activity(fn)`` of a function whose durable name another function holds in this process."""


def _shadowed(target: Any, found: ActivityDefinition) -> bool:
    """Whether ``target``, a plain function, shares its durable name with another function
    registered under it (explicitly or by its own name; a test's override is no other function)."""
    return (
        callable(target)
        and not isinstance(target, type | str)
        and getattr(target, "__durable_activity__", None) is None
        and _same_origin(found.origin, _origin(found.fn))
        and not _same_origin(found.origin, _origin(target))
    )


def override_activity(target: Any, fn: Callable[..., Any]) -> Callable[[], None]:
    """Make the activity ``target`` call ``fn`` in this process, until the returned undo is called.

    The activity keeps its registered options (queue, retry, timeouts); an
    activity not registered yet gets a definition with defaults. Meant for
    tests (``TestEnvironment.mock_activity``); undo overrides in reverse order.

    Returns:
        A function that restores what was registered before.
    """
    name = activity_name(target)
    previous = _activities.get(name)
    if previous is not None:
        _activities[name] = dataclasses.replace(previous, fn=fn)
    else:
        _activities[name] = ActivityDefinition(
            name=name, fn=fn, origin=f"mock:{name}", module=getattr(target, "__module__", "") or ""
        )

    def undo() -> None:
        if previous is None:
            _activities.pop(name, None)
        else:
            _activities[name] = previous

    return undo


def _missing(name: str) -> Callable[..., Any]:
    def fail(*_: Any) -> Any:
        raise UnknownTypeError(f"activity {name!r} is not registered in this worker")

    return fail


def get_activity(name: str) -> ActivityDefinition:
    """The registered activity ``name``; :class:`UnknownTypeError` if there is none."""
    found = _activities.get(name)
    if found is None:
        raise UnknownTypeError(
            f"activity {name!r} is not registered in this process; start the worker with the "
            "--app module that defines it"
        )
    return found


def get_workflow(name: str) -> type[Workflow]:
    """The registered workflow class ``name``; :class:`UnknownTypeError` if there is none."""
    found = _workflows.get(name)
    if found is None:
        raise UnknownTypeError(
            f"workflow type {name!r} is not registered in this process; import the module that "
            "defines it (worker: --app module)"
        )
    return found


def start_patches(workflow_type: str, queue: str, store: WorkerRegistry) -> list[str]:
    """The patches a new run of ``workflow_type`` records (what ``patched()`` answers in it):
    its class's ``Workflow.patches`` when this process defines it; else those the live workers
    serving ``queue`` declare for the type (a start by name -- the CLI or the HTTP API without
    ``--app``, a schedule or a child of a type this process lacks -- runs on their code)."""
    cls = _workflows.get(workflow_type)
    if cls is not None:
        return list(cls.patches)
    return store.declared_patches(workflow_type, queue)


def start_queue(workflow_type: str, given: str | None = None) -> str:
    """The task queue a run of ``workflow_type`` starts on: ``given``, else its class's when
    registered in this process, else ``default`` (what a start writes, and what a warning
    about a queue no worker serves must name)."""
    if given:
        return given
    cls = _workflows.get(workflow_type)
    return cls.queue if cls is not None else "default"


def workflows() -> dict[str, type[Workflow]]:
    return dict(_workflows)


def declared_patches(names: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The ``Workflow.patches`` of the registered workflow types ``names`` that declare some."""
    found = {name: _workflows.get(name) for name in names}
    return {name: tuple(cls.patches) for name, cls in found.items() if cls is not None and cls.patches}


def activities() -> dict[str, ActivityDefinition]:
    return dict(_activities)


def check_start(code: type[Workflow] | str, args: tuple[Any, ...], what: str) -> None:
    """:func:`check_call` of workflow ``code``'s ``handle`` (a class, or a type name this process
    registered), when there is one: a schedule whose every run would fail on its arguments is
    refused when written, as ``start()`` is (``what`` names the caller: ``schedule s1``)."""
    cls = _workflows.get(code) if isinstance(code, str) else code
    if cls is not None:
        check_call(cls.handle, args, f"{what}: {cls.__name__}.handle", skip=1)


def check_signal(code: type | str, name: str, args: tuple[Any, ...]) -> None:
    """:func:`check_call` of the ``@signal`` handler ``name`` of workflow ``code`` (a class, or a
    type name this process registered), when there is one: a sender that has the code refuses
    what the handler would, before anything is written (the run would drop it, a dead letter,
    and the sender -- an HTTP endpoint's caller -- was told it was sent)."""
    cls = _workflows.get(code) if isinstance(code, str) else code
    attr = getattr(cls, "_signals", {}).get(name)
    if cls is not None and attr is not None:
        check_call(getattr(cls, attr), args, f"@signal {name!r} of {cls.__name__}", skip=1)
