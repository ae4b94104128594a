"""``durable server``'s workflow routes as a tester found them: paging among runs of one
millisecond, ``where`` parsed on its own, ``status=blocked`` with the runs no live worker
serves, the history's ``after`` range, and starts checked against the server's ``--app``.

A real server process on the test Redis, whose ``--app`` is a module written here (a workflow
with its own queue). No worker process runs: the runs stay where they were started, and a
registry entry written by the test stands for a live worker of the queue ``default``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from procs import ROOT, TESTS
from server_procs import ServerProc

from durable import WorkflowStub, codec, registry
from durable.store.connect import flush_database
from durable.store.redis_store import RedisStore
from durable.store.workers import WorkerInfo
from workers.server.endpoint import Call
from workers.server.workflow_routes import MAX_SEQ, start_workflow

pytest.importorskip("uvicorn", reason="the server extra is not installed")

CSRF = {"X-Durable-Request": "1"}
APP = """
from durable import Workflow


class Billed(Workflow):
    queue = "billing"

    def handle(self) -> int:
        return 1


class Order(Workflow):
    def handle(self) -> int:
        return 2
"""


@dataclass
class Api:
    store: RedisStore
    server: ServerProc

    def client(self) -> httpx.Client:
        return self.server.client(**CSRF)


@pytest.fixture(scope="module")
def api(durable_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    flush_database(durable_redis_url)
    folder = tmp_path_factory.mktemp("paging-app")
    (folder / "paging_app.py").write_text(APP)
    store = RedisStore(durable_redis_url)
    # A live worker of the queue `default` that runs Order and Billed (as a worker whose --app
    # is paging_app and which serves only `default` says): nothing serves `billing`.
    fake = WorkerInfo("paging-fake", queues=("default",), workflows=("Billed", "Order", "Served"))
    store.register_worker(fake, ttl_ms=600_000)
    env = {"PYTHONPATH": os.pathsep.join([str(folder), str(TESTS), str(ROOT)])}
    server = ServerProc(durable_redis_url, folder / "server.log", env=env, app="paging_app")
    try:
        yield Api(store, server)
    finally:
        server.stop()
        store.unregister_worker(fake.name)
        store.close()


def _error(resp: httpx.Response, code: str = "invalid_argument", status: int = 422) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["error"]["code"] == code, body
    return str(body["error"]["message"])


def _in_one_ms(store: RedisStore, stubs: list[WorkflowStub]) -> list[tuple[int, str]]:
    """Move ``stubs``' runs into one millisecond (a few into the two around it), as runs started
    at once: the record's ``created`` and the run's score in every index. Returns their
    ``(created, run id)`` newest first, the list's order."""
    ms = store.server_time_ms() - 60_000
    indexes = [k.decode() for k in store.redis.keys(f"{store.keys.prefix}:*:sx:k:*")]
    indexes += [store.keys.runs(p) for p in range(store.keys.partitions)]
    placed = []
    for i, stub in enumerate(stubs):
        created = ms + (1 if i % 10 == 0 else -1 if i % 10 == 1 else 0)
        p = store.ref(stub.id).partition
        store.redis.hset(store.keys.run(p, stub.run_id), "created", created)
        for key in indexes:
            store.redis.zadd(key, {stub.run_id: created}, xx=True)
        placed.append((created, stub.run_id))
    return sorted(placed, reverse=True)


def _pages(c: httpx.Client, limit: int, **params: Any) -> list[tuple[int, str]]:
    """Every row of the runs list, page after page through ``next``."""
    seen: list[tuple[int, str]] = []
    before = params.pop("before", None)
    for _ in range(1000):
        query = {**params, "limit": limit, **({"before": before} if before is not None else {})}
        resp = c.get("/api/v1/workflows", params=query)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        seen += [(r["created"], r["run_id"]) for r in body["workflows"]]
        before = body["next"]
        if before is None:
            return seen
    raise AssertionError("the pages never ended")


@pytest.mark.parametrize("limit", [1, 2, 7])
def test_where_pages_never_skip_runs_of_one_millisecond(api: Api, limit: int) -> None:
    store = api.store
    kind = f"Tie{limit}"
    stubs = [WorkflowStub.make(kind, id=f"tie{limit}-{i:03d}", store=store).start() for i in range(60)]
    placed = _in_one_ms(store, stubs)
    with api.client() as c:
        for where in (
            f"type = '{kind}'",
            f"type in ('{kind}', 'Nope')",
            f"queue = 'default' and type = '{kind}'",
        ):
            assert _pages(c, limit, where=where) == placed, where
        assert _pages(c, limit, type=kind) == placed  # the plain list (no where) pages so too
        # `next` is "<ms>:<run id>"; a bare ms still means "created before it".
        first = c.get("/api/v1/workflows", params={"where": f"type = '{kind}'", "limit": 1}).json()
        assert first["next"] == f"{placed[0][0]}:{placed[0][1]}"
        ms = placed[-1][0] + 1
        older = c.get("/api/v1/workflows", params={"where": f"type = '{kind}'", "before": ms}).json()
        assert [(r["created"], r["run_id"]) for r in older["workflows"]] == [p for p in placed if p[0] < ms]
        bad = c.get("/api/v1/workflows", params={"where": f"type = '{kind}'", "before": "yesterday"})
        assert "'before'" in _error(bad)


def test_runs_started_at_once_through_the_api_page_exactly(api: Api) -> None:
    """As the tester found it: 60 runs started from 8 threads, many in one millisecond."""

    def start(_: int) -> str:
        with api.client() as c:
            resp = c.post("/api/v1/workflows", json={"type": "Order"})
            assert resp.status_code == 201, resp.text
            return str(resp.json()["run_id"])

    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(start, range(60)))
    with api.client() as c:
        for limit in (1, 2, 7):
            seen = [rid for _, rid in _pages(c, limit, where="type = 'Order'")]
            assert sorted(seen) == sorted(ids), limit


def test_where_is_parsed_on_its_own(api: Api) -> None:
    unbalanced = "status='suspended') or (type='Order'"
    with api.client() as c:
        for route in ("/api/v1/workflow-counts", "/api/v1/workflows"):
            message = _error(c.get(route, params={"where": unbalanced}))
            # The position is in what the user typed, which has no "(" before it.
            assert "position 19" in message and "--where" not in message, message
            assert message.startswith("where syntax error"), message
            message = _error(c.get(route, params={"where": "customer >"}))
            assert "unknown search attribute 'customer' at position 1" in message, message
        counts = c.get("/api/v1/workflow-counts", params={"where": "type = 'Order' or type = 'Nope'"})
        assert counts.status_code == 200, counts.text
        assert counts.json()["total"] == counts.json()["counts"]["pending"]
        listed = c.get("/api/v1/workflows", params={"where": "type = 'Order'", "type": "O'Brien"})
        assert listed.status_code == 200 and listed.json()["workflows"] == []  # a quote in a filter


def test_status_blocked_includes_runs_no_live_worker_serves(api: Api) -> None:
    store = api.store
    served = WorkflowStub.make("Served", id="blk-served", store=store).start()
    unserved = [
        WorkflowStub.make("Served", id=f"blk-billing-{i}", queue="billing", store=store).start()
        for i in range(3)
    ]
    # And one blocked on record (as a worker records it: the field and the blocked index).
    recorded = WorkflowStub.make("Served", id="blk-recorded", store=store).start()
    p = store.ref(recorded.id).partition
    created = int(store.redis.hget(store.keys.run(p, recorded.run_id), "created"))
    store.redis.hset(store.keys.run(p, recorded.run_id), "blocked", "nondeterminism (test)")
    store.redis.zadd(store.keys.blocked(p), {recorded.run_id: created})
    want = {s.run_id for s in [*unserved, recorded]}
    with api.client() as c:
        rows = c.get("/api/v1/workflows", params={"status": "blocked", "type": "Served"}).json()["workflows"]
        assert {r["run_id"] for r in rows} == want and served.run_id not in {r["run_id"] for r in rows}
        for row in rows:
            if row["workflow_id"] == "blk-recorded":
                assert row["blocked"] == "nondeterminism (test)" and row.get("blocked_kind") is None
            else:
                assert row["blocked_kind"] == "no_live_worker" and "queue 'billing'" in row["blocked"], row
        for limit in (1, 2, 50):
            seen = {rid for _, rid in _pages(c, limit, status="blocked", type="Served")}
            assert seen == want, limit
        # Every blocked run of the namespace: the Billed runs the start test leaves are among them.
        everything = _pages(c, 3, status="blocked")
        assert want <= {rid for _, rid in everything} and len(everything) == len(set(everything))


def test_rows_say_when_an_activity_the_run_waits_on_has_no_worker_to_run_it(api: Api) -> None:
    """The rows were read without the run's snapshot of its pending steps, so a run whose activity
    waited on a queue no live worker serves, or whose workers' threads are all held by hung
    activities, listed as plain `running` (the CLI's list and describe said why)."""
    store = api.store
    starving = WorkerInfo(
        "paging-starved", queues=("starving",), threads=1, held=1, stuck=("hang (1, attempt 1) ...",)
    )
    store.register_worker(starving, ttl_ms=600_000)
    try:
        waits = {}
        for queue in ("billing", "starving"):
            stub = WorkflowStub.make("Order", id=f"snap-{queue}", store=store).start()
            pending = [{"kind": "activity", "id": "1", "name": "charge", "queue": queue}]
            ref = store.ref(stub.id)
            store.redis.hset(  # as the run's decision records it
                store.keys.run(ref.partition, stub.run_id),
                mapping={"status": "running", "snapshot": codec.pack({"pending": pending})},
            )
            waits[stub.id] = stub.run_id
        with api.client() as c:
            rows = {
                r["workflow_id"]: r
                for r in c.get("/api/v1/workflows", params={"id_prefix": "snap-"}).json()["workflows"]
            }
            blocked = c.get("/api/v1/workflows", params={"status": "blocked", "type": "Order"}).json()[
                "workflows"
            ]
    finally:
        store.unregister_worker(starving.name)
    billing, starved = rows["snap-billing"], rows["snap-starving"]
    assert billing["blocked_kind"] == "no_live_worker", billing
    assert billing["blocked"].startswith(
        "no live worker serves queue 'billing', where activity 'charge' (id 1) waits"
    )
    assert starved["blocked_kind"] == "starved_queue", starved
    assert (
        "waits on queue 'starving': its workers' threads are all held by hung activities"
        in starved["blocked"]
    )
    assert "snapshot" not in billing  # read for the marking, not sent
    assert set(waits.values()) <= {r["run_id"] for r in blocked}


def test_history_after_and_limit_are_checked(api: Api) -> None:
    stub = WorkflowStub.make("Order", id="hist-range", store=api.store).start()
    route = f"/api/v1/workflows/{stub.id}/history"
    with api.client() as c:
        for after in ("999999999999999999999999", str(MAX_SEQ + 1), "-1"):
            assert "'after'" in _error(c.get(route, params={"after": after})), after
        for limit in ("0", "10001"):
            assert "'limit'" in _error(c.get(route, params={"limit": limit})), limit
        assert c.get(route, params={"after": MAX_SEQ}).json()["events"] == []
        assert [e["seq"] for e in c.get(route).json()["events"]] == [1]


def test_start_uses_the_class_queue_and_the_server_app(api: Api) -> None:
    with api.client() as c:
        # Billed runs on its class's queue `billing`, which no live worker serves (the live one
        # on `default` runs Billed: a check of `default` would not warn).
        resp = c.post("/api/v1/workflows", json={"type": "Billed", "id": "start-billed"})
        assert resp.status_code == 201, resp.text
        assert "queue 'billing'" in (resp.json()["warning"] or ""), resp.json()
        assert c.get("/api/v1/workflows/start-billed").json()["queue"] == "billing"
        # Order runs on `default`, served: no warning.
        assert c.post("/api/v1/workflows", json={"type": "Order"}).json()["warning"] is None
        # A type the server's --app does not define: refused, with the near name.
        message = _error(
            c.post("/api/v1/workflows", json={"type": "Ordr", "id": "start-typo"}), "unknown_type"
        )
        assert "not defined in --app paging_app; did you mean 'Order'?" in message, message
        assert c.get("/api/v1/workflows/start-typo").status_code == 404


def test_start_without_app_code_warns(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that loaded no workflow code starts any type by name, with the warning."""
    monkeypatch.setattr(registry, "workflows", dict)
    call = Call(api.store, {}, {}, {"type": "Elsewhere"}, b"", {}, "operator")
    started = start_workflow(call)
    assert started["run_id"] and "no live worker on queue 'default'" in started["warning"]
