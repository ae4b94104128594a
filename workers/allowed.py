"""Which workflow and activity types a worker may run: those its ``--app`` modules define."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from durable import registry


def defined_in(modules: Sequence[str]) -> Callable[[str], bool]:
    """Whether a module name is one of ``modules`` (or inside one); with none, anything is."""
    prefixes = tuple(modules)

    def check(module: str) -> bool:
        return not prefixes or any(module == m or module.startswith(m + ".") for m in prefixes)

    return check


class Allowed:
    """Which workflow and activity types this worker may run: those its ``--app`` modules
    define. Asked once per decision and per activity: an allowed name is remembered."""

    def __init__(self, app: Sequence[str]) -> None:
        self._defined = defined_in(app)
        self._workflows: set[str] = set()
        self._activities: set[str] = set()

    def workflow(self, name: str) -> bool:
        if name in self._workflows:
            return True
        cls = registry.workflows().get(name)
        ok = cls is not None and self._defined(cls.__module__)
        if ok:
            self._workflows.add(name)
        return ok

    def activity(self, name: str) -> bool:
        if name in self._activities:
            return True
        definition = registry.activities().get(name)
        # durable's own activities (opening a worker session) run on every worker.
        ok = definition is not None and (
            self._defined(definition.module) or definition.module.startswith("durable.")
        )
        if ok:
            self._activities.add(name)
        return ok
