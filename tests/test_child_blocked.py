"""A parent waiting on a blocked child says so, and dropped inputs say what was dropped.

* A pending child that no live worker can move (its queue unserved, its type defined by no
  worker), or that is blocked on record, makes its parent -- and its parent's parent, a few
  levels up -- blocked with the child's kind, in ``status``, ``describe`` (the reason and the
  child's row), ``list`` (the row, and ``--status blocked``) and ``GET /api/v1/workflows``.
* A signal that reached a run as it closed shows in ``describe`` with its kind, name and a short
  payload preview (hidden under a payload hook).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from apps.child_blocks import FailsOnBad, GrandQ, ParentOfGhost, ParentQ
from clikit import cli_ok as _cli
from procs import spawn_worker, stop
from waiting import wait_for

from durable import WorkflowFailed, WorkflowStub, codec
from durable import events as ev
from durable.codec.hooks import set_payload_hook
from durable.dropped import PREVIEW_CHARS, dropped_view
from durable.store.redis_store import RedisStore
from workers.server.endpoint import Call
from workers.server.workflow_routes import list_workflows
from workers.worker import Worker, WorkerThread

NOWHERE = "no live worker serves queue 'nowhere2'"

pytestmark = pytest.mark.slow


def _api_rows(store: RedisStore, **query: str) -> dict[str, dict[str, Any]]:
    """``GET /api/v1/workflows`` (the route's handler, in process) by workflow id."""
    page = list_workflows(Call(store, {}, query, None, b"", {}, "operator"))
    return {row["workflow_id"]: row for row in page["workflows"]}


def _worker(store: RedisStore) -> WorkerThread:
    return WorkerThread(Worker(store, concurrency=2, grace=5, block_ms=100))


def test_a_parent_waiting_on_a_child_no_worker_can_run_says_so_everywhere(store: RedisStore) -> None:
    with _worker(store):
        parent = WorkflowStub.make(ParentQ, "pq1", store=store).start()
        wait_for(lambda: store.instance_statuses(["pq1/1"])[0], timeout=20)
        kid = WorkflowStub.load("pq1/1", store=store)
        assert NOWHERE in str(kid.blocked())
        reason = wait_for(parent.blocked, timeout=20)
        assert reason.kind == "no_live_worker" and reason.child == "pq1/1"
        assert reason.message.startswith(f"waits on child 'pq1/1', which is blocked: {NOWHERE}")

        assert _cli("status", "pq1").startswith(
            f"running (blocked: waits on child 'pq1/1', which is blocked: {NOWHERE}"
        )
        described = json.loads(_cli("describe", "pq1", "--json"))
        assert described["blocked_kind"] == "no_live_worker"
        [row] = described["pending"]
        assert row["workflow_id"] == "pq1/1" and row["state"].startswith("child pq1/1: pending, blocked: ")
        assert NOWHERE in row["state"]

        listed = {r["workflow_id"]: r for r in json.loads(_cli("list", "--json"))}
        assert listed["pq1"]["blocked"].startswith("waits on child 'pq1/1'")
        assert listed["pq1"]["blocked_kind"] == "no_live_worker"
        blocked = {r["workflow_id"] for r in json.loads(_cli("list", "--status", "blocked", "--json"))}
        assert blocked == {"pq1", "pq1/1"}

        api = _api_rows(store)
        assert api["pq1"]["blocked"].startswith("waits on child 'pq1/1', which is blocked: " + NOWHERE)
        assert set(_api_rows(store, status="blocked")) == {"pq1", "pq1/1"}
        parent.terminate("test over")


def test_a_grandparent_says_which_descendant_blocks_it(store: RedisStore) -> None:
    with _worker(store):
        grand = WorkflowStub.make(GrandQ, "g1", store=store).start()
        wait_for(lambda: store.instance_statuses(["g1/1/1"])[0], timeout=20)
        reason = wait_for(grand.blocked, timeout=20)
        assert reason.child == "g1/1"
        assert reason.message == (
            "waits on child 'g1/1', which is blocked: waits on child 'g1/1/1', which is blocked: "
            + str(WorkflowStub.load("g1/1/1", store=store).blocked())
        )
        assert "g1" in {r["workflow_id"] for r in json.loads(_cli("list", "--status", "blocked", "--json"))}
        assert "g1" in _api_rows(store, status="blocked")
        grand.terminate("test over")


def test_a_parent_says_its_child_has_an_unknown_type_as_soon_as_the_child_does(
    redis_url: str, store: RedisStore
) -> None:
    worker = spawn_worker(redis_url, app="apps.child_blocks")
    try:
        wait_for(store.live_workers, timeout=30)
        parent = WorkflowStub.make(ParentOfGhost, "ghost1", store=store).start()
        # The child exists once the parent's first decision has sent its start over.
        wait_for(lambda: store.instance_statuses(["ghost1/1"])[0], timeout=20)
        kid = WorkflowStub.load("ghost1/1", store=store)
        child_reason = wait_for(kid.blocked, timeout=20)
        reason = parent.blocked()  # read after the child's: it says so too, no later
        assert reason is not None and reason.kind == child_reason.kind
        assert "'Chld'" in reason.message and reason.message.startswith("waits on child 'ghost1/1'")
        assert "(blocked: waits on child 'ghost1/1'" in _cli("status", "ghost1")
        parent.terminate("test over")
    finally:
        stop(worker)


def test_a_signal_dropped_as_the_run_closed_says_what_it_was(store: RedisStore) -> None:
    stub = WorkflowStub.make(FailsOnBad, "late1", store=store).start()
    # Both wait in the inbox for the run's first decision: "bad" fails the run in its handler,
    # "late" comes too late. (Behind a signal the code returns on, it would apply: signals of
    # one decision apply together.)
    stub.signal("bad")
    stub.signal("late", {"order": 7, "note": "x" * 500})
    with _worker(store), pytest.raises(WorkflowFailed, match="bad signal"):
        stub.result(timeout=20)
    [dropped] = stub.describe().dropped
    assert dropped["input"] == "signal" and dropped["name"] == "late"
    assert dropped["reason"].startswith("run closed") and dropped["ts"]
    assert "'order': 7" in dropped["preview"] and len(dropped["preview"]) == PREVIEW_CHARS
    assert dropped["preview"].endswith("...")
    text = _cli("describe", "late1")
    assert "dropped inputs" in text and "late" in text and "signal" in text
    assert json.loads(_cli("describe", "late1", "--json"))["dropped"][0]["name"] == "late"


class _Xor:
    """A stand-in encryption hook: payloads under it are sealed."""

    def encode(self, data: bytes) -> bytes:
        return bytes(b ^ 0x5A for b in data)

    def decode(self, data: bytes) -> bytes:
        return bytes(b ^ 0x5A for b in data)


def test_a_dropped_inputs_preview_is_hidden_under_a_payload_hook() -> None:
    set_payload_hook(_Xor())
    try:
        payload = codec.dumps(["card 4242"])
        raw = ev.encode(ev.SignalReceived(name="pay", payload=payload), 5)
        view = dropped_view({"kind": "dropped", "e": raw, "reason": "run closed", "ts": 5})
    finally:
        set_payload_hook(None)
    assert view["input"] == "signal" and view["name"] == "pay"
    assert view["preview"] == f"<sealed payload, {len(payload)} bytes>"
    update = ev.encode(ev.UpdateRequested(id="u1", name="rename", args=codec.dumps(["n"])), 5)
    view = dropped_view({"e": update, "reason": "run closed", "ts": 5})
    assert (view["input"], view["name"], view["id"], view["preview"]) == ("update", "rename", "u1", "['n']")
    assert dropped_view({"e": b"\xc1garbage", "reason": "x", "ts": 1})["input"] == "unreadable"
