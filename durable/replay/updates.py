"""Updates: admitting one (validator), running its handler in a branch, recording its outcome.

An update reaches the inbox as ``UpdateRequested``. The live decision that applies it
runs the validator there and writes, in its place, ``UpdateAccepted`` (the handler
starts in its own branch) or ``UpdateRejected`` (nothing runs; replay skips it). The
handler's return value or error becomes the command ``UpdateCompleted``. Replay never
runs a validator again: history already says whether the update was accepted.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from .. import codec, interceptors, typed_args
from .. import events as ev
from ..errors import ConfigurationError, DurableError, NondeterminismError, error_text
from ..interceptors import HandleUpdateInput, WorkflowInboundInterceptor
from ..workflow import ContinueAsNew
from .branches import Branch
from .core import DriverCore

#: The path of an update's branch: its generated command ids are ``update:<id>.<n>``.
BRANCH_PREFIX = "update:"


def check_arguments(method: Callable[..., Any], args: Sequence[Any], what: str) -> None:
    """Refuse arguments ``method`` cannot take, naming the call and its signature (not a
    bare ``TypeError`` from inside it).

    Raises:
        DurableError: the arguments do not fit the method's signature.
    """
    try:
        try:  # annotations as the reader wrote them (``sku: str``, not ``sku: 'str'``)
            signature = inspect.signature(method, eval_str=True)
        except Exception:  # noqa: BLE001 - e.g. a name imported under TYPE_CHECKING only
            signature = inspect.signature(method)
    except (TypeError, ValueError):  # a builtin without a signature: let the call say
        return
    signature = signature.replace(return_annotation=inspect.Signature.empty)
    try:
        signature.bind(*args)
    except TypeError as exc:
        raise DurableError(f"{what} takes {signature}: {exc}") from None


class Updates(DriverCore):
    """Admission, handler branches and outcomes of ``@update`` calls."""

    def _admit_update(self, request: ev.UpdateRequested, ts: int) -> tuple[ev.Event, bytes] | str:
        """Validate an inbox ``UpdateRequested`` (live only).

        Returns the event written in its place with its bytes (stamped ``ts``, the inbox
        item's), or why the item is dropped (an update id this run applied already).
        """
        if request.id in self._update_ids:
            return f"update {request.id!r} was already applied in this run"
        self._now = ts
        error = self._update_refusal(request)
        event: ev.Event
        if error is None:
            event = ev.UpdateAccepted(
                id=request.id, name=request.name, args=request.args, headers=request.headers
            )
        else:
            try:
                payload = codec.dumps(error, path="update rejection")
            except DurableError as err:  # the validator raised something that cannot be stored
                payload = codec.dumps(DurableError(f"{error_text(error)} ({err})"), path="error")
            event = ev.UpdateRejectedEvent(id=request.id, name=request.name, error=payload)
        return event, ev.encode(event, ts)

    def _update_refusal(self, request: ev.UpdateRequested) -> BaseException | None:
        """Why an update is rejected (its validator's error, ...), or None to accept it."""
        instance = self._instance
        if instance is None:
            return DurableError(f"run {self.run_id} has not started; it takes no update yet")
        handlers = type(instance)._updates
        entry = handlers.get(request.name)
        if entry is None:
            return ConfigurationError(
                f"workflow {self.workflow_type!r} has no @update {request.name!r}; it has {sorted(handlers)}"
            )
        try:
            args = codec.loads(request.args)
            # Arguments the handler cannot take would fail inside it, after UpdateAccepted: refuse
            # them here, where the refusal is recorded (replay reads it and never checks again,
            # so a later change of the handler's signature cannot change this run's past).
            check_arguments(getattr(instance, entry[0]), args, f"@update {request.name!r}")
            typed_args.prepared(getattr(instance, entry[0]), tuple(args))  # a model that does not validate
        except DurableError as exc:  # undecodable (SerializationError) or not fitting
            return exc
        validator = entry[1]

        def validate(i: HandleUpdateInput) -> None:
            if validator is not None:
                getattr(instance, validator)(*i.args)

        check = HandleUpdateInput(
            self.run_info(), request.id, request.name, tuple(args), False, dict(request.headers)
        )
        try:
            self._guarded(
                f"update validator {request.name!r}",
                lambda: interceptors.run(WorkflowInboundInterceptor, "validate_update", check, validate),
            )
        # SystemExit too (a library's sys.exit, argparse's): it ended every worker that took the run.
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - raising is how a validator rejects
            return exc
        return None

    def _update_input(self, event: ev.UpdateAccepted | ev.UpdateRejectedEvent) -> str | None:
        """Apply an update event of history: start the handler of an accepted one."""
        if event.id in self._update_ids:
            return f"update {event.id!r} was already applied in this run"
        self._update_ids.add(event.id)
        if isinstance(event, ev.UpdateRejectedEvent):
            return None  # the workflow never sees a rejected update
        instance = self._instance
        assert instance is not None
        entry = type(instance)._updates.get(event.name)
        if entry is None:
            return f"workflow {self.workflow_type!r} has no @update {event.name!r}"
        method = getattr(instance, entry[0])
        request = HandleUpdateInput(
            self.run_info(),
            event.id,
            event.name,
            codec.loads(event.args),
            self._pos <= self._history_end,
            dict(event.headers),
        )

        def handler(i: HandleUpdateInput) -> Any:
            # The handler's calls carry the run's headers updated with the update's.
            self._branch().headers = {**self._headers(), **i.headers}
            return method(*i.args)

        branch = self._spawn(
            f"{BRANCH_PREFIX}{event.id}",
            lambda: interceptors.run(WorkflowInboundInterceptor, "handle_update", request, handler),
        )
        branch.update_id = event.id
        self._runnable.append((branch, None, None))
        return None

    def _update_done(self, branch: Branch, result: Any, exc: BaseException | None) -> None:
        """An update's handler finished: record its outcome (``UpdateCompleted``)."""
        if isinstance(exc, NondeterminismError) or self._fatal is not None:
            self._fatal = self._fatal or exc
            return
        value = error = None
        if exc is None:
            try:
                value = codec.dumps(result, path="update result")
            except DurableError as err:
                error = codec.dumps(err, path="error")
        else:
            if isinstance(exc, ContinueAsNew):
                exc = ConfigurationError(
                    "continue_as_new() is not allowed in an @update handler; call it from handle()"
                )
            error = codec.dumps(exc, path="error")
        assert branch.update_id is not None
        try:
            self._issue(ev.UpdateCompleted(id=branch.update_id, result=value, error=error))
        except NondeterminismError:
            return  # recorded as the run's fatal error; the pass raises it
