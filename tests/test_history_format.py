"""A history written by a newer release of durable is not replayed wrongly by an older one.

The newer release is played by this process with :data:`durable.history_format.HISTORY_FORMAT`
raised and the signal waits it records marked with the raised format (as a release that changed
how they replay would); "this release" is a real ``durable worker`` process and this process with the patches
undone. Runs of such a history are left to a worker that reads it, and parked saying to upgrade
when none runs: not blocked as nondeterminism blaming the user's code (the upgrade pass of
2026-12-07 rolled back and got 63 of 90 runs blocked so).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from apps.deploys import HfTwoItems
from procs import durable_cli, spawn_logged_worker, stop
from waiting import wait_for

import durable.events as ev
import durable.history_format as hf
import workers.membership
from durable import HistoryCorrupt, HistoryTooNew, WorkflowStub
from durable.codec import pack, unpack
from durable.replay import Driver
from durable.store.redis_store import RedisStore
from durable.store.workers import WorkerInfo
from workers.worker import Worker, WorkerThread

NEWER = hf.HISTORY_FORMAT + 1


@contextmanager
def newer_release() -> Iterator[None]:
    """This process plays a release that reads format ``NEWER`` and marks the signal waits it
    records with it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hf, "HISTORY_FORMAT", NEWER)
        patch.setattr(workers.membership, "HISTORY_FORMAT", NEWER)
        patch.setattr(
            hf, "needed_by", lambda type_name, data: NEWER if type_name == "SignalWaitStarted" else 1
        )
        yield


def test_events_are_marked_only_when_older_releases_would_replay_them_differently() -> None:
    plain = unpack(ev.encode(ev.SignalReceived(name="item", payload=b"\x01"), 5))
    together = unpack(ev.encode(ev.SignalReceived(name="item", payload=b"\x01", with_previous=True), 5))
    waits = unpack(
        ev.encode(ev.ChildStarted(id="1", workflow_type="K", workflow_id="k", args=b"", wait_cancel=True), 5)
    )
    assert "f" not in plain and together["f"] == 2 and waits["f"] == 2
    assert ev.decode(pack(together)).event.with_previous  # this release reads its own marks


def test_an_event_of_a_newer_format_is_read_but_not_replayed_and_the_error_names_the_fix() -> None:
    raw = pack({"type": "SignalReceived", "ts": 1, "data": {"name": "x", "payload": b""}, "f": NEWER})
    entry = ev.decode(raw, run_id="R1", seq=7)  # shown by `durable history` as any event
    assert (entry.event.name, entry.format) == ("x", NEWER)
    with pytest.raises(HistoryTooNew) as caught:
        Driver(run_id="R1").replay([entry])
    assert (caught.value.run_id, caught.value.seq, caught.value.needed) == ("R1", 7, NEWER)
    text = str(caught.value)
    assert text.startswith("run R1 seq 7: SignalReceived was written by a newer release of durable")
    assert f"history format {NEWER};" in text and "upgrade durable here" in text
    with pytest.raises(HistoryTooNew):  # as an input a decision would apply
        Driver(run_id="R1").decide([entry])
    # An event type this release does not know is read for what it is (not called corrupt) and
    # refused by replay for its format.
    future = ev.decode(pack({"type": "FutureThing", "ts": 1, "data": {"x": 1}, "f": NEWER}), seq=3)
    assert (future.type, future.event.to_data(), future.format) == ("FutureThing", {"x": 1}, NEWER)
    with pytest.raises(HistoryTooNew, match="seq 3: FutureThing was written by a newer release"):
        Driver(run_id="R1").replay([future])
    with pytest.raises(HistoryCorrupt, match="history format mark is not a number"):
        ev.decode(pack({"type": "SignalReceived", "ts": 1, "data": {"name": "x", "payload": b""}, "f": "9"}))


@pytest.mark.slow
def test_a_run_a_newer_release_decided_waits_for_one_and_says_to_upgrade(
    store: RedisStore, redis_url: str, tmp_path: Path
) -> None:
    with newer_release(), WorkerThread(Worker(store, concurrency=2, grace=5, block_ms=100)):
        stub = WorkflowStub.make(HfTwoItems, store=store).start()
        stub.signal("item", "a")
        wait_for(lambda: [e.type for e in stub.history()].count("SignalWaitStarted") == 2)
    # This release, in this process: a query replays the run here, and says to upgrade.
    with pytest.raises(HistoryTooNew, match="upgrade durable here"):
        stub.query("__nothing__")
    log = tmp_path / "older.log"
    # A live worker of the newer release that lacks the type: it cannot take the run either (it
    # counted as taking it, and the two handed the task back and forth for ever, never parked).
    other = WorkerInfo("hf-newer-other", queues=("default",), workflows=("HfOther",), history_format=NEWER)
    store.register_worker(other, ttl_ms=120_000)
    older = spawn_logged_worker(redis_url, log, "--unknown-type-grace", "2", app="apps.deploys")
    try:
        stub.signal("item", "b")  # the older worker is woken for the run, and leaves it
        reason = wait_for(
            lambda: (b := stub.blocked()) is not None and b.kind == "needs_upgrade" and b, timeout=60
        )
        assert (
            f"reads history format {NEWER} (a newer release of durable decided run {stub.run_id}"
            in reason.message
        )
        assert "upgrade durable on this queue's workers, then `durable repair" in reason.message
        status = durable_cli(redis_url, "status", stub.id).stdout
        assert f"(blocked: no live worker on queue 'default' reads history format {NEWER}" in status, status
        shown = durable_cli(redis_url, "history", stub.id)  # read, not replayed: shown as ever
        assert shown.returncode == 0 and shown.stdout.count("SignalWaitStarted") == 2, shown
        export = tmp_path / "history.json"
        export.write_text(durable_cli(redis_url, "history", stub.id, "--json").stdout)
        replayed = durable_cli(redis_url, "replay", "--app", "apps.deploys", str(export))
        assert replayed.returncode == 1 and "upgrade durable here" in replayed.stdout, replayed
        assert "DIVERGED" not in replayed.stdout and "get_version" not in replayed.stdout
        text = log.read_text()
        assert f"no live worker reads history format {NEWER}" in text and "Nondeterminism" not in text, text
        # The newer release comes back beside the older worker: repaired, the run finishes there.
        with newer_release(), WorkerThread(Worker(store, concurrency=2, grace=5, block_ms=100)):
            assert durable_cli(redis_url, "repair", stub.id).returncode == 0
            assert stub.result(timeout=60) == ["a", "b"]
    finally:
        store.unregister_worker(other.name)
        stop(older)


def test_a_client_waits_on_a_run_whose_history_has_an_event_type_of_a_newer_release(
    store: RedisStore, redis_url: str
) -> None:
    """result() raised HistoryTooNew at once on a healthy open run: its wait decoded the newest
    entry, of a type this release does not know (it is no close: a close is a type every
    release knows)."""
    with WorkerThread(Worker(store, concurrency=2, grace=5, block_ms=100)):
        stub = WorkflowStub.make(HfTwoItems, store=store).start()
        wait_for(lambda: stub.status() == "suspended")
    ref = stub._ref()
    seq = len(stub.history()) + 1
    newer = pack({"type": "FutureWait", "ts": 1, "data": {}, "f": NEWER})
    store.redis.xadd(store.keys.history(ref.partition, ref.run_id), {"e": newer}, id=f"0-{seq}")
    with pytest.raises(TimeoutError, match="did not close within 1 s"):
        stub.result(timeout=1)
    shown = durable_cli(redis_url, "history", stub.id)  # shown as stored, as any event
    assert shown.returncode == 0 and "FutureWait" in shown.stdout, shown
