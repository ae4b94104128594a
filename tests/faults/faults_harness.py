"""Fault-injection harness: real worker processes, real Redis, injected crashes.

It starts ``Chaos`` workflows (activities with idempotency-keyed effects, a
retried activity, timers, a signal, a child, ``all()``) across several
``durable worker`` processes and, while they run, injects:

* **worker SIGKILLs** at the fault points of ``workers/faults.py`` (env
  ``DURABLE_FAULTS``); a supervisor loop restarts dead workers and the kills are
  counted by point from each worker's stderr file;
* **Redis SIGKILLs** followed by a restart from the AOF (``appendfsync always``:
  nothing acknowledged may be lost; ``everysec``: see :data:`EVERYSEC_WINDOW_S`);
* **duplicated task deliveries**: copies of live activity-task and
  workflow-task entries XADDed into their streams;
* **stalled workers**: SIGSTOP for longer than ``--claim-idle``, then SIGCONT;
* **Redis hiccups** that must not end a worker (each counts as a worker restart):
  a SIGSTOP of Redis longer than the clients' socket timeout (every call times out,
  then SIGCONT), and a period at ``maxmemory`` under ``noeviction`` (writes refused
  with OOM, transactions with EXECABORT), then the limit lifted.

Afterwards :meth:`Harness.check` verifies, over every run and its child: closed
exactly once with the expected result; seqs contiguous; every command id
scheduled once and completed at most once; every activity ran at least once and
every idempotency-keyed effect was applied exactly once; no task of a live run
left pending; every dead letter explained.

Run from pytest (``tests/faults/test_fault_scenarios.py``) or standalone::

    python tests/faults/faults_harness.py --soak --minutes 10
    PYTHONPATH=tests/faults:tests:. python -m faults_harness --scenario worker_kills
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
ROOT = TESTS.parent
for _p in (str(ROOT), str(TESTS), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import redis  # noqa: E402
from faults_app import EFFECTS_PER_RUN, Chaos, expected  # noqa: E402

from durable import WorkflowStub  # noqa: E402
from durable.errors import WorkflowAlreadyStarted, WorkflowClosed, WorkflowNotFound  # noqa: E402
from durable.store.connect import is_transient  # noqa: E402
from durable.store.embedded import EmbeddedRedis  # noqa: E402
from durable.store.keys import GROUP  # noqa: E402
from durable.store.redis_store import CLOSED_STATUSES, RedisStore  # noqa: E402

ALL_POINTS = (
    "activity.after_effect",
    "decision.before_commit",
    "decision.after_commit",
    "timers.after_fire",
    "outbox.before_ack",
)
KILL_LINE = re.compile(r"fault injection: SIGKILL at (\S+)")
OUTAGE_LINE = re.compile(r"redis unavailable \(([^:]+):")
"""A worker's WARNING at the start of a Redis outage (``durable.store.outage``), by kind."""
OOM_HEADROOM = 64 * 1024
"""``maxmemory`` during a redis_oom period: this many bytes above what Redis used when it began."""
EVERYSEC_WINDOW_S = 2.0
"""What ``appendfsync everysec`` can lose, precisely: Redis write()s the AOF buffer to the
kernel before it sends the replies of a batch, and fsyncs once a second in the background.
So a SIGKILL of redis-server alone loses nothing acknowledged (the page cache survives it);
an OS crash or power loss loses the acknowledged writes of the last ~1 s. When a background
fsync is still running, Redis postpones the write() for up to 2 s (``aof_delayed_fsync``)
while it keeps replying, so with a slow disk even a process kill can lose up to ~2 s. The
harness only requires the runs whose every client write (start, signal) was acknowledged more
than this long before a kill to finish; the others may be lost, never corrupt (in soaks on
this machine none was lost: the disk is fast and only the process is killed)."""

CRASH_LOOP_REASON = "deliveries (it crashed or hung its worker)"
"""Dead-letter reason of a workflow task whose decision killed 3 workers in a row:
with injected kills this is expected now and then; the harness repairs the run."""


@dataclass
class Scenario:
    name: str
    workflows: int = 12
    workers: int = 3
    faults: dict[str, float] = field(default_factory=dict)
    redis_kills: int = 0
    appendfsync: str = "always"
    duplicates: bool = False
    stalls: int = 0
    redis_stalls: int = 0  # SIGSTOPs of Redis, each redis_stall_s long
    redis_stall_s: float = 12.0  # past redis-py's 5 s socket timeout, and its retries of it
    oom_periods: int = 0  # periods at maxmemory (noeviction), each oom_s long
    oom_s: float = 4.0
    claim_idle: float = 1.0
    timeout: float = 60.0
    eager: str = "no"  # "no", "yes" or "mixed" (every other worker runs with --eager)


WORKER_KILLS = {
    "activity.after_effect": 0.06,
    "decision.before_commit": 0.03,
    "decision.after_commit": 0.03,
    "timers.after_fire": 0.03,
    "outbox.before_ack": 0.1,
}
"""Chance per pass of SIGKILL at each fault point, in the worker-kill scenarios."""

SCENARIOS: dict[str, Scenario] = {
    "worker_kills": Scenario(
        "worker_kills",
        workflows=20,
        workers=3,
        faults=WORKER_KILLS,
    ),
    "worker_kills_eager": Scenario(
        "worker_kills_eager",
        workflows=16,
        workers=3,
        eager="yes",
        faults=WORKER_KILLS,
    ),
    "duplicates_and_stalls": Scenario(
        "duplicates_and_stalls", workflows=12, workers=3, duplicates=True, stalls=2
    ),
    "redis_kill_always": Scenario("redis_kill_always", workflows=10, workers=2, redis_kills=2),
    "redis_kill_everysec": Scenario(
        "redis_kill_everysec", workflows=10, workers=2, redis_kills=2, appendfsync="everysec"
    ),
    "redis_stall": Scenario("redis_stall", workflows=12, workers=2, redis_stalls=1),
    "redis_oom": Scenario("redis_oom", workflows=8, workers=2, oom_periods=1),
    "everything": Scenario(
        "everything",
        workflows=16,
        workers=3,
        faults={p: 0.02 for p in ALL_POINTS},
        redis_kills=1,
        duplicates=True,
        stalls=1,
        eager="mixed",
        timeout=90.0,
    ),
}


KNOWN_BUGS: set[str] = set()
"""Scenarios left out of the default soak list while a known bug makes them fail (none now)."""


@dataclass
class Outcome:
    """What one scenario did and found."""

    scenario: str
    workflows: int = 0
    completed: int = 0
    lost: list[str] = field(default_factory=list)  # acknowledged starts that never finished
    lost_in_window: list[str] = field(default_factory=list)  # everysec: inside the fsync window
    duplicated: list[str] = field(default_factory=list)  # closed twice / effect applied twice
    violations: list[str] = field(default_factory=list)
    faults: collections.Counter = field(default_factory=collections.Counter)
    seconds: float = 0.0

    def summary(self) -> str:
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(self.faults.items())) or "none"
        return (
            f"[{self.scenario}] workflows={self.workflows} completed={self.completed} "
            f"lost={len(self.lost)} lost_in_fsync_window={len(self.lost_in_window)} "
            f"duplicated={len(self.duplicated)} violations={len(self.violations)} "
            f"time={self.seconds:.1f}s faults: {kinds}"
        )


class WorkerProc:
    """One ``durable worker`` process with its stderr in a file."""

    def __init__(
        self,
        url: str,
        workdir: Path,
        n: int,
        faults: dict[str, float],
        seed: int,
        claim_idle: float,
        eager: bool = False,
    ):
        self.stderr_path = workdir / f"worker-{n}.stderr"
        env = dict(
            os.environ,
            DURABLE_REDIS_URL=url,
            PYTHONPATH=os.pathsep.join([str(HERE), str(TESTS), str(ROOT)]),
        )
        env.pop("DURABLE_FAULTS", None)
        if faults:
            env["DURABLE_FAULTS"] = ",".join(f"{k}={v}" for k, v in faults.items())
            env["DURABLE_FAULTS_SEED"] = str(seed)
        self._err = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "worker", "--app", "faults_app", "--concurrency", "4"]
            + ["--claim-idle", str(claim_idle)]
            + (["--eager"] if eager else []),
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self._err,
            start_new_session=True,
        )
        self.stopped_until = 0.0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._err.close()

    def kills(self) -> collections.Counter:
        return collections.Counter(KILL_LINE.findall(self._stderr()))

    def outages(self) -> collections.Counter:
        """The Redis outages this worker logged, by kind (``OOM``, ``timeout``...)."""
        return collections.Counter(OUTAGE_LINE.findall(self._stderr()))

    def _stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""


def _retry(fn, *args, attempts: int = 100, **kwargs):
    """Call ``fn``, retrying while Redis is down (restarts take a moment)."""
    for i in range(attempts):
        try:
            return fn(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, ConnectionError):
            if i == attempts - 1:
                raise
            time.sleep(0.1)
    return None


class Harness:
    """Runs one scenario against a Redis; :meth:`run` returns an :class:`Outcome`."""

    def __init__(
        self,
        scenario: Scenario,
        url: str,
        workdir: Path,
        *,
        server: EmbeddedRedis | None = None,
        seed: int = 0,
        verbose: bool = True,
    ) -> None:
        if (
            scenario.redis_kills or scenario.redis_stalls or scenario.appendfsync != "always"
        ) and server is None:
            raise ValueError(f"scenario {scenario.name} kills Redis: pass the EmbeddedRedis it may kill")
        self.sc = scenario
        self.url = url
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.server = server
        self.rng = random.Random(seed)
        self.seed = seed
        self.verbose = verbose
        self.store = RedisStore(url)
        self.workers: list[WorkerProc] = []
        self.retired: list[WorkerProc] = []
        self.spawned = 0
        self.out = Outcome(scenario.name, workflows=scenario.workflows)
        self.runs: dict[int, dict[str, Any]] = {}
        self.redis_kill_times: list[float] = []
        self.repaired: set[str] = set()
        # Where each unfinished run stood before the workers stopped (stopping hands their
        # private streams' tasks back to the shared queues, which would hide where they sat).
        self.stuck: dict[str, str] = {}
        self.duplicates = 0
        self.tag = f"{scenario.name}-{seed}-{int(time.time() * 1000) % 10**7}"

    # ----------------------------------------------------------- processes
    def _spawn(self) -> WorkerProc:
        self.spawned += 1
        eager = self.sc.eager == "yes" or (self.sc.eager == "mixed" and self.spawned % 2 == 0)
        w = WorkerProc(
            self.url,
            self.workdir,
            self.spawned,
            self.sc.faults,
            self.seed * 1000 + self.spawned,
            self.sc.claim_idle,
            eager=eager,
        )
        self.workers.append(w)
        return w

    def _supervise(self, now: float) -> None:
        for w in list(self.workers):
            if w.stopped_until and now >= w.stopped_until:
                os.kill(w.proc.pid, signal.SIGCONT)
                w.stopped_until = 0.0
            if not w.alive():
                if w.proc.returncode != -signal.SIGKILL and self.verbose:
                    # Not an injected kill: say why it ended (a hiccup must not end a worker).
                    tail = w._stderr().strip().splitlines()[-3:]
                    print(f"   worker {w.proc.pid} exited with {w.proc.returncode}: {tail}", flush=True)
                self.workers.remove(w)
                self.retired.append(w)
                w.stop()
                self.out.faults["worker_restarts"] += 1
                self._spawn()

    # ------------------------------------------------------------- faults
    def _stall(self) -> None:
        candidates = [w for w in self.workers if w.alive() and not w.stopped_until]
        if len(candidates) < 2:
            return
        w = self.rng.choice(candidates)
        os.kill(w.proc.pid, signal.SIGSTOP)
        w.stopped_until = time.monotonic() + self.sc.claim_idle + 1.5
        self.out.faults["worker_stalls(SIGSTOP)"] += 1

    def _kill_redis(self) -> None:
        assert self.server is not None
        self.redis_kill_times.append(time.monotonic())
        self.server.kill()
        self.out.faults[f"redis_kills({self.sc.appendfsync})"] += 1
        time.sleep(self.rng.uniform(0.2, 0.8))
        self.server.ensure()

    def _duplicate(self) -> None:
        """XADD a copy of a live task entry (activity or workflow) into its stream."""
        k, r = self.store.keys, self.store.redis
        self.duplicates += 1
        kind = self.rng.choice(["activity", "workflow"])
        streams = [
            k.activity_tasks(p, "default") if kind == "activity" else k.workflow_tasks(p, "default")
            for p in range(k.partitions)
        ]
        with r.pipeline(transaction=False) as pipe:
            for stream in streams:
                pipe.xrange(stream, count=10)
            found = [
                (stream, fields)
                for stream, rows in zip(streams, pipe.execute(), strict=True)
                for _, fields in rows
            ]
        if found:
            stream, fields = self.rng.choice(found)
            r.xadd(stream, fields)
            self.out.faults[f"duplicate_{kind}_task(copy)"] += 1
            return
        # Nothing in flight right now: copy a pending activity's task body from its run's
        # activity hash (what the commit enqueued), or send a spurious workflow task.
        open_runs = [info["ref"] for info in self.runs.values() if not info.get("closed") and "ref" in info]
        self.rng.shuffle(open_runs)
        if kind == "workflow":
            if open_runs:
                ref = open_runs[0]
                r.xadd(k.workflow_tasks(ref.partition, "default"), {"run": ref.run_id})
                self.out.faults["duplicate_workflow_task(spurious)"] += 1
            return
        for ref in open_runs:
            acts = r.hgetall(k.activities(ref.partition, ref.run_id))
            ids = [f for f in acts if f + b"@" in acts]
            if ids:
                aid = self.rng.choice(ids)
                r.xadd(acts[aid + b"@"], {"run": ref.run_id, "act": aid, "body": acts[aid]})
                self.out.faults["duplicate_activity_task(from_run)"] += 1
                return

    def _stall_redis(self) -> None:
        """SIGSTOP Redis for longer than the socket timeout: every worker call times out."""
        assert self.server is not None and self.server.pid is not None
        pid = self.server.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(self.sc.redis_stall_s)
        finally:
            os.kill(pid, signal.SIGCONT)
        self.out.faults["redis_stalls(SIGSTOP)"] += 1

    def _redis_oom(self) -> None:
        """Hold Redis at ``maxmemory`` (noeviction) for a while: writes are refused with OOM."""
        r = redis.Redis.from_url(self.url)
        try:
            limit, policy = (r.config_get(k)[k] for k in ("maxmemory", "maxmemory-policy"))
            r.config_set("maxmemory-policy", "noeviction")
            r.config_set("maxmemory", int(r.info("memory")["used_memory"]) + OOM_HEADROOM)
            try:
                time.sleep(self.sc.oom_s)
            finally:
                r.config_set("maxmemory", limit)
                r.config_set("maxmemory-policy", policy)
            self.out.faults["redis_at_maxmemory"] += 1
        finally:
            r.close()

    # --------------------------------------------------------------- runs
    def _start_runs(self) -> None:
        for idx in range(self.sc.workflows):
            folder = self.workdir / "runs" / f"r{idx}"
            folder.mkdir(parents=True, exist_ok=True)
            stub = WorkflowStub.make(Chaos, id=f"chaos-{self.tag}-{idx}", store=self.store)
            info: dict[str, Any] = {"stub": stub, "folder": folder, "signalled": False}
            self.runs[idx] = info
            for attempt in range(100):
                try:
                    stub.start(str(folder), idx, True)
                    break
                except WorkflowAlreadyStarted:
                    if attempt == 0:
                        raise
                    break  # an earlier attempt got through before the connection dropped
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    time.sleep(0.1)
            info["start_acked"] = time.monotonic()

    def _signal(self, info: dict[str, Any]) -> None:
        try:
            info["stub"].signal("go", int(info["folder"].name[1:]))
        except (WorkflowClosed, WorkflowNotFound):
            pass
        info["signalled"] = True
        info["signal_acked"] = time.monotonic()

    def _poll(self) -> None:
        r, k = self.store.redis, self.store.keys
        for info in self.runs.values():
            if info.get("closed"):
                continue
            stub: WorkflowStub = info["stub"]
            try:
                ref = self.store.ref(stub.id)
            except WorkflowNotFound:
                continue  # everysec: its start was lost
            info["ref"] = ref
            status, blocked = (
                x.decode() if x else None
                for x in r.hmget(k.run(ref.partition, ref.run_id), "status", "blocked")
            )
            if status in CLOSED_STATUSES:
                info["closed"] = time.monotonic()
                continue
            if blocked:
                self._blocked(stub.id, blocked)
            for child_id in self._children(ref):
                try:
                    cref = self.store.ref(child_id)
                except WorkflowNotFound:
                    continue
                cblocked = r.hget(k.run(cref.partition, cref.run_id), "blocked")
                if cblocked:
                    self._blocked(child_id, cblocked.decode())

    def _children(self, ref) -> list[str]:
        # Default child workflow id: "<parent id>/<command id>".
        return [f"{ref.workflow_id}/5"]

    def _blocked(self, workflow_id: str, reason: str) -> None:
        if CRASH_LOOP_REASON in reason:
            self.store.repair(workflow_id)
            self.repaired.add(workflow_id)
            self.out.faults["runs_repaired_after_crash_loop"] += 1
        else:
            msg = f"{workflow_id}: blocked: {reason}"
            if msg not in self.out.violations:
                self.out.violations.append(msg)

    # ---------------------------------------------------------------- run
    def run(self) -> Outcome:
        t0 = time.monotonic()
        try:
            for _ in range(self.sc.workers):
                self._spawn()
            self._start_runs()
            self._drive(t0)
            self._settle()
            self.stuck = {
                i["stub"].id: self._stuck_state(i["stub"].id)
                for i in self.runs.values()
                if not i.get("closed")
            }
        finally:
            for w in self.workers + self.retired:
                w.stop()
            for w in self.workers + self.retired:
                self.out.faults.update({f"worker_sigkill@{p}": n for p, n in w.kills().items()})
                self.out.faults.update({f"worker_saw_redis_{k}": n for k, n in w.outages().items()})
        if self.server is not None:
            self.server.ensure()
        self.check()
        self.out.seconds = time.monotonic() - t0
        if self.verbose:
            print(self.out.summary(), flush=True)
            for v in self.out.violations[:20]:
                print("   VIOLATION:", v, flush=True)
        self.store.close()
        return self.out

    def _drive(self, t0: float) -> None:
        sc = self.sc
        deadline = t0 + sc.timeout
        # Fault schedule: spread Redis kills and stalls over the first seconds of the run.
        redis_at = sorted(t0 + self.rng.uniform(1.0, 6.0) for _ in range(sc.redis_kills))
        stall_at = sorted(t0 + self.rng.uniform(0.5, 5.0) for _ in range(sc.stalls))
        hiccups = sorted(
            [(t0 + self.rng.uniform(1.0, 3.0), self._stall_redis) for _ in range(sc.redis_stalls)]
            + [(t0 + self.rng.uniform(0.5, 1.5), self._redis_oom) for _ in range(sc.oom_periods)],
            key=lambda item: item[0],
        )
        pending_signals = list(self.runs.values())
        self.rng.shuffle(pending_signals)
        next_dup = t0
        extra_wait_until = None
        while True:
            now = time.monotonic()
            self._supervise(now)
            try:
                if redis_at and now >= redis_at[0]:
                    redis_at.pop(0)
                    self._kill_redis()
                if stall_at and now >= stall_at[0]:
                    stall_at.pop(0)
                    self._stall()
                if hiccups and now >= hiccups[0][0]:
                    hiccups.pop(0)[1]()
                # Signals trickle in, so some arrive before the wait and some after.
                if pending_signals and now >= t0 + 0.3:
                    self._signal(pending_signals[-1])
                    pending_signals.pop()
                if sc.duplicates and now >= next_dup and self.duplicates < 40:
                    next_dup = now + 0.05
                    self._duplicate()
                self._poll()
            except Exception as exc:  # noqa: BLE001 - Redis restarting, stalled or at maxmemory
                if not is_transient(exc):
                    raise
                time.sleep(0.1)
                continue
            open_runs = [i for i in self.runs.values() if not i.get("closed")]
            if not open_runs and not pending_signals and not redis_at and not stall_at and not hiccups:
                return
            # everysec: runs outside the fsync window must finish; give the rest a little longer.
            if (
                sc.appendfsync == "everysec"
                and self.redis_kill_times
                and not redis_at
                and not [i for i in open_runs if not self._at_risk(i)]
            ):
                extra_wait_until = extra_wait_until or now + 5.0
                if now >= extra_wait_until:
                    return
            if now >= deadline:
                return
            time.sleep(0.05)

    def _at_risk(self, info: dict[str, Any]) -> bool:
        """everysec: a client write of this run was acknowledged within the window before a kill."""
        writes = [info.get("start_acked", 0.0), info.get("signal_acked", 0.0)]
        return any(
            kill - EVERYSEC_WINDOW_S <= w <= kill for kill in self.redis_kill_times for w in writes
        ) or any(w == 0.0 for w in writes)

    def _settle(self) -> None:
        """Let duplicates and reclaimed leftovers drain, then wait for task streams to be acked."""
        deadline = time.monotonic() + 3.0 * self.sc.claim_idle + 2.0
        while time.monotonic() < deadline:
            self._supervise(time.monotonic())
            try:
                if not self._leftover_tasks(only_live=False):
                    return
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                pass
            time.sleep(0.2)

    # ------------------------------------------------------------- checks
    def _task_streams(self) -> list[str]:
        k = self.store.keys
        out = []
        for p in range(k.partitions):
            out += [k.workflow_tasks(p, "default"), k.activity_tasks(p, "default"), k.outbox(p)]
        return out

    def _leftover_tasks(self, *, only_live: bool) -> list[str]:
        """Task entries still pending in a consumer group (of live runs only, if asked)."""
        r, k = self.store.redis, self.store.keys
        out = []
        for stream in self._task_streams():
            if not r.exists(stream):
                continue
            try:
                pending = r.xpending_range(stream, GROUP, min="-", max="+", count=1000)
            except redis.ResponseError:
                continue
            for row in pending:
                entry_id = row["message_id"]
                entry = r.xrange(stream, entry_id, entry_id)
                fields = entry[0][1] if entry else {}
                rid = fields.get(b"run", b"").decode()
                live = False
                if rid:
                    status = r.hget(k.run(k.partition_of_key(stream), rid), "status")
                    live = status is not None and status.decode() not in CLOSED_STATUSES
                if live or not only_live:
                    out.append(f"{stream} {entry_id!r} run={rid or '?'} live={live}")
        return out

    def _check_history(self, wid: str, want: Any, where: str) -> tuple[Any, list[str]] | None:
        """Check one run's history; returns (ref, its activity idempotency keys)."""
        v = self.out.violations
        try:
            ref = self.store.ref(wid)
        except WorkflowNotFound:
            v.append(f"{where}: workflow {wid} not found")
            return None
        hist = self.store.history(ref)
        seqs = [e.seq for e in hist]
        if seqs != list(range(1, len(hist) + 1)):
            v.append(f"{where}: seqs not contiguous: {seqs}")
        closing = [
            e
            for e in hist
            if e.type
            in (
                "WorkflowCompleted",
                "WorkflowFailed",
                "WorkflowCancelled",
                "WorkflowTerminated",
                "WorkflowContinuedAsNew",
            )
        ]
        if len(closing) != 1:
            (self.out.duplicated if len(closing) > 1 else v).append(f"{where}: {len(closing)} closing events")
        elif closing[0] is not hist[-1]:
            v.append(f"{where}: closing event is not the last one")
        elif closing[0].type != "WorkflowCompleted":
            v.append(f"{where}: closed as {closing[0].type}")
        else:
            from durable import codec

            got = codec.loads(closing[0].event.result)
            if got != want:
                v.append(f"{where}: result {got!r} != expected {want!r}")
        scheduled = collections.Counter()
        completed = collections.Counter()
        for e in hist:
            data = e.event.to_data()
            if e.type in ("ActivityScheduled", "TimerStarted", "ChildStarted", "SignalWaitStarted"):
                scheduled[(e.type, data["id"])] += 1
            elif e.type in ("ActivityCompleted", "ActivityFailed", "ActivityCancelled"):
                completed[("ActivityScheduled", data["id"])] += 1
            elif e.type in ("TimerFired", "TimerCancelled"):
                completed[("TimerStarted", data["id"])] += 1
            elif e.type in ("ChildCompleted", "ChildFailed"):
                completed[("ChildStarted", data["id"])] += 1
        for key, n in scheduled.items():
            if n != 1:
                v.append(f"{where}: command {key} scheduled {n} times")
        for key, n in list(completed.items()):
            if key not in scheduled and ("SignalWaitStarted", key[1]) in scheduled:
                # An await_signal timeout is a timer carrying the wait's id.
                completed.pop(key)
                key = ("SignalWaitStarted", key[1])
                completed[key] += n
            if n > 1:
                self.out.duplicated.append(f"{where}: command {key} completed {n} times")
            if key not in scheduled:
                v.append(f"{where}: completion of unscheduled command {key}")
        keys = [f"{ref.run_id}:{e.event.to_data()['id']}" for e in hist if e.type == "ActivityScheduled"]
        return ref, keys

    def _stuck_state(self, workflow_id: str, *, parent: str = "") -> str:
        """Where an unfinished run stands (for the report): its record, inbox, last events, its
        task entries (pending where, or never delivered), activities and timers, its child's state (a parent
        waits on it), and its partition's outbox messages naming the parent (the child's start,
        the child's result)."""
        r, k = self.store.redis, self.store.keys
        try:
            ref = self.store.ref(workflow_id)
            p = ref.partition
            record = {
                key.decode(): value[:60]
                for key, value in r.hgetall(k.run(p, ref.run_id)).items()
                if key not in (b"snapshot", b"parent")
            }
            history = self.store.history(ref)
            tasks = {}  # workflow and activity task entries of the run
            for pattern in (f"{k.tag(p)}:wq:*", f"{k.tag(p)}:aq:*"):
                for key in r.scan_iter(match=pattern):
                    found = self._entries_of(key.decode(), ref.run_id.encode())
                    if found:
                        tasks[key.decode()] = found
            acts = sorted(a.decode()[:-1] for a in r.hkeys(k.activities(p, ref.run_id)) if a.endswith(b"#"))
            timers = [m.decode() for m in r.zrange(k.timers(p), 0, -1) if ref.run_id.encode() in m]
            # Attempts begun and their deadlines (a lease, a timeout): where a lost attempt shows.
            running = [
                (m.decode(), int(due))
                for m, due in r.zrange(k.running(p), 0, -1, withscores=True)
                if ref.run_id.encode() in m
            ]
            state = (
                f"record={record} inbox={r.llen(k.inbox(p, ref.run_id))} "
                f"last events={[e.type for e in history[-4:]]} task entries={tasks} "
                f"pending activities={acts} timers={timers} running={running} "
                f"sticky hosts={sorted(h.decode() for h in r.smembers(k.sticky_hosts(p)))} "
                f"outbox={self._entries_of(k.outbox(p), (parent or workflow_id).encode())}"
            )
            started = [e for e in history if e.type == "ChildStarted"]
            if started and not parent:
                child_id = started[-1].event.to_data()["workflow_id"]
                state += f" || child {child_id}: {self._stuck_state(child_id, parent=workflow_id)}"
            return state
        except Exception as exc:  # noqa: BLE001 - a report, not a check
            return f"(state unreadable: {exc!r})"

    def _entries_of(self, stream: str, needle: bytes) -> list[str]:
        """The entries of a task stream naming ``needle`` (a run id, a workflow id in an outbox
        message), each as ``id:`` ``pending(consumer, idle ms, deliveries)``, ``acked`` (delivered,
        not pending: acked but not deleted) or ``undelivered`` (past the group's last-delivered id)."""
        r = self.store.redis
        rows = [eid for eid, f in r.xrange(stream) if any(needle in v for v in f.values())]
        if not rows:
            return []
        last = next(
            (g["last-delivered-id"] for g in r.xinfo_groups(stream) if g["name"] == GROUP.encode()), b"0-0"
        )
        out = []
        for eid in rows:
            pend = r.xpending_range(stream, GROUP, min=eid, max=eid, count=1)
            if pend:
                x = pend[0]
                out.append(
                    f"{eid.decode()}:pending({x['consumer'].decode()}, {x['time_since_delivered']} ms, "
                    f"{x['times_delivered']}x)"
                )
            else:
                delivered = tuple(map(int, eid.split(b"-"))) <= tuple(map(int, last.split(b"-")))
                out.append(f"{eid.decode()}:{'acked' if delivered else 'undelivered'}")
        return out

    def _late_attempts(self, ref) -> list[str]:
        """Attempts that began after their run closed or their activity was done: none may (the
        worker's begin check refuses them). Each attempt's log record carries when it began
        (``started_ms``); the run record when it closed; the completion log when it was done."""
        closed = self.store.redis.hget(self.store.keys.run(ref.partition, ref.run_id), "closed")
        done: dict[str, int] = {}
        began: list[tuple[str, int, int]] = []
        for item in self.store.log_entries(ref, count=10_000):
            if item.get("kind") != "attempt":
                continue
            if item.get("outcome") in ("completed", "failed"):
                done[item["act"]] = min(done.get(item["act"], item["ts"]), item["ts"])
            started = (item.get("record") or {}).get("started_ms")
            if started:
                began.append((item["act"], item["attempt"], int(started)))
        late = []
        for act, attempt, started in began:
            if closed is not None and started > int(closed):
                late.append(f"{ref.workflow_id}: activity {act} attempt {attempt} began after the run closed")
            elif act in done and started > done[act]:
                late.append(f"{ref.workflow_id}: activity {act} attempt {attempt} began after it was done")
        return late

    def check(self) -> None:
        v = self.out.violations
        for idx, info in self.runs.items():
            stub: WorkflowStub = info["stub"]
            everysec_risk = self.sc.appendfsync == "everysec" and self._at_risk(info)
            if not info.get("closed"):
                if everysec_risk:
                    self.out.lost_in_window.append(stub.id)
                    try:
                        stub.terminate("lost in the everysec fsync window")
                    except (WorkflowClosed, WorkflowNotFound):
                        pass
                else:
                    self.out.lost.append(stub.id)
                    self.out.violations.append(
                        f"lost {stub.id}: {self.stuck.get(stub.id) or self._stuck_state(stub.id)}"
                    )
                continue
            checked = self._check_history(stub.id, expected(idx), f"run {idx}")
            child = self._check_history(f"{stub.id}/5", idx * 2 + 1, f"run {idx} child")
            if checked is None or child is None:
                continue
            self.out.completed += 1
            v.extend(self._late_attempts(checked[0]) + self._late_attempts(child[0]))
            keys = checked[1] + child[1]
            if len(keys) != EFFECTS_PER_RUN:
                v.append(f"run {idx}: {len(keys)} activities scheduled, expected {EFFECTS_PER_RUN}")
            folder: Path = info["folder"]
            ran = set((folder / "ran.log").read_text().split()) if (folder / "ran.log").exists() else set()
            applied = (
                (folder / "applied.log").read_text().split() if (folder / "applied.log").exists() else []
            )
            for key in keys:
                if key not in ran:
                    v.append(f"run {idx}: activity {key} never ran")
                n = applied.count(key)
                if n > 1:
                    self.out.duplicated.append(f"run {idx}: effect {key} applied {n} times")
                elif n == 0:
                    v.append(f"run {idx}: effect {key} never applied")
            stray = set(applied) - set(keys)
            if stray:
                v.append(f"run {idx}: effects of unknown keys {sorted(stray)}")
        live_left = self._leftover_tasks(only_live=True)
        v.extend(f"task of a live run left pending: {t}" for t in live_left)
        self.out.faults["leftover_pending_tasks_of_closed_runs"] += len(
            self._leftover_tasks(only_live=False)
        ) - len(live_left)
        for letter in self.store.dead_letters(count=1000):
            reason = letter.get("reason", "")
            if CRASH_LOOP_REASON in reason:
                self.out.faults["dead_letters(crash_loop_guard)"] += 1
                continue
            v.append(f"unexplained dead letter: {letter.get('kind')} run={letter.get('run')} reason={reason}")


# ---------------------------------------------------------------------- entry points
def run_scenario(
    name: str | Scenario,
    *,
    url: str | None = None,
    server: EmbeddedRedis | None = None,
    workdir: Path | None = None,
    seed: int | None = None,
    verbose: bool = True,
) -> Outcome:
    """Run one scenario. Without ``url``/``server`` it starts a private embedded Redis."""
    scenario = SCENARIOS[name] if isinstance(name, str) else name
    seed = seed if seed is not None else random.randrange(10**6)
    own_tmp = None
    if workdir is None:
        own_tmp = workdir = Path(tempfile.mkdtemp(prefix=f"faults-{scenario.name}-"))
    own_server = None
    if url is None:
        if server is None:
            own_server = server = EmbeddedRedis(workdir / "redis", appendfsync=scenario.appendfsync)
        url = server.ensure()
    try:
        return Harness(scenario, url, workdir, server=server, seed=seed, verbose=verbose).run()
    finally:
        if own_server is not None:
            own_server.stop()
        if own_tmp is not None:
            shutil.rmtree(own_tmp, ignore_errors=True)


def soak(minutes: float, scenarios: list[str], keep_failed: Path | None = None) -> dict[str, Any]:
    """Loop scenarios for ``minutes``; print cumulative figures after each. ``keep_failed``: the
    work folder (workers' logs, the Redis data) of each failing run is kept under it."""
    end = time.monotonic() + minutes * 60
    total = Outcome("soak")
    rounds = 0
    failures: list[str] = []
    t0 = time.monotonic()
    while time.monotonic() < end:
        for name in scenarios:
            if time.monotonic() >= end:
                break
            workdir = keep_failed / f"{name}-{rounds + 1}" if keep_failed is not None else None
            out = run_scenario(name, workdir=workdir)
            if workdir is not None and not (out.violations or out.lost or out.duplicated):
                shutil.rmtree(workdir, ignore_errors=True)
            rounds += 1
            total.workflows += out.workflows
            total.completed += out.completed
            total.lost += out.lost
            total.lost_in_window += out.lost_in_window
            total.duplicated += out.duplicated
            total.violations += out.violations
            total.faults.update(out.faults)
            if out.violations or out.lost or out.duplicated:
                failures.append(out.summary())
            total.seconds = time.monotonic() - t0
            print(f"  cumulative after {rounds} scenario runs: {total.summary()}", flush=True)
    figures = {
        "scenario_runs": rounds,
        "workflows": total.workflows,
        "completed": total.completed,
        "lost": len(total.lost),
        "lost_in_everysec_window": len(total.lost_in_window),
        "duplicated": len(total.duplicated),
        "violations": len(total.violations),
        "faults": dict(total.faults),
        "seconds": round(total.seconds, 1),
        "failures": failures,
        "violation_samples": total.violations[:20],
    }
    print(json.dumps(figures, indent=2), flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--soak", action="store_true", help="loop the scenarios, print cumulative figures")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument(
        "--scenario", action="append", choices=sorted(SCENARIOS), help="repeatable; default all"
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--keep-failed", type=Path, default=None, help="with --soak: keep each failing run's work folder here"
    )
    args = parser.parse_args(argv)
    names = args.scenario or [n for n in SCENARIOS if n not in KNOWN_BUGS]
    if args.soak:
        figures = soak(args.minutes, names, args.keep_failed)
        return 1 if figures["violations"] or figures["lost"] or figures["duplicated"] else 0
    bad = 0
    for name in names:
        out = run_scenario(name, seed=args.seed)
        bad += bool(out.violations or out.lost or out.duplicated)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
