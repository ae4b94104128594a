"""The ceiling for one durable activity step on this machine: Redis running the step's commands
for one client that does nothing but pack them (it prints how busy each of the two was).

One durable step (ARCHITECTURE.md "One step, from history to commit") costs, as written,
ONE Redis command when the worker that runs the activity claimed it (its commit read the task
for it: ``CommitPlan.claimed``) and holds the run's driver in its cache, as in W2:

  the ``commit`` script carrying the attempt's result (ActivityCompleted into history, the
  attempt's log record, ack of its task) with the run's next decision (ActivityScheduled,
  the next activity task, read for the worker and begun there, run record + snapshot).

``--inbox`` also measures the step of a run decided elsewhere than where its activity ran
(the step as written before results rode with the decisions, 3 commands):

  1. the ``complete_activity`` script (inbox push, wake-up: enqueue a workflow task, ack),
     which also reads that workflow task for the worker (from the worker's sticky stream;
     here from the queue's stream, which only these runs use),
  2. the load: MULTI HGETALL run / LRANGE inbox / XRANGE history-after-seq EXEC,
  3. the ``commit`` script (inbox items + ActivityScheduled into history, next
     activity task, run record + snapshot, ack of the workflow task), claiming the task.

Before claimed dispatch that step had two more commands, an XREADGROUP of the activity task
and one of the workflow task (and the worker a begin_attempt round trip this model never
counted); ``--unclaimed`` measures that older step.

This script drives exactly those commands, as fast as ONE client can, against a
private embedded Redis: K synthetic runs (created with the real ``start_run``
script) advance in lock step, and each pass sends each stage for all K runs in
one pipelined write (in the inbox step, the XREADGROUPs ride along with the previous
stage, as a worker would pipeline them). No workflow code, no codec work per step beyond
packing the plan: what is left is Redis (+ this client's packing). The scripts
are ``RedisStore``'s own (``durable/store/lua``), called by EVALSHA.

It prints steps/s, so durable's W2 figure can be read as a fraction of it.
``--eager`` also measures the eager-mode floor: one ``commit`` script per step
(completion + next decision together, no task streams).

    python benchmarks/limit.py [--runs 64] [--seconds 5] [--appendfsync everysec|always] [--inbox] [--eager] [--unclaimed]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from durable import codec  # noqa: E402
from durable.store.embedded import EmbeddedRedis  # noqa: E402
from durable.store.keys import GROUP  # noqa: E402
from durable.store.redis_store import ClaimedTask, RedisStore, RunRef, load_scripts  # noqa: E402
from durable.store.tasks import ActivityTask, AttemptOutcome, CommitPlan  # noqa: E402

QUEUE = "default"


def scheduled_event(aid: str, i: int) -> bytes:
    """An ActivityScheduled history entry of realistic size (envelope + data)."""
    data = {
        "id": aid,
        "name": "noop",
        "args": codec.dumps((i,), path="args"),
        "queue": QUEUE,
        "retry": None,
        "timeouts": {},
        "local": False,
    }
    return codec.pack({"type": "ActivityScheduled", "ts": int(time.time() * 1000), "data": data})


def _entry(task: ClaimedTask) -> tuple[str, str, dict[bytes, bytes]]:
    return task.stream, task.entry_id, task.fields


def _task(k: Any, p: int, rid: str, wid: str) -> ActivityTask:
    return ActivityTask(rid, wid, p, "1", "noop", b"", 1, k.activity_tasks(p, QUEUE))


class Limit:
    def __init__(self, store: RedisStore, n_runs: int, *, claimed: bool = True) -> None:
        self.store = store
        self.claimed = claimed
        self.keys = store.keys
        self.n = n_runs
        self.conn: Any = None
        self._tasks: list[tuple[str, str, dict[bytes, bytes]]] | None = None
        self._claims: list[tuple[str, str, dict[bytes, bytes]]] | None = None
        src = load_scripts()
        self.sha = {name: store.redis.script_load(body) for name, body in src.items()}
        self.runs: list[dict[str, Any]] = []
        self.wq = [self.keys.workflow_tasks(p, QUEUE) for p in range(self.keys.partitions)]
        self.aq = [self.keys.activity_tasks(p, QUEUE) for p in range(self.keys.partitions)]
        store.ensure_groups(self.wq + self.aq)
        start = scheduled_event("0", 0)
        for i in range(n_runs):
            wid = f"limit-{i}"
            rid = f"run{i:06d}"
            ref = store.start(workflow_type="Limit", workflow_id=wid, run_id=rid, args=start[:0], queue=QUEUE)
            p = ref.partition
            k = self.keys
            self.runs.append(
                {
                    "rid": rid,
                    "wid": wid,
                    "p": p,
                    "seq": 1,
                    "step": 0,
                    "run": k.run(p, rid),
                    "history": k.history(p, rid),
                    "inbox": k.inbox(p, rid),
                    # Key lists exactly as the store builds them (one place knows the keys).
                    "commit_keys": store.commit_args(
                        RunRef(p, rid, wid),
                        CommitPlan(1, [], 0, "suspended", {}, activities=[_task(k, p, rid, wid)]),
                    )[0],
                    # Claimed: the completion reads the task it wakes for the worker (a real worker's
                    # sticky stream; here the queue's stream, which holds only these runs' tasks).
                    "complete_keys": store.complete_args(
                        AttemptOutcome(_task(k, p, rid, wid), "completed", {}, k.activity_tasks(p, QUEUE)),
                        taker="limit" if claimed else "",
                        sticky=QUEUE,
                    )[0],
                }
            )
        self.by_rid = {r["rid"]: r for r in self.runs}
        self.snapshot = codec.pack({"pending": [{"kind": "activity", "id": "1", "name": "noop"}]})
        self.result = codec.dumps(1, path="result")
        self.record = codec.pack({"duration_ms": 0})

    def take_connection(self) -> None:
        """Hold one connection of the store's pool for the raw round trips."""
        pool = self.store.redis.connection_pool
        try:
            self.conn = pool.get_connection()
        except TypeError:  # redis-py < 5.3 wants a command name
            self.conn = pool.get_connection("_")

    def close(self) -> None:
        """Give the connection back and close the store."""
        if self.conn is not None:
            self.store.redis.connection_pool.release(self.conn)
            self.conn = None
        self.store.close()

    # --------------------------------------------------------------- wire
    def _roundtrip(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Send every command in one write, read every reply (raw, hiredis-parsed)."""
        conn = self.conn
        conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        out = []
        for _ in commands:
            try:
                out.append(conn.read_response())
            except Exception as exc:  # noqa: BLE001 - a script error is a reply, keep reading
                out.append(exc)
        return out

    def _xreadgroup(self, streams: list[str]) -> tuple[Any, ...]:
        return (
            "XREADGROUP",
            "GROUP",
            GROUP,
            "limit",
            "COUNT",
            self.n,
            "STREAMS",
            *streams,
            *([">"] * len(streams)),
        )

    @staticmethod
    def _entries(reply: Any) -> list[tuple[str, str, dict[bytes, bytes]]]:
        if isinstance(reply, Exception):
            raise reply
        out = []
        if isinstance(reply, dict):  # RESP3
            reply = list(reply.items())
        for stream, rows in reply or ():
            for entry_id, fields in rows:
                it = iter(fields)
                out.append((stream.decode(), entry_id.decode(), dict(zip(it, it, strict=True))))
        return out

    def _commit(
        self,
        run: dict[str, Any],
        inbox: list[bytes],
        task: tuple[str, str] | None,
        done: tuple[str, str, str] | None = None,
    ) -> tuple[Any, ...]:
        """A decision's commit: acking workflow task ``task``, or carrying the result of the
        claimed attempt ``done`` (its stream, entry id, activity id); either way scheduling (and
        claiming) the next activity. Neither: the eager floor's commit, no task streams."""
        queued = task is not None or done is not None
        run["step"] += 1
        aid = str(run["step"])
        body = codec.pack(
            {
                "rid": run["rid"],
                "wid": run["wid"],
                "p": run["p"],
                "aid": aid,
                "name": "noop",
                "args": codec.dumps((run["step"],), path="args"),
                "attempt": 1,
            }
        )
        # As RunStore.commit_args: the lists a decision does not use are left out.
        plan: dict[str, Any] = {
            "rid": run["rid"],
            "seq": run["seq"],
            "events": [*inbox, scheduled_event(aid, run["step"])],
            "consumed": 0 if done is not None else len(inbox),
            "status": "suspended",
            "snapshot": self.snapshot,
        }
        if queued:
            plan["activities"] = [[run["commit_keys"][-1], aid, body, *self._claim()]]
        if done is not None:
            plan["eager"] = [[done[2], 1, self.record, done[0], done[1]]]
        if task is not None:
            plan["task"] = list(task)
        if queued and self.claimed:
            plan["claimer"] = "limit"
        run["seq"] += len(plan["events"])
        keys = run["commit_keys"] if queued else run["commit_keys"][:-1]
        return ("EVALSHA", self.sha["commit"], len(keys), *keys, msgpack.packb(plan, use_bin_type=False))

    def _claim(self) -> list[int]:
        """The claim fields of an activity entry: started ms, no deadline (none when unclaimed)."""
        return [int(time.time() * 1000), 0] if self.claimed else []

    def _complete(self, run: dict[str, Any], stream: str, entry_id: str, aid: str) -> tuple[Any, ...]:
        data = codec.pack({"id": aid, "result": self.result, "attempt": 1})
        args = [run["rid"], aid, 1, entry_id, "completed", "ActivityCompleted", data, 0, b"", self.record]
        if self.claimed:
            args.append("limit")
        return (
            "EVALSHA",
            self.sha["complete_activity"],
            len(run["complete_keys"]),
            *run["complete_keys"],
            *args,
        )

    def _completed(self, aid: str) -> bytes:
        """The ActivityCompleted history entry of activity ``aid``'s result."""
        return codec.pack(
            {"type": "ActivityCompleted", "ts": 0, "data": {"id": aid, "result": self.result, "attempt": 1}}
        )

    def _committed(self, replies: list[Any]) -> list[tuple[str, str, dict[bytes, bytes]]]:
        """The activity tasks the commits of one pass claimed ({stream, entry id, fields, began});
        raises unless every commit went through."""
        for reply in replies:
            if isinstance(reply, Exception) or reply[0] != b"OK":
                raise RuntimeError(f"commit failed: {reply!r}")
        return [_entry(ClaimedTask.read(*c)) for reply in replies for c in reply[3]]

    # -------------------------------------------------------------- modes
    def as_written(self, seconds: float) -> tuple[int, float]:
        """The step's one command, K runs in lock step, 1 round trip per pass: each run's commit
        carries the result of the activity its previous commit claimed and claims the next."""
        if self._claims is None:
            # The runs' first decisions: read their workflow tasks, commit, claim the first activity.
            tasks = self._entries(self._roundtrip([self._xreadgroup(self.wq)])[0])
            first = [self._commit(self.by_rid[f[b"run"].decode()], [], (s, e)) for s, e, f in tasks]
            self._claims = self._committed(self._roundtrip(first))
        steps = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            commits = []
            for stream, entry_id, fields in self._claims:
                aid = fields[b"act"].decode()
                run = self.by_rid[fields[b"run"].decode()]
                commits.append(self._commit(run, [self._completed(aid)], None, done=(stream, entry_id, aid)))
            self._claims = self._committed(self._roundtrip(commits))
            steps += len(commits)
        return steps, time.perf_counter() - t0

    def through_inbox(self, seconds: float) -> tuple[int, float]:
        """The inbox step's commands, K runs in lock step, 3 round trips per pass."""
        steps = 0
        tasks = (
            self._tasks
            if self._tasks is not None
            else self._entries(self._roundtrip([self._xreadgroup(self.wq)])[0])
        )
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            # load: one MULTI/EXEC per run, all runs in one write
            load: list[tuple[Any, ...]] = []
            for _, _, fields in tasks:
                run = self.by_rid[fields[b"run"].decode()]
                load += [
                    ("MULTI",),
                    ("HGETALL", run["run"]),
                    ("LRANGE", run["inbox"], 0, -1),
                    ("XRANGE", run["history"], f"0-{run['seq'] + 1}", "+"),
                    ("EXEC",),
                ]
            replies = self._roundtrip(load)
            # commit every decision + read the activity tasks they enqueue
            commits = []
            for i, (stream, entry_id, fields) in enumerate(tasks):
                run = self.by_rid[fields[b"run"].decode()]
                exec_reply = replies[5 * i + 4]
                if isinstance(exec_reply, Exception):
                    raise exec_reply
                commits.append(self._commit(run, list(exec_reply[1]), (stream, entry_id)))
            replies = self._roundtrip([*commits] if self.claimed else [*commits, self._xreadgroup(self.aq)])
            # Claimed: each commit read its activity task; else the XREADGROUP after them did.
            claimed = self._committed(replies[: len(commits)])
            activities = claimed if self.claimed else self._entries(replies[-1])
            # run the (no-op) activities: complete_activity each + read the workflow tasks they wake
            completes, completed = [], []
            for stream, entry_id, fields in activities:
                run = self.by_rid[fields[b"run"].decode()]
                completes.append(self._complete(run, stream, entry_id, fields[b"act"].decode()))
                completed.append(run)
            replies = self._roundtrip(completes if self.claimed else [*completes, self._xreadgroup(self.wq)])
            for reply in replies[: len(completes)]:
                if isinstance(reply, Exception) or reply[0] != b"OK":
                    raise RuntimeError(f"complete_activity failed: {reply!r}")
            if self.claimed:  # each completion read the task it woke: {entry id, fields}
                tasks = [
                    _entry(ClaimedTask.read(run["complete_keys"][7], *r[2]))
                    for r, run in zip(replies, completed, strict=True)
                ]
            else:
                tasks = self._entries(replies[-1])
            steps += len(completes)
        self._tasks = tasks  # tasks read but not yet decided: the next call starts with them
        return steps, time.perf_counter() - t0

    def eager(self, seconds: float) -> tuple[int, float]:
        """Eager floor: one commit script per step (completion + next decision), 1 round trip per pass."""
        steps = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            completed = [self._completed(str(r["step"])) for r in self.runs]
            replies = self._roundtrip(
                [self._commit(r, [c], None) for r, c in zip(self.runs, completed, strict=True)]
            )
            self._committed(replies)  # the eager floor claims nothing
            steps += len(self.runs)
        return steps, time.perf_counter() - t0


def beside(
    bench: Limit,
    url: str,
    name: str,
    mode: Callable[[Limit, float], tuple[int, float]],
    seconds: float,
    *,
    claimed: bool = True,
    warm: bool = True,
) -> tuple[int, float]:
    """(steps, seconds) of ``mode`` on runs of their own (prefix ``limit-<name>``), on
    ``bench``'s connection, after a warm-up pass when ``warm``."""
    other = Limit(RedisStore(url, prefix=f"limit-{name}"), bench.n, claimed=claimed)
    other.conn = bench.conn
    try:
        if warm:
            mode(other, min(1.0, seconds))
        return mode(other, seconds)
    finally:
        other.store.close()


def cpu(store: RedisStore) -> tuple[float, float]:
    """CPU seconds so far of the Redis server and of this process (the one client)."""
    info = store.redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"]), time.process_time()


def busy(before: tuple[float, float], after: tuple[float, float], elapsed: float) -> dict[str, float]:
    """How busy Redis and the client were between two :func:`cpu` readings, as shares of one
    core: which of the two bounds the ceiling on this machine (it is not always Redis)."""
    return {
        "redis_core": round((after[0] - before[0]) / elapsed, 3),
        "client_core": round((after[1] - before[1]) / elapsed, 3),
    }


def report(label: str, steps: int, elapsed: float, load: dict[str, float] | None = None) -> None:
    line = f"  {label + ':':<58} {steps / elapsed:,.0f} steps/s ({steps:,} steps in {elapsed:.1f} s)"
    if load:
        line += (
            f"; Redis {100 * load['redis_core']:.0f} %, client {100 * load['client_core']:.0f} % of a core"
        )
    print(line)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=64, help="runs advanced in lock step (pipeline depth)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--appendfsync", default="everysec", choices=["everysec", "always", "no"])
    parser.add_argument(
        "--inbox", action="store_true", help="also measure the step through the inbox (3 commands)"
    )
    parser.add_argument("--eager", action="store_true", help="also measure the eager-mode floor")
    parser.add_argument(
        "--unclaimed", action="store_true", help="also measure the step before claimed dispatch (5 commands)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="durable-limit-") as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis", appendfsync=args.appendfsync)
        url = server.ensure()
        try:
            store = RedisStore(url, prefix="limit")
            bench = Limit(store, args.runs)
            bench.take_connection()
            try:
                bench.as_written(min(1.0, args.seconds))  # warm up
                before = cpu(store)
                steps, elapsed = bench.as_written(args.seconds)
                load = busy(before, cpu(store), elapsed)
                print(f"Ceiling, appendfsync {args.appendfsync}, {args.runs} runs in lock step, one client:")
                report("as written (1 command/step, 1 round trip/pass)", steps, elapsed, load)
                if args.inbox:
                    steps, elapsed = beside(bench, url, "inbox", Limit.through_inbox, args.seconds)
                    report("through the inbox (3 commands/step, 3 round trips/pass)", steps, elapsed)
                if args.unclaimed:
                    steps, elapsed = beside(
                        bench, url, "unclaimed", Limit.through_inbox, args.seconds, claimed=False
                    )
                    report("unclaimed (5 commands/step, before claimed dispatch)", steps, elapsed)
                if args.eager:  # fresh runs, empty inboxes; no warm-up pass
                    steps, elapsed = beside(bench, url, "eager", Limit.eager, args.seconds, warm=False)
                    report("eager floor (1 commit script/step)", steps, elapsed)
            finally:
                bench.close()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
