"""The greenlets that run workflow code and what each one waits on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import greenlet

from .. import codec
from ..runtime import WorkflowGreenlet, WorkflowRuntime

#: Accepted values of ``child(parent_close_policy=...)``.
POLICIES = ("terminate", "request_cancel", "abandon")


class Branch(WorkflowGreenlet):
    """A greenlet running workflow code: the root ``handle()``, one ``all()`` branch or an
    ``@update`` handler."""

    def __init__(
        self, runtime: WorkflowRuntime, path: str, run: Callable[[], Any], parent: greenlet.greenlet
    ) -> None:
        super().__init__(runtime, run, parent)
        self.path = path
        self.counter = 0
        self.wait: Wait | None = None
        self.group: Group | None = None
        self.index = 0
        self.update_id: str | None = None  # the update whose handler this branch runs
        # What its activity and child calls' headers start as (None: the run's); an update
        # handler's branch and the all() branches under it carry its update's.
        self.headers: dict[str, Any] | None = None


@dataclass
class Wait:
    """What a suspended branch waits on."""

    kind: str  # activity | timer | signal | wait_until | child | hook | all | frontier
    id: str
    name: str = ""
    deadline: int | None = None
    predicate: Callable[[], bool] | None = None
    group: Group | None = None
    child_workflow_id: str = ""
    policy: str = ""
    queue: str = ""  # an activity's task queue (the views tell when no live worker serves it)
    wait_cancel: bool = False  # a child's: a cancel waits for the child to close (ChildStarted's)
    cancelled: str | None = None  # a child's wait a cancel reached: its reason (the child was asked)


@dataclass
class Group:
    """One ``all()`` call: its branches' outcomes."""

    id: str
    parent: Branch
    results: list[Any]
    branches: list[Branch] = field(default_factory=list)
    remaining: int = 0
    first_error: BaseException | None = None
    cancelled: str | None = None  # reason, when the all() call itself was cancelled


def signal_value(payload: bytes) -> Any:
    """A signal's arguments as ``await_signal`` returns them: one -> it, none -> None, more -> tuple."""
    args = codec.loads(payload)
    if isinstance(args, tuple | list):
        if len(args) == 0:
            return None
        if len(args) == 1:
            return args[0]
        return tuple(args)
    return args
