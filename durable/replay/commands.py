"""The durable calls: what workflow code asks of the driver (:class:`~durable.runtime.WorkflowRuntime`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar, cast

from .. import codec, hooktokens, interceptors
from .. import events as ev
from ..errors import ConfigurationError, SignalTimeout, WorkflowTaskFailed
from ..ids import check_command_id, check_workflow_id
from ..interceptors import StartActivityInput, StartChildInput, StartTimerInput, WorkflowOutboundInterceptor
from ..limits import check_name_length, check_queue_name
from ..options import ActivityOptions, ChildOptions, RetryPolicy, Seconds, duration_ms, to_seconds
from ..registry import ActivityNameClash, activity_definition_for, check_name
from ..runtime import Hook
from ..search import MAX_ATTRIBUTES, decode_values, encode_values
from ..workflow import DEFAULT_VERSION, ContinueAsNew, Workflow, near_history_limit
from .branches import POLICIES, Group, Wait, signal_value
from .core import DriverCore

T = TypeVar("T")


class Commands(DriverCore):
    """The ``call_*`` methods behind :mod:`durable.workflow`: each issues (or matches) a command."""

    #: Gives the hook secrets (current first) tokens are derived with; called only when a
    #: hook is created or replayed. Default: the process's (see durable.hooktokens).
    hook_secrets: Callable[[], tuple[bytes, ...]] = staticmethod(hooktokens.process_secrets)

    def now(self) -> datetime:
        return datetime.fromtimestamp(self._now / 1000, tz=UTC)

    def history_length(self) -> int:
        """Events in the history at this point of the code (deterministic: replay sees what live saw)."""
        return self._history_size()[0]

    def should_continue_as_new(self) -> bool:
        events, size = self._history_size()
        return near_history_limit(events, size, self.history_budget())

    def info(self) -> dict[str, Any]:
        return {
            "workflow_id": self.workflow_id,
            "run_id": self.run_id,
            "type": self.workflow_type,
            "search_attributes": decode_values(self._search),
            "memo": dict(self._memo),
        }

    def call_activity(self, target: Any, args: tuple[Any, ...], options: ActivityOptions) -> Any:
        if not interceptors.active(WorkflowOutboundInterceptor, "start_activity"):
            return self._activity(target, args, options, self._headers())
        self._branch()
        name = self._definition(target).name
        request = StartActivityInput(
            self.run_info(), target, name, tuple(args), options, self._headers(), self._replaying()
        )
        return interceptors.run(
            WorkflowOutboundInterceptor,
            "start_activity",
            request,
            lambda i: self._activity(i.target, i.args, i.options, i.headers),
        )

    def _activity(
        self, target: Any, args: tuple[Any, ...], options: ActivityOptions, headers: dict[str, Any]
    ) -> Any:
        branch = self._branch()
        definition = self._definition(target)
        cid = self._next_id(branch, options.id)
        policy = options.retry or definition.retry
        if policy is not None and not isinstance(policy, RetryPolicy):
            raise ConfigurationError(f"retry= must be a RetryPolicy, not {type(policy).__name__}")
        start_to_close = options.start_to_close_timeout
        schedule_to_close = options.schedule_to_close_timeout
        heartbeat = options.heartbeat_timeout
        queue = _queue(options.queue or definition.queue or self.queue)
        self._check_pending("activity", "max_pending_activities")
        event = ev.ActivityScheduled(
            id=cid,
            name=definition.name,
            args=codec.dumps(tuple(args), path="args"),
            queue=queue,
            retry=policy.to_dict() if policy is not None else None,
            timeouts={
                "start_to_close": _pick(
                    start_to_close, definition.start_to_close_timeout, "start_to_close_timeout"
                ),
                "schedule_to_close": _pick(
                    schedule_to_close, definition.schedule_to_close_timeout, "schedule_to_close_timeout"
                ),
                "heartbeat": _pick(heartbeat, definition.heartbeat_timeout, "heartbeat_timeout"),
            },
            local=options.local,
            headers=headers,
        )
        self._issue(event)
        return self._suspend(branch, Wait("activity", cid, name=definition.name, queue=queue))

    def call_timer(self, duration: Seconds, *, id: str | None) -> None:  # noqa: A002
        if interceptors.active(WorkflowOutboundInterceptor, "start_timer"):
            self._branch()
            request = StartTimerInput(self.run_info(), duration, id, self._replaying())
            interceptors.run(
                WorkflowOutboundInterceptor, "start_timer", request, lambda i: self._timer(i.duration, i.id)
            )
        else:
            self._timer(duration, id)

    def _timer(self, duration: Seconds, id: str | None) -> None:  # noqa: A002
        branch = self._branch()
        ms = duration_ms(duration, "timer duration")
        cid = self._next_id(branch, id)
        if ms <= 0:
            return
        fire_at = self._now + ms
        self._issue(ev.TimerStarted(id=cid, fire_at=fire_at))
        self._suspend(branch, Wait("timer", cid, deadline=fire_at))

    def call_await_signal(self, name: str, timeout: Seconds | None, *, id: str | None) -> Any:  # noqa: A002
        branch = self._branch()
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"await_signal needs a signal name (str), got {name!r}")
        check_name_length(name, "signal")
        cid = self._next_id(branch, id)
        buffered = self._signals.get(name)
        if buffered:
            return signal_value(buffered.popleft()[0].payload)
        deadline = self._deadline(timeout, "await_signal timeout")
        if deadline is not None and deadline <= self._now:
            raise SignalTimeout(f"no signal {name!r} (timeout 0)")
        self._issue(ev.SignalWaitStarted(id=cid, name=name, deadline=deadline))
        self._signal_waiters.setdefault(name, []).append(branch)
        return self._suspend(branch, Wait("signal", cid, name=name, deadline=deadline))

    def call_wait_until(
        self, predicate: Callable[[], bool], timeout: Seconds | None, *, id: str | None
    ) -> bool:  # noqa: A002
        branch = self._branch()
        if not callable(predicate):
            raise ConfigurationError("wait_until needs a callable predicate")
        cid = self._next_id(branch, id)
        if self._guarded("wait_until predicate", predicate):
            return True
        deadline = self._deadline(timeout, "wait_until timeout")
        if deadline is not None:
            if deadline <= self._now:
                return False
            self._issue(ev.TimerStarted(id=cid, fire_at=deadline))
        self._wait_until.append(branch)
        return bool(self._suspend(branch, Wait("wait_until", cid, deadline=deadline, predicate=predicate)))

    def call_side_effect(self, fn: Callable[[], T], *, id: str | None) -> T:  # noqa: A002
        if not callable(fn):  # else "TypeError: 'int' object is not callable", recorded as its outcome
            raise ConfigurationError(f"side_effect needs a function to call, not {type(fn).__name__}")
        branch = self._branch()
        cid = self._next_id(branch, id)
        recorded = self._recorded_for((ev.SideEffectRecorded.TYPE, cid))
        if recorded is not None:
            assert isinstance(recorded, ev.SideEffectRecorded)
            event = recorded
        elif self._replaying():
            # History has no such command: fail without calling the function.
            self._issue(ev.SideEffectRecorded(id=cid))
            raise AssertionError("unreachable: _issue raises while replaying")  # pragma: no cover
        else:
            if self._read_only:
                self._stop_at_frontier()
            value = error = None
            try:
                result = self._guarded("side_effect function", fn, inside_branch=True)
                value = codec.dumps(result, path="side_effect value")
            except Exception as exc:  # noqa: BLE001 - recorded, re-raised below and on replay
                error = codec.dumps(exc, path="side_effect error")
            event = ev.SideEffectRecorded(id=cid, value=value, error=error)
        self._issue(event)
        if event.error is not None:
            raise codec.loads(event.error)
        return cast(T, codec.loads(event.value) if event.value is not None else None)

    def call_get_version(self, change_id: str, min_supported: int, max_supported: int) -> int:
        self._branch()
        check_command_id(change_id)
        if (
            not (isinstance(min_supported, int) and isinstance(max_supported, int))
            or min_supported > max_supported
        ):
            raise ConfigurationError("get_version needs integers min_supported <= max_supported")
        version = self._versions.get(change_id)
        if version is None:
            recorded = self._recorded_for((ev.VersionMarker.TYPE, change_id))
            if recorded is not None:
                assert isinstance(recorded, ev.VersionMarker)
                version = recorded.version
                self._issue(recorded)
            elif self._replaying():
                version = DEFAULT_VERSION
            else:
                version = max_supported
                self._issue(ev.VersionMarker(id=change_id, change_id=change_id, version=version))
            self._versions[change_id] = version
        if not min_supported <= version <= max_supported:
            raise self._nondeterminism(
                f"get_version({change_id!r}): this run recorded version {version}, outside the supported "
                f"range [{min_supported}, {max_supported}] of the code now deployed",
                change_id,
                version,
                (min_supported, max_supported),
            )
        return version

    def _definition(self, target: Any) -> Any:
        """The activity ``target`` names; a name another function holds here blocks the run (a
        deploy's mistake: failing its runs would lose them)."""
        try:
            return activity_definition_for(target)
        except ActivityNameClash as exc:
            raise self._code_blocks(
                f"{exc}; the run is blocked: deploy code where each activity name has one function, "
                "then `durable repair`",
                "ActivityNameClash",
            ) from None

    def _code_blocks(self, message: str, error_type: str) -> WorkflowTaskFailed:
        """The error that blocks the run (not fails it) for a mistake of its deployed code, noted
        as the decision's fatal error (caught by the workflow, it blocks all the same)."""
        error = WorkflowTaskFailed(message, run_id=self.run_id, error_type=error_type)
        self._fatal = self._fatal or error
        return error

    def call_patched(self, patch_id: str) -> bool:
        self._branch()
        assert self._started is not None
        if patch_id in self._started.patches:
            return True
        if patch_id not in self.declared_patches:
            # It would answer False in every run, new ones too: a patch the class forgot to
            # declare. Blocked, not failed: declare it, deploy, `durable repair`.
            raise self._code_blocks(
                f"patched({patch_id!r}) in {self.workflow_type}: its class does not declare "
                f"{patch_id!r} (patches = {self.declared_patches!r}), so no run would ever take the "
                "patched branch; add it to the class's `patches`, deploy, then `durable repair`",
                "UndeclaredPatch",
            )
        return False

    def call_child(self, workflow: Any, args: tuple[Any, ...], options: ChildOptions) -> Any:
        if not interceptors.active(WorkflowOutboundInterceptor, "start_child"):
            return self._child(workflow, args, options, self._headers())
        self._branch()
        type_name, _ = _child_type(workflow)
        request = StartChildInput(
            self.run_info(), workflow, type_name, tuple(args), options, self._headers(), self._replaying()
        )
        return interceptors.run(
            WorkflowOutboundInterceptor,
            "start_child",
            request,
            lambda i: self._child(i.workflow, i.args, i.options, i.headers),
        )

    def _child(
        self, workflow: Any, args: tuple[Any, ...], options: ChildOptions, headers: dict[str, Any]
    ) -> Any:
        branch = self._branch()
        policy, workflow_id = options.parent_close_policy, options.workflow_id
        type_name, child_queue = _child_type(workflow)
        if policy not in POLICIES:
            raise ConfigurationError(f"parent_close_policy must be one of {POLICIES}, not {policy!r}")
        cid = self._next_id(branch, options.id)
        child_id = check_workflow_id(workflow_id) if workflow_id is not None else f"{self.workflow_id}/{cid}"
        queue = check_queue_name(options.queue or child_queue or self.queue, "child queue")
        self._check_pending("child", "max_pending_children")
        started = ev.ChildStarted(
            id=cid,
            workflow_type=type_name,
            workflow_id=child_id,
            args=codec.dumps(tuple(args), path="args"),
            queue=queue,
            policy=policy,
            headers=headers,
            wait_cancel=True,
        )
        recorded = self._recorded_for(started.key)
        if workflow_id is None and recorded is None:
            _check_derived_id(child_id)  # (one recorded before this check replays as it was)
        self._issue(started)
        # As history has it: a child recorded without wait_cancel (older durable) raised at once.
        waits = recorded.wait_cancel if isinstance(recorded, ev.ChildStarted) else True
        wait = Wait(
            "child", cid, name=type_name, child_workflow_id=child_id, policy=policy, wait_cancel=waits
        )
        return self._suspend(branch, wait)

    def call_all(self, fns: list[Callable[[], Any]], *, id: str | None) -> list[Any]:  # noqa: A002
        branch = self._branch()
        if not all(callable(f) for f in fns):
            raise ConfigurationError("all() takes a list of callables, e.g. [lambda: activity(A), ...]")
        cid = self._next_id(branch, id)
        if not fns:
            return []
        group = Group(id=cid, parent=branch, results=[None] * len(fns), remaining=len(fns))
        for index, fn in enumerate(fns):
            child = self._spawn(f"{cid}.{index + 1}", fn)
            child.group, child.index, child.headers = group, index, branch.headers
            group.branches.append(child)
            self._runnable.append((child, None, None))
        return self._suspend(branch, Wait("all", cid, group=group))

    def call_continue_as_new(self, args: tuple[Any, ...]) -> NoReturn:
        self._branch()
        raise ContinueAsNew(args)

    def call_create_hook(self, name: str, metadata: Any, *, id: str | None) -> Hook:  # noqa: A002
        branch = self._branch()
        if not isinstance(name, str) or not name:
            raise ConfigurationError("create_hook needs a name (str)")
        check_name_length(name, "hook")
        cid = self._next_id(branch, id)
        recorded = self._recorded_for((ev.HookCreated.TYPE, cid))
        token = self._hook_token(cid, recorded.token if isinstance(recorded, ev.HookCreated) else None)
        # History records the token's digest only (see durable.hooktokens).
        self._issue(
            ev.HookCreated(
                id=cid,
                name=name,
                token=hooktokens.digest(token),
                metadata=codec.dumps(metadata, path="metadata"),
            )
        )
        self._hooks.add(cid)
        return Hook(cid, name, token)

    def call_upsert_search_attributes(self, values: dict[str, Any], *, id: str | None) -> None:  # noqa: A002
        branch = self._branch()
        cid = self._next_id(branch, id)
        encoded = encode_values(values)
        merged = {**self._search, **encoded}
        if sum(v is not None for v in merged.values()) > MAX_ATTRIBUTES:
            raise ConfigurationError(
                f"run {self.run_id} would hold more than {MAX_ATTRIBUTES} search attributes"
            )
        self._issue(ev.SearchAttributesUpserted(id=cid, attributes=encoded))
        self._search = {k: v for k, v in merged.items() if v is not None}

    def call_upsert_memo(self, values: dict[str, Any], *, id: str | None) -> None:  # noqa: A002
        branch = self._branch()
        cid = self._next_id(branch, id)
        if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
            raise ConfigurationError(f"upsert_memo needs a dict with str keys, not {type(values).__name__}")
        payload = codec.dumps(values, path="memo")
        merged = {**self._memo, **codec.loads(payload)}  # what replay will see: a codec round trip
        codec.dumps(merged, path="memo")  # the whole memo must still fit a payload
        self._issue(ev.MemoUpserted(id=cid, memo=payload))
        self._memo = {k: v for k, v in merged.items() if v is not None}

    def _hook_token(self, cid: str, recorded: str | None) -> str:
        """The token of hook ``cid``: derived under the current secret, or on replay under
        whichever secret gives the recorded digest."""
        keys = self.hook_secrets()
        if recorded is None:
            return hooktokens.derive(keys[0], self._token_prefix, self.run_id, cid)
        if not recorded.startswith(hooktokens.DIGEST_PREFIX):
            return recorded  # recorded in plaintext by an older version
        for key in keys:
            token = hooktokens.derive(key, self._token_prefix, self.run_id, cid)
            if hooktokens.digest(token) == recorded:
                return token
        # Not derivable here (offline replay, a secret dropped from DURABLE_HOOK_SECRET): code
        # that only awaits the hook replays fine; code that hands the token out diverges.
        return f"{self._token_prefix}<hook token unavailable: this process lacks its hook secret>"

    def call_await_hook(self, hook: Hook, timeout: Seconds | None) -> Any:
        branch = self._branch()
        if isinstance(hook, Hook) and hook.id in self._hooks_expired:
            raise SignalTimeout(
                f"hook {hook.name!r} expired: an earlier wait on it ended, and its token with it"
            )
        if not isinstance(hook, Hook) or hook.id not in self._hooks:
            raise ConfigurationError("await_hook needs a Hook returned by create_hook() in this run")
        if hook.id in self._hook_payloads:
            return signal_value(self._hook_payloads.pop(hook.id))
        deadline = self._deadline(timeout, "await_hook timeout")
        if deadline is not None:
            self._issue(ev.TimerStarted(id=hook.id, fire_at=deadline))
        self._waits[("hook", hook.id)] = branch
        return self._suspend(branch, Wait("hook", hook.id, name=hook.name, deadline=deadline))


def _child_type(workflow: Any) -> tuple[str, str | None]:
    """(type name, the class's queue) of a child() target."""
    if isinstance(workflow, str):  # a name no worker can serve started a child blocked for good
        return check_name(workflow, "child workflow"), None
    if isinstance(workflow, type) and issubclass(workflow, Workflow):
        return workflow.name, workflow.queue
    raise ConfigurationError(f"child() needs a Workflow subclass or its name, not {workflow!r}")


def _queue(queue: str) -> str:
    """An activity's queue: a worker session's private one (``@<worker>``) or a valid name."""
    if isinstance(queue, str) and queue.startswith("@") and len(queue) > 1:
        return queue
    return check_queue_name(queue, "activity queue")


def _pick(override: Seconds | None, default: float | None, what: str) -> float | None:
    return to_seconds(override, what) if override is not None else default


def _check_derived_id(child_id: str) -> None:
    """A child's default id ``<parent id>/<n>`` must be an id every tool can address: past 256
    characters, the engine started it but no status, signal or terminate could name it."""
    try:
        check_workflow_id(child_id)
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"{exc}: it is this child's default id (the parent's id, '/', the call's id); give "
            "child() a workflow_id= of its own"
        ) from None
