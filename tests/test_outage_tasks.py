"""Workflow tasks a worker read but could not finish because Redis refused a write (OOM at
``maxmemory``) are decided again once Redis answers: none is left behind."""

from __future__ import annotations

from typing import Any

from apps.basic import Sequence
from redis import exceptions as rexc

from durable import WorkflowStub
from durable.store.redis_store import RedisStore
from workers.worker import Worker, WorkerThread

SCRIPT_OOM = (
    "Error running script (call to f_1): @user_script:1: @user_script: 1: "
    "-OOM command not allowed when used memory > 'maxmemory'."
)


def test_a_sticky_task_refused_at_maxmemory_is_decided_again(store: RedisStore) -> None:
    worker = Worker(store, concurrency=2, grace=5, claim_idle_ms=1000, block_ms=100)
    refused: list[str] = []
    commit_many = store.commit_many

    def refuse_first_sticky(decisions: Any) -> Any:
        # Redis at maxmemory refuses the commit of the first task read from the worker's
        # private stream: the task stays pending in its own consumer's list.
        sticky = [plan.task for _, plan in decisions if plan.task and ":wq:@" in plan.task[0]]
        if sticky and not refused:
            refused.append(sticky[0][0])
            return [rexc.ResponseError(SCRIPT_OOM)] * len(decisions)
        return commit_many(decisions)

    store.commit_many = refuse_first_sticky  # type: ignore[method-assign]
    with WorkerThread(worker):
        stub = WorkflowStub.make(Sequence).start(3)
        assert stub.result(timeout=15) == 3
    assert refused
