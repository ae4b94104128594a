"""The decorators that mark a workflow's message handlers: ``@signal``, ``@query``, ``@update``.

Each only marks the method (an attribute the ``Workflow`` class reads when it is defined) and
returns it unchanged, so a handler is called as the plain method it is. For type checkers they
keep the method's signature; ``@update`` adds ``.validator`` (:class:`UpdateMethod`).

Also the other typing pieces of the workflow-facing calls, for type checkers only:
:class:`Handles` (a class whose ``handle`` returns ``R``: what types a stub's ``result()``,
``activity()`` and ``child()``) and the keyword options of ``activity()`` and ``child()`` as
TypedDicts, which their typed overloads take.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Protocol, TypedDict, TypeVar, overload

if TYPE_CHECKING:
    from .options import RetryPolicy, Seconds

__all__ = ["ActivityCallOptions", "ChildCallOptions", "Handles", "UpdateMethod", "query", "signal", "update"]

F = TypeVar("F", bound=Callable[..., Any])
S = TypeVar("S")
P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Handles(Protocol[R_co]):
    """A workflow or ``Activity`` class whose ``handle`` returns ``R_co``: what a typed stub's
    ``result()``, ``activity()`` and ``child()`` give type checkers."""

    def handle(self, *args: Any, **kwargs: Any) -> R_co: ...


class ActivityCallOptions(TypedDict, total=False):
    """The keyword options of ``activity()`` (for its typed overloads)."""

    id: str | None
    queue: str | None
    retry: RetryPolicy | None
    start_to_close_timeout: Seconds | None
    schedule_to_close_timeout: Seconds | None
    heartbeat_timeout: Seconds | None


class ChildCallOptions(TypedDict, total=False):
    """The keyword options of ``child()`` (for its typed overloads)."""

    id: str | None
    workflow_id: str | None
    queue: str | None
    parent_close_policy: str


@overload
def signal(fn: F) -> F: ...
@overload
def signal(fn: None = None, *, name: str | None = None) -> Callable[[F], F]: ...
def signal(fn: F | None = None, *, name: str | None = None) -> F | Callable[[F], F]:
    """Mark a workflow method as the handler of a signal.

    Handlers run in history order, between durable steps, and may change the
    workflow's attributes; they may not make durable calls. A signal without a
    handler is buffered for :func:`await_signal`. ``name`` defaults to the
    method name.
    """

    def mark(f: F) -> F:
        f.__durable_signal__ = name or f.__name__  # type: ignore[attr-defined]
        return f

    return mark(fn) if fn is not None else mark


@overload
def query(fn: F) -> F: ...
@overload
def query(fn: None = None, *, name: str | None = None) -> Callable[[F], F]: ...
def query(fn: F | None = None, *, name: str | None = None) -> F | Callable[[F], F]:
    """Mark a workflow method as a query: answered by replaying the committed
    history, committing nothing. ``name`` defaults to the method name."""

    def mark(f: F) -> F:
        f.__durable_query__ = name or f.__name__  # type: ignore[attr-defined]
        return f

    return mark(fn) if fn is not None else mark


class UpdateMethod(Protocol, Generic[S, P, R_co]):
    """What ``@update`` makes of a method, for type checkers: the method itself (called on the
    workflow with its own arguments and result type) with ``.validator``, the decorator of
    its validator. At run time it is the function, unchanged."""

    def __call__(self, instance: S, /, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None, /) -> UpdateMethod[S, P, R_co]: ...
    @overload
    def __get__(self, instance: S, owner: type[Any] | None = None, /) -> Callable[P, R_co]: ...

    def validator(self, check: F, /) -> F:
        """Mark ``check`` as this update's validator (see :func:`update`)."""
        ...


@overload
def update(fn: Callable[Concatenate[S, P], R]) -> UpdateMethod[S, P, R]: ...
@overload
def update(
    fn: None = None, *, name: str | None = None
) -> Callable[[Callable[Concatenate[S, P], R]], UpdateMethod[S, P, R]]: ...
def update(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Mark a workflow method as the handler of an update (``WorkflowStub.update``).

    An update is a signal with an answer: its handler runs in its own branch, may
    make durable calls (activities, timers, ...) and its return value (or error)
    goes back to the caller. An optional validator, declared with
    ``@<handler>.validator``, runs first with the same arguments and rejects the
    update by raising; it must be deterministic, must not change the workflow's state
    (replay does not run it again) and may not make durable calls.
    ``name`` defaults to the method name.

    Example:
        ```python
        class Cart(Workflow):
            @update
            def add(self, sku: str) -> int:
                activity(Reserve, sku)
                self.items.append(sku)
                return len(self.items)

            @add.validator
            def _check_add(self, sku: str) -> None:
                if not sku:
                    raise ValueError("empty sku")
        ```
    """

    def mark(f: Callable[..., Any]) -> Any:
        f.__durable_update__ = name or f.__name__  # type: ignore[attr-defined]

        def validator(check: F) -> F:
            f.__durable_update_validator__ = check.__name__  # type: ignore[attr-defined]
            return check

        f.validator = validator  # type: ignore[attr-defined]
        return f

    return mark(fn) if fn is not None else mark
