"""Search over closed runs: the latency of filtered lists and counts, and index memory per run.

Inserts ``--runs`` runs (default 100,000) through the store's own start and terminate scripts
(``start_run.lua`` then ``terminate.lua``, batched ``--batch`` per round trip), each with four
search attributes (``customer``: 1 of 1,000; ``region``: 1 of 5; ``amount``: float; ``vip``:
bool), so every index entry is written exactly as a real run's would be. Then it times
``durable.list_runs``/``count_runs`` (``--repeat`` times each; p50 and p99) and measures:

* index memory per run: the ``T:sx:*`` keys (``MEMORY USAGE``), plus what the index adds to a
  run record (the ``sa``/``sx``/``sxs`` fields, measured on a sample of records);
* the runs index (``T:runs``, which ``durable list`` had before) for comparison.

Runs on a fresh embedded Redis in a temporary dir::

    python benchmarks/search_bench.py                  # 100,000 runs
    python benchmarks/search_bench.py --runs 20000 --repeat 20
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout, installed or not

import durable  # noqa: E402
from durable import SearchAttribute, codec  # noqa: E402
from durable import events as ev  # noqa: E402
from durable.ids import new_run_id  # noqa: E402
from durable.search import encode_values  # noqa: E402
from durable.store.embedded import EmbeddedRedis  # noqa: E402
from durable.store.redis_store import RedisStore  # noqa: E402
from durable.store.search import pack_index, start_index  # noqa: E402

SearchAttribute("customer", "keyword")
SearchAttribute("region", "keyword")
SearchAttribute("amount", "float")
SearchAttribute("vip", "bool")

REGIONS = ("eu", "us", "apac", "latam", "mea")


def insert(store: RedisStore, runs: int, batch: int, inserted: list[dict[str, Any]]) -> float:
    """Start and terminate ``runs`` runs (their attributes appended to ``inserted``); returns
    the seconds it took."""
    k, rng, t0 = store.keys, random.Random(7), time.perf_counter()
    args = codec.dumps((), path="args")
    stopped = codec.pack(ev.WorkflowTerminated(reason="bench").to_data())
    store.publish_search_types()
    for first in range(0, runs, batch):
        starts, stops = [], []
        for i in range(first, min(first + batch, runs)):
            wid, rid = f"order-{i}", new_run_id()
            p = k.partition(wid)
            attrs = {
                "customer": f"c{rng.randrange(1000)}",
                "region": rng.choice(REGIONS),
                "amount": round(rng.uniform(1, 1000), 2),
                "vip": rng.random() < 0.1,
            }
            inserted.append(attrs)
            values = encode_values(attrs)
            data = ev.WorkflowStarted(
                workflow_type="Order", workflow_id=wid, run_id=rid, args=args, search_attributes=values
            ).to_data()
            starts.append(
                (
                    [
                        k.instance(p, wid),
                        k.run(p, rid),
                        k.history(p, rid),
                        k.workflow_tasks(p, "bench"),
                        k.runs(p),
                    ],
                    # ARGV: ..., parent, retention, start options (none), search index (start_run.lua)
                    [
                        wid,
                        rid,
                        "Order",
                        "default",
                        codec.pack(data),
                        b"",
                        "",
                        b"",
                        pack_index(start_index(data)),
                    ],
                )
            )
            # A run no decision has touched has no snapshot: the terminate script checks its SHA1.
            args_ = [rid, stopped, b"", NO_SNAPSHOT_SHA1, codec.pack([])]  # no timers to drop
            stops.append(([k.instance(p, wid), *k.terminated_keys(p, rid), k.outbox(p)], args_))
        store._script_many("start_run", starts, raise_on_error=True)
        store._script_many("terminate", stops, raise_on_error=True)
    for p in range(k.partitions):  # the unread workflow tasks are not what is measured
        store.redis.delete(k.workflow_tasks(p, "bench"))
    return time.perf_counter() - t0


NO_SNAPSHOT_SHA1 = hashlib.sha1(b"", usedforsecurity=False).hexdigest()

#: Each query's matches among the inserted runs' attributes (every run is closed, terminated and
#: started within the hour), in the order of ``main``'s queries.
EXPECTED: list[Callable[[dict[str, Any]], bool]] = [
    lambda a: a["customer"] == "c42",
    lambda a: a["customer"] == "c42",
    lambda a: a["region"] == "eu" and a["vip"],
    lambda a: a["customer"] in ("c1", "c2", "c3") and a["amount"] > 500,
    lambda a: a["amount"] > 990,
    lambda a: True,
]


def check_counts(store: RedisStore, queries: dict[str, str], inserted: list[dict[str, Any]]) -> None:
    """Refuse to time searches that do not find what was inserted: a change of the start or
    terminate scripts' arguments once left this bench timing empty results."""
    for (name, query), matches in zip(queries.items(), EXPECTED, strict=True):
        want, got = sum(1 for a in inserted if matches(a)), durable.count_runs(query, store=store)
        if got != want:
            raise SystemExit(
                f"search_bench: {name!r} counts {got} runs, but {want} were inserted that match: the "
                "bench no longer drives start_run.lua / terminate.lua as they are; fix insert()"
            )


def timed(fn: Any, repeat: int) -> dict[str, Any]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    size = len(result) if isinstance(result, list) else result
    return {
        "p50_ms": round(statistics.median(times), 2),
        "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))], 2),
        "rows": size,
    }


def memory(store: RedisStore, runs: int) -> dict[str, float]:
    r = store.redis
    index = sum(r.memory_usage(key) or 0 for key in r.scan_iter(f"{store.keys.prefix}:*:sx:*", count=1000))
    runs_index = sum(r.memory_usage(store.keys.runs(p)) or 0 for p in range(store.keys.partitions))
    fields = []
    for i, key in enumerate(r.scan_iter(f"{store.keys.prefix}:*:run:*", count=1000)):
        if i >= 300:
            break
        r.restore("bench:copy", 0, r.dump(key), replace=True)
        before = r.memory_usage("bench:copy") or 0
        r.hdel("bench:copy", "sa", "sx", "sxs")
        fields.append(before - (r.memory_usage("bench:copy") or 0))
    r.delete("bench:copy")
    return {
        "index_keys_bytes_per_run": round(index / runs, 1),
        "record_fields_bytes_per_run": round(statistics.mean(fields), 1),
        "index_total_bytes_per_run": round(index / runs + statistics.mean(fields), 1),
        "runs_index_bytes_per_run (before: durable list)": round(runs_index / runs, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=50)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis")
        url = server.ensure()
        try:
            store = RedisStore(url, flush=True)
            inserted: list[dict[str, Any]] = []
            took = insert(store, opts.runs, opts.batch, inserted)
            t0 = store.server_time_ms() - 3_600_000
            queries = {
                "customer = 'c42' (keyword, ~100 matches)": "customer = 'c42'",
                "customer = 'c42' and status = 'terminated'": "customer = 'c42' and status = 'terminated'",
                "region = 'eu' and vip = true and started > -1h": f"region = 'eu' and vip = true and started > {t0}",
                "customer in ('c1','c2','c3') and amount > 500": "customer in ('c1', 'c2', 'c3') and amount > 500",
                "amount > 990 (numeric range)": "amount > 990",
                "status = 'closed' (all runs)": "status = 'closed'",
            }
            check_counts(store, queries, inserted)
            lists = {
                name: timed(lambda w=w: durable.list_runs(w, limit=50, store=store), opts.repeat)
                for name, w in queries.items()
            }
            counts = {
                name: timed(lambda w=w: durable.count_runs(w, store=store), max(opts.repeat // 5, 3))
                for name, w in queries.items()
            }
            report = {
                "runs": opts.runs,
                "partitions": store.keys.partitions,
                "insert_seconds": round(took, 1),
                "list_limit_50": lists,
                "count": counts,
                "memory": memory(store, opts.runs),
            }
            print(json.dumps(report, indent=2))
            store.close()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
