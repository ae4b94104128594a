"""A worker whose commit or task read loses its reply to a network cut does not leave the
activity tasks Redis gave it waiting out ``--claim-idle``.

A commit claims the run's next activity task for the committing worker (claimed dispatch); a
read delivers activity tasks to it. When the reply is lost, the task sits in the worker's
pending list, unknown to it: before this, it waited for a reclaim after ``--claim-idle``
(30 s by default) while ``durable status`` said "running on <worker>". The first pass after the
outage puts back every activity task pending for the worker that it does not hold.
"""

from __future__ import annotations

import threading

import pytest
from apps.basic import Sequence
from lossy_proxy import LossyProxy

from durable import WorkflowStub
from durable.store.embedded import EmbeddedRedis
from durable.store.redis_store import RedisStore
from workers.worker import Worker

pytestmark = pytest.mark.fault


def test_an_activity_claimed_by_a_commit_whose_reply_is_lost_runs_at_once(
    killable_redis: EmbeddedRedis,
) -> None:
    with LossyProxy(str(killable_redis.socket_path)) as proxy:
        store = RedisStore(proxy.url)
        # A claim-idle far beyond the wait below: only the worker's own take-back can run it in time.
        w = Worker(store, concurrency=2, block_ms=100, claim_idle_ms=120_000)
        thread = threading.Thread(target=w.run, daemon=True)
        thread.start()
        try:
            assert WorkflowStub.make(Sequence, id="warm", store=store).start(1).result(timeout=20) == 0
            proxy.lose_reply_to(store._scripts["commit"].sha.encode())
            stub = WorkflowStub.make(Sequence, id="lost-commit", store=store).start(2)
            assert stub.result(timeout=20) == 1
            assert proxy.lost == 1
            # The attempt the lost commit began is told apart in describe, with why it ran again:
            # this worker put its task back after the outage (not a worker's death, not counted).
            back = [a for a in stub.describe().attempts if a["outcome"] == "handed_back"]
            assert len(back) == 1 and "handed it back (after a Redis outage)" in back[0]["reason"], back
        finally:
            w.stop()
            thread.join(10)
