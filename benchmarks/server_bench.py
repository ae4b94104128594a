"""The HTTP API at scale: the runs list over 100,000 runs and the run page of a 10,000-event history.

Starts a fresh embedded Redis in a temporary dir, creates ``--runs`` runs (default 100,000;
through the start script, like ``WorkflowStub.start``; then 1% marked failed and 60%
completed so the filters have something to find) and one run whose history holds
``--events`` events (default 10,000: ``side_effect`` calls, decided by an in-process
worker), starts a real ``durable server`` process on a free loopback port and times
``--requests`` requests (default 200) of each kind:

* ``list``: ``GET /api/v1/workflows`` (first page, 50 runs);
* ``list_failed``: ``?status=failed`` (a 1% filter: 20,000 candidates scanned at most);
* ``list_paged``: the 20th page, following ``next`` cursors;
* ``describe`` and ``history``: ``GET /api/v1/workflows/{id}`` and ``.../history?limit=10000``
  of the big run (the run page's two reads).

Prints, per kind, the server time (the app's own access-log milliseconds: routing, Redis,
JSON) and the client's round trip, p50/p99, as JSON::

    python benchmarks/server_bench.py                  # 100,000 runs, 10,000 events
    python benchmarks/server_bench.py --runs 5000 --events 1000 --requests 50
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from durable import Workflow, side_effect
from durable.codec import dumps
from durable.ids import new_run_id
from durable.store.embedded import EmbeddedRedis
from durable.store.redis_store import RedisStore
from durable.testing import TestEnvironment

ROOT = Path(__file__).resolve().parent.parent
_ACCESS = re.compile(r"durable\.server\.access: (\w+) (\S+) (\d+) ([\d.]+)ms")


class ManyEvents(Workflow):
    """A history of ``n`` + 2 events: one ``SideEffectRecorded`` per call."""

    def handle(self, n: int) -> int:
        total = 0
        for i in range(n):
            total += side_effect(lambda i=i: i)
        return total


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2) if ordered else float("nan")


def seed_runs(store: RedisStore, runs: int) -> None:
    args = dumps((1,))
    for i in range(runs):
        wid = f"bench-{i:06d}"
        store.start(workflow_type="Bench", workflow_id=wid, run_id=new_run_id(), args=args, queue="bench")
    # Statuses, written directly (no worker runs "Bench"): 1% failed, 60% completed.
    for p in range(store.keys.partitions):
        with store.redis.pipeline(transaction=False) as pipe:
            for n, rid in enumerate(store.redis.zrange(store.keys.runs(p), 0, -1)):
                status = "failed" if n % 100 == 0 else "completed" if n % 5 < 3 else "suspended"
                pipe.hset(store.keys.run(p, rid.decode()), "status", status)
            pipe.execute()


def big_run(store: RedisStore, events: int) -> str:
    with TestEnvironment(store=store) as env:
        stub = env.start(ManyEvents, events, id="bench-big-history")
        stub.result(timeout=600)
    return stub.id


def _server(url: str, log: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, DURABLE_REDIS_URL=url, PYTHONPATH=str(ROOT))
    env.pop("DURABLE_SERVER_TOKENS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "server", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(400):
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"server did not start: {log.read_text()}")


def measure(base: str, big: str, requests: int) -> dict[str, list[float]]:
    client_ms: dict[str, list[float]] = {}
    with httpx.Client(base_url=base, timeout=60) as c:
        cursor = None
        for _ in range(19):
            cursor = c.get("/api/v1/workflows", params={"before": cursor} if cursor else {}).json()["next"]
        kinds = {
            "list": ("/api/v1/workflows", {}),
            "list_failed": ("/api/v1/workflows", {"status": "failed"}),
            "list_paged": ("/api/v1/workflows", {"before": cursor}),
            "describe": (f"/api/v1/workflows/{big}", {}),
            "history": (f"/api/v1/workflows/{big}/history", {"limit": 10_000}),
        }
        for kind, (path, params) in kinds.items():
            times = client_ms.setdefault(kind, [])
            for _ in range(requests):
                t0 = time.perf_counter()
                resp = c.get(path, params=params)
                times.append((time.perf_counter() - t0) * 1000)
                resp.raise_for_status()
    return client_ms


def run(runs: int, events: int, requests: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        redis_server = EmbeddedRedis(Path(tmp) / "redis")
        url = redis_server.ensure()
        proc = None
        try:
            store = RedisStore(url, flush=True)
            t0 = time.perf_counter()
            seed_runs(store, runs)
            big = big_run(store, events)
            seeded = time.perf_counter() - t0
            log = Path(tmp) / "server.log"
            proc, base = _server(url, log)
            client_ms = measure(base, big, requests)
            proc.terminate()
            proc.wait(15)
            server_ms = [(m[2], float(m[4])) for m in _ACCESS.finditer(log.read_text())]
            # The access log is in request order: the warm-up pages, then `requests` per kind.
            tail = server_ms[len(server_ms) - requests * len(client_ms) :]
            out: dict[str, object] = {
                "runs": runs,
                "events": events,
                "requests": requests,
                "seed_s": round(seeded, 1),
            }
            for n, (kind, times) in enumerate(client_ms.items()):
                mine = [ms for _, ms in tail[n * requests : (n + 1) * requests]]
                out[kind] = {
                    "server_p50_ms": _pct(mine, 0.5),
                    "server_p99_ms": _pct(mine, 0.99),
                    "client_p50_ms": _pct(times, 0.5),
                    "client_p99_ms": _pct(times, 0.99),
                }
            return out
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
            redis_server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    print(json.dumps(run(args.runs, args.events, args.requests), indent=1))


if __name__ == "__main__":
    main()
