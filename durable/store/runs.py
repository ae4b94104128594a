"""Runs in Redis: start, load for a decision, commit a decision, deliver inputs, terminate, list.

Key names come only from :mod:`durable.store.keys`; every state change is one
script in ``lua/``.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Iterable, Sequence
from typing import Any

import redis

from .. import codec, hooktokens
from .. import events as ev
from .. import limits as run_limits
from ..codec.sealed import open_fields, open_text, seal_text
from ..errors import (
    DurableError,
    HistoryCorrupt,
    HookError,
    WorkflowClosed,
    WorkflowNotFound,
)
from ..ids import MAX_LOOKUP_ID, check_workflow_id, shown_id
from ..retention import type_retention_ms
from ..start_policy import DEFAULT as DEFAULT_POLICY
from ..start_policy import EXECUTION_TIMEOUT, RUN_TIMEOUT, StartPolicy
from ..untrusted import decimal
from . import loads
from .base import LOG_MAXLEN
from .commits import PART as COMMIT_PART
from .commits import Commits
from .key_types import KeyTypes, is_wrong_type
from .keys import SENT_TTL_MS, Keys, deadline_member, timer_member
from .known_queues import KnownQueues
from .loads import Loaded, RunToLoad
from .origins import absence_note
from .records import OPEN_STATUSES, CommitResult, RunRef, decode_run, text
from .search import SearchStore, attribute_args, pack_index, start_index
from .starts import (
    Closing,
    StartedRun,
    closing,
    deadline_args,
    open_run,
    script_now_ms,
    script_options,
    started_run,
)
from .tasks import CommitPlan, NextRun, pack_plan


@functools.lru_cache(maxsize=256)
def _partition_keys(keys: Keys, p: int) -> tuple[str, str, str, str, str, str]:
    """The partition-wide keys every commit names (formatted once per partition)."""
    return keys.timers(p), keys.outbox(p), keys.hooks(p), keys.dead(p), keys.running(p), keys.sessions(p)


def _add_lists(payload: dict[str, Any], rid: str, plan: CommitPlan) -> None:
    """The commit payload's lists, only those in use: the script reads a missing one as empty,
    and building, packing and unpacking ten empty lists per commit costs both sides (a W2 step
    has two in use: its claimed activity and its eager result)."""
    if plan.dropped:
        # A poison input's reason quotes the decoder's error about user data: sealed.
        payload["dropped"] = [
            [raw, seal_text(reason) if poison else reason, 1 if poison else 0]
            for raw, reason, poison in plan.dropped
        ]
    if plan.activities or plan.claimed:
        started = plan.claim_started
        payload["activities"] = [[t.stream, t.activity_id, t.encode()] for t in plan.activities] + [
            [t.stream, t.activity_id, t.encode(), started, due] for t, due in plan.claimed
        ]
    if plan.timers:
        payload["timers"] = [[timer_member(rid, tid), due] for tid, due in plan.timers]
    if plan.cancelled_timers:
        payload["untimers"] = [timer_member(rid, tid) for tid in plan.cancelled_timers]
    if plan.cancelled_activities:
        payload["cancel_activities"] = list(plan.cancelled_activities)
    if plan.outbox:
        payload["outbox"] = list(plan.outbox)
    if plan.hooks:
        payload["hooks"] = [list(h) for h in plan.hooks]
    if plan.expired_hooks:
        payload["unhooks"] = list(plan.expired_hooks)
    if plan.leased:
        payload["leased"] = [[t.stream, t.activity_id, t.encode(), plan.lease_due] for t in plan.leased]
    if plan.eager:
        payload["eager"] = [
            [r.task.activity_id, r.task.attempt, codec.pack(r.record), r.stream, r.entry_id]
            for r in plan.eager
        ]


# What a closed run refusing an input calls it (event type names are for history readers).
_INPUT_WORDS = {
    "SignalReceived": "signals",
    "CancelRequested": "cancel requests",
    "HookResumed": "hook resumes",
}


class RunStore(KnownQueues, SearchStore, KeyTypes):
    """Runs: their records, histories, inboxes and the decisions committed on them."""

    # ------------------------------------------------------------- lookups
    def ref(self, workflow_id: str, run_id: str | None = None) -> RunRef:
        """Locate a workflow's current run (or the given run of it).

        Raises:
            WorkflowNotFound: no such workflow id (or run).
        """
        check_workflow_id(workflow_id, most=MAX_LOOKUP_ID)
        p = self.keys.partition(workflow_id)
        if run_id is None:
            current = self.redis.hget(self.keys.instance(p, workflow_id), "run")
            if current is None:
                raise WorkflowNotFound(f"no workflow with id {shown_id(workflow_id)}{absence_note(self, p)}")
            run_id = text(current)
        elif (
            len(run_id) > 64
            or text(self.redis.hget(self.keys.run(p, run_id), "workflow_id") or b"") != workflow_id
        ):
            # (the run's record names its id: another id's run in the same partition is no run of it)
            raise WorkflowNotFound(f"workflow {shown_id(workflow_id)} has no run {shown_id(run_id)}")
        return RunRef(p, run_id, workflow_id)

    def run_record(self, ref: RunRef) -> dict[str, Any]:
        """The run hash, decoded (snapshot unpacked; result/error left as payload bytes)."""
        raw = self.redis.hgetall(self.keys.run(ref.partition, ref.run_id))
        if not raw:
            raise WorkflowNotFound(f"run {ref.run_id!r} of workflow {ref.workflow_id!r} does not exist")
        return decode_run(raw)

    def run_status(self, p: int, run_id: str) -> str | None:
        """The status word of run ``run_id`` of partition ``p`` (``None``: no such run, e.g. purged)."""
        raw = self.redis.hget(self.keys.run(p, run_id), "status")
        return None if raw is None else text(raw)

    def runs_open(self, runs: Sequence[tuple[str, str]]) -> list[bool]:
        """Whether each (workflow id, run id) of ``runs`` is an open run (one round trip; a purged
        run is not, nor one whose record is not a hash: the pass asking died on it, WRONGTYPE)."""
        k = self.keys
        with self.redis.pipeline(transaction=False) as pipe:
            for workflow_id, run_id in runs:
                pipe.hget(k.run(k.partition(workflow_id), run_id), "status")
            statuses = pipe.execute(raise_on_error=False)
        for s in statuses:
            if isinstance(s, Exception) and not is_wrong_type(s):
                raise s
        return [isinstance(s, bytes | str) and text(s) in OPEN_STATUSES for s in statuses]

    def history(self, ref: RunRef, after_seq: int = 0, count: int | None = None) -> list[ev.Entry]:
        """The run's committed events after ``after_seq`` (at most ``count``), decoded, in seq order."""
        rows = self.redis.xrange(
            self.keys.history(ref.partition, ref.run_id), f"0-{after_seq + 1}", "+", count=count
        )
        return self.decode_history(ref, rows, first=after_seq + 1)

    def last_entry(self, ref: RunRef) -> ev.Entry | None:
        """The run's last committed event (``None``: no history)."""
        rows = self.redis.xrevrange(self.keys.history(ref.partition, ref.run_id), "+", "-", count=1)
        return self.decode_history(ref, rows, first=None)[0] if rows else None

    def decode_history(
        self,
        ref: RunRef,
        rows: Iterable[tuple[bytes, dict[bytes, bytes]]],
        first: int | None = 1,
        last: int | None = None,
    ) -> list[ev.Entry]:
        """:func:`~durable.store.loads.decode_history` of ``ref``'s rows."""
        return loads.decode_history(ref.run_id, rows, first, last)

    def undecided_inputs(self, ref: RunRef, most: int | None = None) -> list[ev.Event]:
        """The inputs (signals, a cancel request...) waiting in the run's inbox, oldest first: the
        first ``most`` (default ``max_pending_signals``: all a client may send); one that does not
        decode is left out (the decision parks it)."""
        most = most or run_limits.current().max_pending_signals
        out = []
        for raw in self.redis.lrange(self.keys.inbox(ref.partition, ref.run_id), 0, most - 1):
            try:
                out.append(ev.decode(raw, run_id=ref.run_id).event)
            except HistoryCorrupt:
                continue
        return out

    def load_for_decision(self, p: int, run_id: str, after_seq: int) -> Loaded:
        """One consistent read for a decision: the run record's :data:`DECISION_FIELDS` (``None``:
        no such run), the inbox items, the history after ``after_seq``."""
        return self.load_many([(p, run_id, after_seq)])[0]

    def load_many(self, runs: Sequence[RunToLoad]) -> list[Loaded]:
        """:meth:`load_for_decision` for several runs in one round trip (MULTI/EXEC); on a
        cluster one MULTI per partition, on the node that holds it."""
        groups = loads.batches(self.keys, runs, cluster=self.cluster)
        results = self._wire.transactions([commands for _, commands in groups])
        return loads.loaded(len(runs), [indexes for indexes, _ in groups], results)

    def load_each(self, runs: Sequence[RunToLoad]) -> list[Loaded | HistoryCorrupt]:
        """:meth:`load_many`, but a run whose keys hold the wrong kind of value is a
        :class:`HistoryCorrupt` naming them, and the others load (their reads are then one
        transaction each): one such key failed every run of the batch, and the worker with it."""
        try:
            return list(self.load_many(runs))
        except redis.ResponseError as exc:
            if not is_wrong_type(exc):
                raise
        out: list[Loaded | HistoryCorrupt] = []
        for p, rid, after in runs:
            try:
                out.append(self.load_many([(p, rid, after)])[0])
            except redis.ResponseError as exc:
                if not is_wrong_type(exc):
                    raise
                out.append(self.wrong_kind_error(p, rid, exc))
        return out

    def log_entries(self, ref: RunRef, count: int = LOG_MAXLEN) -> list[dict[str, Any]]:
        """Activity attempts and dropped inputs kept beside the history: the last ``count``,
        oldest first. The log keeps about :data:`~durable.store.base.LOG_MAXLEN` entries (a
        stream node more at times), so older ones are gone; the newest are the ones to show."""
        rows = self.redis.xrevrange(self.keys.log(ref.partition, ref.run_id), count=count)
        out = []
        for _, fields in reversed(rows):
            item = {text(k): v for k, v in fields.items()}
            for k in ("kind", "act", "outcome"):
                if k in item:
                    item[k] = text(item[k])
            if "reason" in item:
                item["reason"] = open_text(item["reason"])
            for k in ("attempt", "ts"):
                if k in item:
                    item[k] = int(item[k])
            if "record" in item:
                item["record"] = open_fields(codec.unpack(item["record"]))
            out.append(item)
        return out

    # ------------------------------------------------------------- starting
    def start(
        self,
        *,
        workflow_type: str,
        workflow_id: str,
        run_id: str,
        args: bytes,
        queue: str,
        parent: dict[str, Any] | None = None,
        build_id: str = "",
        patches: Sequence[str] = (),
        options: dict[str, Any] | None = None,
        search_attributes: dict[str, Any] | None = None,
        memo: bytes | None = None,
        policy: StartPolicy | None = None,
        signal: ev.SignalReceived | None = None,
        headers: dict[str, Any] | None = None,
    ) -> StartedRun:
        """Create a run: instance + run record + WorkflowStarted + first workflow task, in one
        script that applies the start ``policy`` (:mod:`durable.start_policy`) and, with
        ``signal`` (signal-with-start), pushes the signal onto the started or open run's inbox.

        ``search_attributes`` (encoded: :func:`durable.search.encode_values`) are indexed by it.

        Raises:
            WorkflowAlreadyStarted: the workflow id has an open run (conflict policy ``fail``),
                or a closed one its id reuse policy does not start again.
            LimitExceeded: a signal-with-start's open run is at its signal or history limit.
        """
        k, p, policy = self.keys, self.keys.partition(workflow_id), policy or DEFAULT_POLICY
        conflict = policy.conflict(signal=signal is not None)
        started_options = dict(options or {})
        if policy.has_timeouts:
            started_options.update(policy.started_options(script_now_ms(self.redis, k, p)))
        data = ev.WorkflowStarted(
            workflow_type=workflow_type,
            workflow_id=workflow_id,
            run_id=run_id,
            args=args,
            queue=queue,
            parent=parent,
            build_id=build_id,
            patches=list(patches),
            options=started_options,
            search_attributes=search_attributes or {},
            memo=memo,
            headers=headers or {},
        ).to_data()
        if search_attributes:
            self.publish_search_types(list(search_attributes))
        self.note_queues((queue,))
        keys = [
            k.instance(p, workflow_id),
            k.run(p, run_id),
            k.history(p, run_id),
            k.workflow_tasks(p, queue),
            k.runs(p),
            k.timers(p),
            k.inbox(p, run_id),
        ]
        args_ = [
            workflow_id,
            run_id,
            workflow_type,
            queue,
            codec.pack(data),
            codec.pack(parent) if parent else b"",
            type_retention_ms(workflow_type) or "",  # recorded in the run: see durable.retention
        ]
        index = pack_index(start_index(data))
        sent = k.sent_input(p, signal.signal_id) if signal is not None and signal.signal_id else ""
        extra = script_options(policy, conflict, run_id, started_options, signal, sent=sent)
        stale = conflict == "terminate_existing"
        for _ in range(5):
            # terminate_existing: the script terminates the open run only if it is still this one.
            found, old_keys, close = open_run(self.redis, k, p, workflow_id) if stale else ({}, [], None)
            result = self._run_script("start_run", keys + old_keys, [*args_, pack_plan(extra | found), index])
            if text(result[0]) != "MOVED":
                return started_run(result, p, workflow_id, policy, close, child=bool(parent))
        raise DurableError(f"workflow {workflow_id!r} kept moving to new runs; try again")

    # ------------------------------------------------------------ decisions
    def commit_args(self, ref: RunRef, plan: CommitPlan) -> tuple[list[str], list[bytes]]:
        """Keys and argument of the commit script for one decision (see ``lua/commit.lua``)."""
        p, rid = ref.partition, ref.run_id
        k = self.keys
        payload: dict[str, Any] = {
            "rid": rid,
            "seq": plan.expected_seq,
            "events": list(plan.events),
            "consumed": plan.consumed,
            "status": plan.status,
            "snapshot": codec.pack(plan.snapshot),
        }
        _add_lists(payload, rid, plan)
        extra = [t.stream for t in plan.activities] + [t.stream for t, _ in plan.claimed]
        extra += [r.stream for r in plan.eager if r.entry_id]
        if plan.claimed:
            payload["claimer"] = plan.claimer
        if plan.close is not None:
            payload["close"] = plan.close
            payload["undeadlines"] = [deadline_member(rid, w) for w in (RUN_TIMEOUT, EXECUTION_TIMEOUT)]
        if plan.search_attributes is not None:
            payload["sa"] = attribute_args(plan.search_attributes)
        if plan.memo is not None:
            payload["memo"] = plan.memo
        if plan.sticky:
            payload["sticky"] = plan.sticky
        if plan.pin is not None:
            build, queue = plan.pin
            payload["pin"] = [build, k.workflow_tasks(p, queue, build)]
            extra.append(payload["pin"][1])
        if plan.next_run is not None:
            nxt = payload["next"] = self._next_run_args(p, plan.next_run)
            extra += [nxt["run"], nxt["history"], nxt["inbox"], nxt["wq"], nxt["runs"]]
            if plan.carried:
                payload["carry"] = list(plan.carried)
        if plan.task is not None:
            payload["task"] = list(plan.task)
            extra.append(plan.task[0])
        timers, outbox, hooks, dead, running, sessions = _partition_keys(k, p)
        keys = [
            k.run(p, rid),
            k.history(p, rid),
            k.inbox(p, rid),
            k.instance(p, ref.workflow_id),
            timers,
            k.activities(p, rid),
            k.log(p, rid),
            outbox,
            hooks,
            dead,
            running,
            sessions,
            *dict.fromkeys(extra),
        ]
        return keys, [pack_plan(payload)]

    def _next_run_args(self, p: int, nxt: NextRun) -> dict[str, Any]:
        """The ``next`` map of the commit script: the continued run, its keys, its first task."""
        k = self.keys
        return {
            "rid": nxt.run_id,
            "wid": nxt.workflow_id,
            "type": nxt.workflow_type,
            "queue": nxt.queue,
            "data": nxt.started,
            "parent": nxt.parent,
            "run": k.run(p, nxt.run_id),
            "history": k.history(p, nxt.run_id),
            "inbox": k.inbox(p, nxt.run_id),
            "wq": k.workflow_tasks(p, nxt.queue, nxt.build),
            "runs": k.runs(p),
            "build": nxt.build,
            "deadlines": deadline_args(nxt.run_id, codec.unpack(nxt.started).get("options") or {}),
            "sx": start_index(codec.unpack(nxt.started)),
        }

    def commit(self, ref: RunRef, plan: CommitPlan) -> CommitResult:
        """Commit one decision atomically against its expected seq.

        Raises:
            EventConflict: the history moved past the expected seq.
            WorkflowClosed: the run closed meanwhile (terminated).
        """
        result = self.commit_many([(ref, plan)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def commit_many(self, decisions: Sequence[tuple[RunRef, CommitPlan]]) -> list[CommitResult | Exception]:
        """Commit several runs' decisions in one round trip (each one atomic on its own).

        Returns, per decision, its :class:`CommitResult` or the exception it
        met (:class:`EventConflict`, :class:`WorkflowClosed`, a Redis error).
        """
        commits = self.commits(part=None)
        for ref, plan in decisions:
            commits.add(ref, plan)
        return commits.outcomes()

    def commits(self, part: int | None = COMMIT_PART) -> Commits:
        """Decisions to commit in one round trip, written ``part`` at a time as they are added
        (``None``: all at once), so Redis runs the first while the caller decides the rest (see
        :mod:`durable.store.commits`); all at once when Redis syncs its AOF to disk before each
        reply (``appendfsync always``): there each write costs a sync (measured: W2 0.93x)."""
        try:
            one_write = self._syncs_each_write
        except redis.RedisError:  # unavailable for now: asked again next time
            one_write = False
        return Commits(self, self._wire.begin(), None if one_write else part)

    @functools.cached_property
    def _syncs_each_write(self) -> bool:
        """Whether Redis runs with ``appendfsync always`` (read once)."""
        if self.cluster:
            return False  # a cluster's round trip is written at once anyway (one write per node)
        try:
            return bool(self.redis.config_get("appendfsync").get("appendfsync") == "always")
        except redis.ResponseError:
            return False  # CONFIG refused or renamed, as on a managed Redis

    # --------------------------------------------------------------- inputs
    def deliver(
        self,
        workflow_id: str,
        event: ev.Event,
        *,
        run_id: str | None = None,
        limited: bool = False,
        sent_id: str = "",
    ) -> RunRef:
        """Push an input event onto a workflow's current run (or exactly ``run_id``).

        ``limited``: refuse it when the run's inbox holds ``max_pending_signals`` inputs, its
        history and inbox ``max_history_events`` events, or the client inputs it took would pass
        ``max_history_bytes`` (:func:`durable.limits.input_bounds`). ``sent_id``:
        the client call's id (a signal's is its signal id): the same call sent again after its
        reply was lost finds the note its delivery left and delivers nothing.

        Raises:
            WorkflowNotFound: unknown workflow id.
            WorkflowClosed: the run is closed.
            LimitExceeded: ``limited`` and the run is at one of those limits (nothing written).
        """
        k = self.keys
        type_name, data = ev.encode_input_data(event)
        if run_id is None:
            check_workflow_id(workflow_id, most=MAX_LOOKUP_ID)
            p = k.partition(workflow_id)
            keys = [k.instance(p, workflow_id)]
        else:
            p = self.ref(workflow_id, run_id).partition
            keys = [k.instance(p, workflow_id), k.run(p, run_id), k.inbox(p, run_id)]
        args: list[Any] = [
            run_id or "",
            type_name,
            data,
            codec.pack(run_limits.input_bounds()) if limited else "",
        ]
        sent_id = sent_id or (event.signal_id if isinstance(event, ev.SignalReceived) else "")
        if sent_id:
            args += [k.sent_input(p, sent_id), SENT_TTL_MS]  # a resend is not delivered twice
        result = self._run_script("deliver", keys, args)
        outcome = text(result[0])
        if outcome == "LIMIT":
            raise run_limits.input_refused(
                text(result[1]),
                f"workflow {workflow_id!r} (run {text(result[3])}) refused {event.type}",
                int(result[2]),
            )
        if outcome == "NOTFOUND":
            raise WorkflowNotFound(f"no workflow with id {shown_id(workflow_id)}{absence_note(self, p)}")
        if outcome == "CLOSED":
            raise WorkflowClosed(
                f"workflow {workflow_id!r} (run {text(result[2])}) is {text(result[1])}; it takes no more "
                f"{_INPUT_WORDS.get(event.type, event.type)} — start a new run to continue"
            )
        return RunRef(p, text(result[1]), workflow_id)

    def terminate(self, workflow_id: str, reason: str) -> tuple[RunRef, Closing]:
        """Close the current run now (WorkflowTerminated); the same script tells its parent and
        leaves the messages closing its children by their parent close policy (the
        :class:`Closing` returned names them).

        Raises:
            WorkflowNotFound: unknown id.
            WorkflowClosed: the run is closed already.
            DurableError: a key of the run holds another kind of value (named; nothing written).
        """
        try:
            return self._terminate(workflow_id, reason)
        except redis.ResponseError as exc:  # a read before the script met a key of another kind
            if not is_wrong_type(exc):
                raise
            raise self.cannot_write(f"terminate() of workflow {workflow_id!r}", workflow_id, exc) from None

    def _terminate(self, workflow_id: str, reason: str) -> tuple[RunRef, Closing]:
        data = codec.pack(ev.WorkflowTerminated(reason=reason).to_data())
        for _ in range(5):
            ref = self.ref(workflow_id)
            k, p, rid = self.keys, ref.partition, ref.run_id
            close = closing(self.redis, k, p, rid, "parent terminated")
            run_keys = k.terminated_keys(p, rid)
            result = self._run_script(
                "terminate",
                [k.instance(p, workflow_id), *run_keys, k.outbox(p)],
                [
                    rid,
                    data,
                    close.to_parent,
                    close.snapshot_sha1,
                    codec.pack(close.timers),
                    *close.to_children,
                ],
            )
            outcome = text(result[0])
            if outcome == "OK":
                return ref, close
            if outcome == "CLOSED":
                raise WorkflowClosed(f"workflow {workflow_id!r} (run {rid}) is already {text(result[1])}")
            if outcome == "WRONGKIND":  # nothing written
                raise self.cannot_write(
                    f"terminate() of workflow {workflow_id!r}", workflow_id, ValueError(result[1])
                )
        raise DurableError(f"workflow {workflow_id!r} kept moving to new runs; try again")

    # ----------------------------------------------------------------- hooks
    def hook_secrets(self) -> tuple[bytes, ...]:
        """The secrets hook tokens are derived with (current first): ``DURABLE_HOOK_SECRET``,
        else the namespace's own random secret, created on first use (see durable.hooktokens).

        Read each time (one round trip, only for runs that create hooks): a process must
        never keep deriving with a secret the store no longer holds.
        """
        found = hooktokens.env_secrets()
        if found:
            return found
        key = self.keys.hook_secret()
        value = self.redis.get(key)
        if value is None:
            self.redis.set(key, secrets.token_hex(32), nx=True)
            value = self.redis.get(key)
        return (text(value).encode(),)

    def resume_hook(self, token: str, data: bytes, *, delivery_id: str = "") -> RunRef:
        """Use up a hook token and push ``HookResumed`` (payload ``data``) onto its run's inbox,
        in one script (see ``lua/resume_hook.lua``). ``delivery_id``: this call's id; the same
        call sent again (its reply was lost) then finds its delivery instead of a used token.

        Raises:
            HookError: a token that is malformed, unknown, expired or already used (the
                message never repeats the token).
            WorkflowClosed: the hook's run is closed (the token is deleted with it).
        """
        p = decimal(token.split(".", 1)[0]) if isinstance(token, str) and "." in token else None
        if p is None or p >= self.keys.partitions:
            raise HookError("unknown or already used hook token (it is not a token this store issued)")
        result = self._run_script(
            "resume_hook",
            [self.keys.hooks(p)],
            [hooktokens.digest(token), codec.pack({"payload": data}), token]
            + ([self.keys.sent_input(p, delivery_id), SENT_TTL_MS] if delivery_id else []),
        )
        outcome = text(result[0])
        if outcome == "UNKNOWN":
            raise HookError(
                "unknown or already used hook token (or its await_hook deadline passed, or its run closed)"
            )
        if outcome == "CLOSED":
            raise WorkflowClosed(
                f"the hook's run {text(result[2])} is {text(result[1])}; it takes no more input"
            )
        return RunRef(p, text(result[1]), "")
