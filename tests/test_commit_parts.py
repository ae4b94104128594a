"""A worker's commits are written a few at a time as it decides them (``Wire.begin``,
``RunStore.commits``): Redis runs the first while the worker decides the rest; every written
one's outcome is read, whatever happens to the batch."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import redis
from apps.basic import Sequence
from redis import exceptions as rexc
from waiting import wait_for

from durable import WorkflowStub
from durable.store.commits import PART
from durable.store.embedded import EmbeddedRedis
from durable.store.redis_store import RedisStore
from durable.store.wire import Wire
from workers.worker import Worker, WorkerThread


def test_a_round_trip_in_parts_runs_each_part_before_its_replies_are_read(redis_client: redis.Redis) -> None:
    sending = Wire(redis_client, lambda: None).begin()
    sending.send([("SET", "k", "a")])
    # Another connection sees the first part done while its reply is still unread.
    wait_for(lambda: redis_client.get("k") == b"a", timeout=5)
    sending.send([("INCR", "k"), ("APPEND", "k", "b")])
    sending.send([])
    replies = sending.replies()
    assert replies[0] in (b"OK", "OK", True)
    assert isinstance(replies[1], rexc.ResponseError)  # an error in its place, the rest go on
    assert replies[2] == 2
    assert redis_client.get("k") == b"ab"


def test_a_connection_broken_mid_round_trip_fails_every_command_and_is_not_reused(
    redis_client: redis.Redis,
) -> None:
    wire = Wire(redis_client, lambda: None)
    sending = wire.begin()
    sending.send([("CLIENT", "SETNAME", "parts-doomed"), ("SET", "k", "1")])
    doomed = wait_for(
        lambda: [c for c in redis_client.client_list() if c.get("name") == "parts-doomed"], timeout=5
    )
    redis_client.client_kill_filter(_id=doomed[0]["id"])
    sending.send([("SET", "k", "2")])
    replies = sending.replies()
    assert len(replies) == 3 and all(isinstance(r, rexc.ConnectionError) for r in replies)
    assert redis_client.get("k") == b"1"  # the part written before the break ran
    # The broken connection was dropped: the next round trip reconnects and reads its own reply.
    assert wire.execute([("GET", "k")]) == [b"1"]


def test_scripts_redis_lost_are_loaded_and_their_calls_resent(redis_client: redis.Redis) -> None:
    source = "return 7"
    loads: list[int] = []

    def load() -> None:
        loads.append(1)
        redis_client.script_load(source)

    redis_client.script_flush()
    sending = Wire(redis_client, load).begin()
    sending.send([("EVALSHA", hashlib.sha1(source.encode()).hexdigest(), 0)])
    sending.send([("PING",)])
    assert sending.replies()[0] == 7
    assert loads == [1]


def test_a_failed_reload_of_lost_scripts_fails_the_round_trip_without_raising(
    redis_client: redis.Redis,
) -> None:
    def load() -> None:
        raise rexc.ConnectionError("Connection closed by server.")

    redis_client.script_flush()
    sending = Wire(redis_client, load).begin()
    sending.send([("EVALSHA", hashlib.sha1(b"return 7").hexdigest(), 0), ("PING",)])
    replies = sending.replies()
    assert len(replies) == 2 and all(isinstance(r, rexc.ConnectionError) for r in replies)


def test_a_batch_interrupted_after_its_first_commits_were_written_loses_and_repeats_nothing(
    store: RedisStore,
) -> None:
    """Redis drops the connection while the worker decides the fifth run of a batch (its first
    four commits written): the written ones' outcomes are read (their claimed activities run),
    the others' results go through the runs' inboxes once Redis answers; every run completes,
    no activity runs twice."""
    worker = Worker(store, concurrency=32, grace=5, claim_idle_ms=60_000, block_ms=100)
    apply_eager, decide_eager = worker.decider.apply_eager, worker.decider._decide_eager
    batch: list[int] = []
    interrupted: list[int] = []

    def counted(results: Any) -> None:
        batch[:] = [0]
        apply_eager(results)

    def interrupting(*args: Any) -> Any:
        batch[0] += 1
        if batch[0] == 5 and not interrupted:
            interrupted.append(1)
            raise rexc.ConnectionError("Connection closed by server.")
        return decide_eager(*args)

    worker.decider.apply_eager = counted  # type: ignore[method-assign]
    worker.decider._decide_eager = interrupting  # type: ignore[method-assign]
    with WorkerThread(worker):
        stubs = [WorkflowStub.make(Sequence).start(6) for _ in range(24)]
        assert [s.result(timeout=30) for s in stubs] == [15] * 24
    assert interrupted, "no batch of five runs or more came: the test did not test anything"
    assert worker.activities_run == 24 * 6
    assert not store.dead_letters()


def test_commits_go_in_one_write_where_redis_syncs_each_write_to_disk(
    tmp_path: Path, store: RedisStore
) -> None:
    """With ``appendfsync always`` Redis syncs its AOF before each round of replies, so each
    write of a batch in parts would cost a disk sync: the batch goes at once. A Redis that
    refuses CONFIG (a managed one) gets the parts."""
    server = EmbeddedRedis(tmp_path / "redis", appendfsync="always")
    url = server.ensure()
    try:
        syncing = RedisStore(url)
        assert syncing.commits()._part is None
        syncing.redis.acl_setuser(
            "app", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-config"]
        )
        limited = RedisStore(
            client=redis.Redis(unix_socket_path=str(server.socket_path), username="app", password="pw")
        )
        with pytest.raises(rexc.NoPermissionError):
            limited.redis.config_get("appendfsync")
        assert limited.commits()._part == PART
        limited.close()
        syncing.close()
    finally:
        server.stop()
    assert store.commits()._part == PART  # the suite's server: everysec


def test_a_batch_whose_queue_note_redis_refuses_mid_batch_loses_and_repeats_nothing(
    store: RedisStore,
) -> None:
    """Redis refuses the note of a new activity queue (an SADD, as at ``maxmemory``) when the
    second part of a batch is written, its first part already sent: the sent part's outcomes
    are read, the unsent decisions get the refusal as their outcome and their results go through
    the inboxes. The note raised out of ``Commits.add`` before, the batch's outcomes no longer
    matched its decisions and the sent part's claimed activities waited for a reclaim."""
    worker = Worker(store, concurrency=32, grace=5, claim_idle_ms=60_000, block_ms=100)
    apply_eager, note_streams = worker.decider.apply_eager, store._note_streams
    in_batch: list[int] = []
    refused: list[int] = []

    def counted(results: Any) -> None:
        in_batch[:] = [0]
        try:
            apply_eager(results)
        finally:
            in_batch.clear()

    def refusing(decisions: Any) -> None:
        if in_batch:
            in_batch[0] += 1
            if in_batch[0] == 2 and not refused:
                refused.append(1)
                raise rexc.ResponseError("OOM command not allowed when used memory > 'maxmemory'.")
        note_streams(decisions)

    worker.decider.apply_eager = counted  # type: ignore[method-assign]
    store._note_streams = refusing  # type: ignore[method-assign]
    with WorkerThread(worker):
        stubs = [WorkflowStub.make(Sequence).start(6) for _ in range(24)]
        assert [s.result(timeout=30) for s in stubs] == [15] * 24
    assert refused, f"no batch of more than {PART} runs came: the test did not test anything"
    assert worker.activities_run == 24 * 6
    assert not store.dead_letters()
