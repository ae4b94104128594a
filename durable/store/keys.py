"""Every Redis key durable uses, in one place.

All keys of one workflow id — its instance record, its runs, their histories
and inboxes — and the task streams its tasks go to share the hash tag of the
workflow's **partition** (``{prefix}:{p}``), so every Lua script touches one
slot and the same scripts run on one Redis or on a Redis Cluster.

Layout (``T`` = ``prefix:{p}``)::

    T:wf:<workflow id>     hash    instance: current run, type, status
    T:run:<run id>         hash    run record: status, seq, task flag, snapshot, result; inbytes:
                                   bytes of the signals and updates it took (max_history_bytes);
                                   handed, handed_grace: its workflow task's last hand-back (views)
    T:h:<run id>           stream  history, entry id 0-<seq>, field "e" = event bytes
    T:in:<run id>          list    inbox: stamped input events not yet decided
    T:act:<run id>         hash    activity id -> current task body (attempt, state)
    T:log:<run id>         stream  beside the history: attempts, dropped inputs
    T:upd:<run id>         hash    update id -> ms it was delivered: one delivery per id (exactly-once)
    T:sent:<input id>      string  run id a client's signal (or hook payload) went to, for SENT_TTL_MS:
                                   a resend (its reply lost in an outage) is not delivered twice
    T:wq:<queue>           stream  workflow tasks of runs not pinned to a build (consumer group "workers")
    T:wq:<queue>@<build>   stream  workflow tasks of runs pinned to a build id
    T:wq:@<worker>         stream  a worker's private (sticky) workflow tasks: runs it has cached
    T:aq:<queue>           stream  activity tasks (consumer group "workers")
    T:aq:@<worker>         stream  a worker's private activity tasks (its sessions'); deleted with its
                                   T:wq:@<worker> when it stops or its lease lapses, once empty
    T:ox                   stream  outbox: cross-partition messages (children)
    T:act:<run id> fields  <aid> body, <aid># current attempt, <aid>@ task stream,
                           <aid>:hb heartbeat details, <aid>:started attempt start (ms),
                           <aid>:handed "<worker>|<why>": that worker put the task back (not a death),
                           <aid>:worker "<attempt>|<worker>|<begins>": who began it last, how often,
                           <aid>:rerun the attempt a lapsed lease put in its queue again
    T:timers               zset    due time (ms) -> "t|run|id" timer, "r|run|id" retry,
                                   "d|run|run" / "d|run|execution" workflow timeout, "w|run|ms" and
                                   "u|run|id|ms" tasks handed back by a worker that lacks their type
    T:running              zset    attempt deadline (ms) -> "run|activity id|attempt"
    T:clock                string  clock offset (ms) the scripts add to Redis TIME (tests: time skipping)
    T:origin               hash    id (random), created (ms); lost, lost_by: when a worker found the
                                   partition's earlier marker gone (Redis lost its data), and which
    T:runs                 zset    created (ms) -> run id, for `durable list` (and `started` in --where)
    T:sx:k:<attr>:<value>  zset    created (ms) -> run id: runs whose keyword-like attribute has the value
    T:sx:n:<attr>          zset    value (number, ms) -> run id: numeric and datetime attributes, `closed`
    T:sx:tmp:<n>           zset    a search query's intermediate set (deleted before its script returns)
    T:closed               zset    end of retention (ms) -> run id of a closed run, purged then
    T:retention            string  the namespace's retention (ms) of runs closing from now on
    T:dead                 stream  dead letters: tasks parked with their reason
    T:hooks                hash    hook token digest (sha256:<hex>) -> "run|hook id"
    T:sessions             set     private queues (worker sessions) whose activity tasks are not all
                                   run or failed yet: a dead one's are failed (SessionLost)
    T:alive:@<worker>      string  a worker's lease (expires when it dies): its sessions, its sticky runs
    T:sticky               set     workers (private queue names) whose private streams exist
    T:sc:<schedule id>     hash    a schedule (in its id's partition): spec, args, next time, paused, counters
    T:scc:<schedule id>    zset    start due (ms, after jitter) -> "<scheduled ms>|<kind>|<overlap>" claimed times
    T:scb:<schedule id>    list    claimed times buffered by the overlap policy (same members)
    T:scr:<schedule id>    zset    scheduled ms -> workflow id of the runs it started (pruned once closed)
    T:sca:<schedule id>    list    recent actions (JSON), newest first
    T:scl:<schedule id>    string  the lock of the scheduler working on the schedule (expires)
    T:schedules            zset    next scheduled time (ms) -> schedule id, of active schedules
    T:schedbusy            set     schedule ids with claimed or buffered times to start
    T:schedall             set     every schedule id of the partition (for `durable schedule list`)
    prefix:meta            hash    deployment settings (partition count)
    prefix:hook-secret     string  the secret hook tokens are derived with (unless DURABLE_HOOK_SECRET is set)
    prefix:build:<queue>   string  the current build id: its workers start the queue's new runs
    prefix:builds          set     JSON [queue, build] of every build a worker served (its pinned
                                   streams are deleted once empty, no live worker serving the build)
    prefix:search-attributes hash  declared search attribute name -> type (for --where elsewhere)
    prefix:workers         set     names of registered workers (entries whose key expired are stale)
    prefix:worker:<name>   string  a live worker's registry entry (JSON; expires unless its heartbeat renews it)
    prefix:startfail:<host:pid> string a supervisor whose worker processes die before they join (JSON:
                                   queues, error line, retry delay; expires unless it says it again)
    prefix:startfails      set     host:pid of those supervisors (names whose key expired are stale)
"""

from __future__ import annotations

import zlib

GROUP = "workers"
"""Consumer group name on every task stream."""

PRIVATE = "@"
"""First character of a private queue name (a worker's own queue: sessions, sticky runs)."""

SEP = "|"
"""Separator inside zset members and hook targets (run ids and activity ids never hold one)."""

TIMER = "t"
"""Kind of a workflow timer's member in ``T:timers``."""

RETRY = "r"
"""Kind of an activity retry's member in ``T:timers``."""

DEADLINE = "d"
"""Kind of a run's workflow timeout member in ``T:timers`` (item: ``run`` or ``execution``)."""

HANDED_BACK = "w"
"""Kind of a workflow task handed back by a worker that lacks its type, re-added to the run's
queue when due (its id: when the type was first seen unserved, ms; 0: it is served)."""

HANDED_BACK_ACTIVITY = "u"
"""Kind of an activity task handed back likewise (its id: ``<activity id>|<first unserved ms>``)."""

SENT_TTL_MS = 120_000
"""How long ``T:sent:<signal id>`` lasts: well past the last retry of a client's signal
(:data:`~durable.store.outage.CLIENT_RIDE_S` plus a socket timeout), short enough that a
thousand signals a second keep only ~120k small keys."""

# Fields of the activity hash ``T:act:<run id>`` beside ``<aid>`` (the current task body).
ATTEMPT_SUFFIX = "#"
STREAM_SUFFIX = "@"
HEARTBEAT_SUFFIX = ":hb"
STARTED_SUFFIX = ":started"
WORKER_SUFFIX = ":worker"
RERUN_SUFFIX = ":rerun"
HANDED_SUFFIX = ":handed"


def timer_member(run_id: str, timer_id: str) -> str:
    """The ``T:timers`` member of a workflow timer."""
    return f"{TIMER}{SEP}{run_id}{SEP}{timer_id}"


def retry_member(run_id: str, activity_id: str) -> str:
    """The ``T:timers`` member of an activity's next attempt, waiting for its backoff."""
    return f"{RETRY}{SEP}{run_id}{SEP}{activity_id}"


def deadline_member(run_id: str, timeout: str) -> str:
    """The ``T:timers`` member of a run's workflow timeout (``run`` or ``execution``)."""
    return f"{DEADLINE}{SEP}{run_id}{SEP}{timeout}"


def handed_back_member(run_id: str, first_unserved_ms: int, activity_id: str = "") -> str:
    """The ``T:timers`` member that re-adds a handed-back workflow (or activity) task to its queue."""
    if activity_id:
        return f"{HANDED_BACK_ACTIVITY}{SEP}{run_id}{SEP}{activity_id}{SEP}{first_unserved_ms}"
    return f"{HANDED_BACK}{SEP}{run_id}{SEP}{first_unserved_ms}"


def parse_timer_member(member: str) -> tuple[str, str, str]:
    """``(kind, run id, timer or activity id)`` of a ``T:timers`` member."""
    kind, run_id, item = member.split(SEP, 2)
    return kind, run_id, item


def attempt_member(run_id: str, activity_id: str, attempt: int) -> str:
    """The ``T:running`` member of a running attempt (its score is the attempt's deadline)."""
    return f"{run_id}{SEP}{activity_id}{SEP}{attempt}"


def parse_attempt_member(member: str) -> tuple[str, str, int]:
    """``(run id, activity id, attempt)`` of a ``T:running`` member."""
    run_id, activity_id, attempt = member.rsplit(SEP, 2)
    return run_id, activity_id, int(attempt)


def hook_target(run_id: str, hook_id: str) -> str:
    """The ``T:hooks`` value of a hook token: which run, which hook."""
    return f"{run_id}{SEP}{hook_id}"


def parse_hook_target(value: str) -> tuple[str, str]:
    """``(run id, hook id)`` of a ``T:hooks`` value."""
    run_id, hook_id = value.split(SEP, 1)
    return run_id, hook_id


def attempt_field(activity_id: str) -> str:
    """Activity-hash field: the activity's current attempt number."""
    return activity_id + ATTEMPT_SUFFIX


def stream_field(activity_id: str) -> str:
    """Activity-hash field: the task stream the activity's attempts go to."""
    return activity_id + STREAM_SUFFIX


def heartbeat_field(activity_id: str) -> str:
    """Activity-hash field: the last heartbeat details of the current attempt."""
    return activity_id + HEARTBEAT_SUFFIX


def started_field(activity_id: str) -> str:
    """Activity-hash field: when the current attempt started (ms)."""
    return activity_id + STARTED_SUFFIX


def worker_field(activity_id: str) -> str:
    """Activity-hash field: :func:`begun_by`, the last attempt begun, its worker, how often it began."""
    return activity_id + WORKER_SUFFIX


def rerun_field(activity_id: str) -> str:
    """Activity-hash field: the leased attempt a lapsed lease put in its queue again (once)."""
    return activity_id + RERUN_SUFFIX


def handed_field(activity_id: str) -> str:
    """Activity-hash field: :func:`handed_by`, set when the worker that began the attempt put its
    task back (``requeue_pending.lua``); the next begin reads and deletes it (not a death)."""
    return activity_id + HANDED_SUFFIX


def handed_by(worker: str, why: str) -> str:
    """The :func:`handed_field` value ``"<worker>|<why>"``."""
    return f"{worker}|{why}"


def begun_by(attempt: int, worker: str, begins: int) -> str:
    """The :func:`worker_field` value ``"<attempt>|<worker>|<begins>"`` (``begin_attempt.lua``
    and ``commit.lua`` write it)."""
    return f"{attempt}|{worker}|{begins}"


def parse_begun_by(value: str) -> tuple[int | None, str, int]:
    """A :func:`begun_by` value as ``(attempt, worker, begins)``; an older release's
    ``"<attempt>|<worker>"`` counts one begin, and an empty one no attempt."""
    began, _, rest = value.partition("|")
    worker, _, begins = rest.partition("|")
    return (int(began) if began.isdigit() else None), worker, int(begins) if begins.isdigit() else 1


def keyword_posting(attribute: str, value: str) -> str:
    """Search index key suffix (after ``T:sx:``) of runs whose keyword-like ``attribute`` is ``value``."""
    return f"k:{attribute}:{value}"


def number_posting(attribute: str) -> str:
    """Search index key suffix (after ``T:sx:``) of a numeric or datetime ``attribute``."""
    return f"n:{attribute}"


def search_temp(n: int | str) -> str:
    """Search index key suffix of a query's ``n``-th intermediate set."""
    return f"tmp:{n}"


def activity_queue(stream: str) -> str:
    """The queue of an activity task stream (:meth:`Keys.activity_tasks`)."""
    return stream.partition("}")[2].removeprefix(":aq:")


def is_private(queue: str) -> bool:
    """Whether ``queue`` is a worker's private queue (``@<worker>``)."""
    return queue.startswith(PRIVATE)


def private_queue(worker: str) -> str:
    """The private queue of worker ``worker`` (its sticky workflow tasks, its worker sessions'
    activities): ``@`` and its name, ``:`` written ``-``."""
    return PRIVATE + worker.replace(":", "-")


class Keys:
    """Key names for one deployment (prefix + partition count)."""

    def __init__(self, prefix: str = "durable", partitions: int = 8) -> None:
        self.prefix = prefix
        self.partitions = partitions
        self.meta = f"{prefix}:meta"
        self._tags = [f"{prefix}:{{{p}}}" for p in range(partitions)]

    def partition(self, workflow_id: str) -> int:
        """The partition of a workflow id: stable across processes and versions (CRC-32)."""
        return zlib.crc32(workflow_id.encode()) % self.partitions

    def tag(self, p: int) -> str:
        """The key prefix carrying partition ``p``'s hash tag; scripts build run keys from it."""
        return self._tags[p] if 0 <= p < self.partitions else f"{self.prefix}:{{{p}}}"

    def instance(self, p: int, workflow_id: str) -> str:
        return f"{self.tag(p)}:wf:{workflow_id}"

    def run(self, p: int, run_id: str) -> str:
        return f"{self.tag(p)}:run:{run_id}"

    def history(self, p: int, run_id: str) -> str:
        return f"{self.tag(p)}:h:{run_id}"

    def inbox(self, p: int, run_id: str) -> str:
        return f"{self.tag(p)}:in:{run_id}"

    def activities(self, p: int, run_id: str) -> str:
        return f"{self.tag(p)}:act:{run_id}"

    def log(self, p: int, run_id: str) -> str:
        return f"{self.tag(p)}:log:{run_id}"

    def terminated_keys(self, p: int, run_id: str) -> list[str]:
        """The keys of run ``run_id`` its termination writes (``terminate_run`` in ``_lib.lua``),
        in the scripts' order: run, history, inbox, activities, log."""
        return [
            self.run(p, run_id),
            self.history(p, run_id),
            self.inbox(p, run_id),
            self.activities(p, run_id),
            self.log(p, run_id),
        ]

    def updates(self, p: int, run_id: str) -> str:
        return f"{self.tag(p)}:upd:{run_id}"

    def sent_input(self, p: int, input_id: str) -> str:
        """Where a client's input (a signal by its signal id, a hook payload by its delivery id)
        notes the run it went to (expires after :data:`SENT_TTL_MS`)."""
        return f"{self.tag(p)}:sent:{input_id}"

    def workflow_tasks(self, p: int, queue: str, build: str = "") -> str:
        """Workflow tasks of ``queue``: runs pinned to ``build``, or not pinned (``""``)."""
        return f"{self.tag(p)}:wq:{queue}@{build}" if build else f"{self.tag(p)}:wq:{queue}"

    def current_build(self, queue: str) -> str:
        """Which build id takes the new runs of ``queue`` (plain key: read outside scripts)."""
        return f"{self.prefix}:build:{queue}"

    def hook_secret(self) -> str:
        """The namespace's hook token secret (plain key: read outside scripts)."""
        return f"{self.prefix}:hook-secret"

    def search(self, p: int, suffix: str) -> str:
        """A search index key of partition ``p`` (suffix: :func:`keyword_posting`...)."""
        return f"{self.tag(p)}:sx:{suffix}"

    def search_types(self) -> str:
        """Declared search attribute types, published for other processes (plain key)."""
        return f"{self.prefix}:search-attributes"

    def queues(self) -> str:
        """The names of the queues tasks were sent to (plain key: the workers page shows those
        no live worker serves, with their backlog)."""
        return f"{self.prefix}:queues"

    def served_builds(self) -> str:
        """``[queue, build]`` (JSON) pairs versioned workers served (plain key: the sweep of
        retired builds' task streams reads it)."""
        return f"{self.prefix}:builds"

    def worker_index(self) -> str:
        """The names of registered workers (plain key: read outside scripts)."""
        return f"{self.prefix}:workers"

    def worker(self, name: str) -> str:
        """A worker's registry entry: what it serves; it expires unless the worker renews it."""
        return f"{self.prefix}:worker:{name}"

    def start_failure(self, supervisor: str) -> str:
        """What a supervisor whose worker processes die before joining says (``host:pid``)."""
        return f"{self.prefix}:startfail:{supervisor}"

    def start_failures(self) -> str:
        """The supervisors (``host:pid``) that said :meth:`start_failure` (plain key)."""
        return f"{self.prefix}:startfails"

    def worker_drain(self, name: str) -> str:
        """An operator's ask that a worker drain (``durable drain``): read with its heartbeat."""
        return f"{self.prefix}:worker-drain:{name}"

    def activity_tasks(self, p: int, queue: str) -> str:
        return f"{self.tag(p)}:aq:{queue}"

    def outbox(self, p: int) -> str:
        return f"{self.tag(p)}:ox"

    def timers(self, p: int) -> str:
        return f"{self.tag(p)}:timers"

    def running(self, p: int) -> str:
        return f"{self.tag(p)}:running"

    def runs(self, p: int) -> str:
        return f"{self.tag(p)}:runs"

    def blocked(self, p: int) -> str:
        """Blocked runs by creation time (ms), like :meth:`runs`: ``list --status blocked``
        pages through it instead of through every run. Entries of runs closed while blocked
        (terminated) stay until the run is purged; readers check the record."""
        return f"{self.tag(p)}:blocked"

    def closed(self, p: int) -> str:
        """Closed runs by the end of their retention (ms): the scheduler purges them then."""
        return f"{self.tag(p)}:closed"

    def closes(self, p: int) -> str:
        """Runs closed outside a decision (terminated): a stream the metrics readers count, in
        their consumer group; written only once a metrics reader created it."""
        return f"{self.tag(p)}:closes"

    def retention(self, p: int) -> str:
        """The namespace retention (ms), one copy per partition: the closing scripts read it."""
        return f"{self.tag(p)}:retention"

    def dead(self, p: int) -> str:
        return f"{self.tag(p)}:dead"

    def sessions(self, p: int) -> str:
        return f"{self.tag(p)}:sessions"

    def alive(self, p: int, session_queue: str) -> str:
        return f"{self.tag(p)}:alive:{session_queue}"

    def sticky_hosts(self, p: int) -> str:
        return f"{self.tag(p)}:sticky"

    def hooks(self, p: int) -> str:
        return f"{self.tag(p)}:hooks"

    def origin(self, p: int) -> str:
        """Partition ``p``'s origin marker (see ``durable.store.origins``)."""
        return f"{self.tag(p)}:origin"

    def clock(self, p: int) -> str:
        """Partition ``p``'s clock offset (tests only: time skipping; see ``_lib.lua``)."""
        return f"{self.tag(p)}:clock"

    def schedule(self, p: int, schedule_id: str) -> str:
        """A schedule's record (partition: ``partition(schedule_id)``, like a workflow id's)."""
        return f"{self.tag(p)}:sc:{schedule_id}"

    def schedule_keys(self, p: int, schedule_id: str) -> list[str]:
        """Every key of one schedule, in the order the schedule scripts take them: record,
        claimed, buffer, runs, actions, lock, then the partition's active, busy and all indexes."""
        t = self.tag(p)
        return [
            f"{t}:sc:{schedule_id}",
            f"{t}:scc:{schedule_id}",
            f"{t}:scb:{schedule_id}",
            f"{t}:scr:{schedule_id}",
            f"{t}:sca:{schedule_id}",
            f"{t}:scl:{schedule_id}",
            f"{t}:schedules",
            f"{t}:schedbusy",
            f"{t}:schedall",
        ]

    def schedules_due(self, p: int) -> str:
        """Active schedules of partition ``p`` by their next scheduled time (ms)."""
        return f"{self.tag(p)}:schedules"

    def schedules_busy(self, p: int) -> str:
        """Schedules of partition ``p`` with claimed or buffered times still to start."""
        return f"{self.tag(p)}:schedbusy"

    def schedules_all(self, p: int) -> str:
        """Every schedule id of partition ``p``."""
        return f"{self.tag(p)}:schedall"

    def fixed_kinds(self) -> dict[str, str]:
        """``{key: kind}`` of the keys the namespace and each of its partitions hold once (not
        per run, queue or schedule): those a value of another kind there would stop for every
        run, which ``KeyTypes.namespace_wrong_types`` reads to name one."""
        kinds = {
            self.meta: "hash",
            self.hook_secret(): "string",
            self.search_types(): "hash",
            self.queues(): "set",
            self.served_builds(): "set",
            self.worker_index(): "set",
            self.start_failures(): "set",
        }
        for p in range(self.partitions):
            kinds |= {
                self.outbox(p): "stream",
                self.timers(p): "zset",
                self.running(p): "zset",
                self.runs(p): "zset",
                self.blocked(p): "zset",
                self.closed(p): "zset",
                self.closes(p): "stream",
                self.retention(p): "string",
                self.dead(p): "stream",
                self.sessions(p): "set",
                self.sticky_hosts(p): "set",
                self.hooks(p): "hash",
                self.origin(p): "hash",
                self.clock(p): "string",
                self.schedules_due(p): "zset",
                self.schedules_busy(p): "set",
                self.schedules_all(p): "set",
            }
        return kinds

    def partition_of_key(self, key: str) -> int:
        """Parse the partition back out of a key (for task streams read in bulk)."""
        start = key.index("{") + 1
        return int(key[start : key.index("}", start)])
