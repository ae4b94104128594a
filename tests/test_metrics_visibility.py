"""Where `/metrics` listens (`--metrics-host`, this host only by default: testers found the port
open on every interface with no way to choose) and which queues its backlog gauges cover (a
queue no live worker serves was missing, so an alert on its backlog never fired)."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
import uuid

import pytest
from apps.basic import Waiter
from procs import spawn_worker, stop
from waiting import wait_for

from durable import WorkflowStub
from durable.store.redis_store import RedisStore
from durable.store.workers import WorkerInfo

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from workers.queue_metrics import QueueCollector  # noqa: E402


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _scrapes(host: str, port: int) -> bool:
    try:
        body = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()
    except (urllib.error.URLError, ConnectionError):
        return False
    return "durable_task_queue_backlog" in body


def _free_on(host: str, port: int) -> bool:
    """Whether ``host``:``port`` can be bound (a listener on 0.0.0.0 holds it on every address)."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def test_the_metrics_port_listens_on_this_host_only_by_default(redis_url: str) -> None:
    port = _free_port()
    proc = spawn_worker(redis_url, app="apps.observe", extra=("--metrics-port", str(port)))
    try:
        wait_for(lambda: _scrapes("127.0.0.1", port), timeout=60)
        # 127.0.0.2 is this host too (all of 127/8 is loopback), but not the address listened on.
        assert _free_on("127.0.0.2", port)
    finally:
        stop(proc)


@pytest.mark.parametrize("processes", [1, 2])
def test_metrics_host_is_the_address_the_metrics_port_listens_on(redis_url: str, processes: int) -> None:
    port = _free_port()
    extra = ("--metrics-port", str(port), "--metrics-host", "127.0.0.2", "--processes", str(processes))
    proc = spawn_worker(redis_url, app="apps.observe", extra=extra)
    try:
        wait_for(lambda: _scrapes("127.0.0.2", port), timeout=60)
        assert not _scrapes("127.0.0.1", port)
    finally:
        stop(proc)


def _backlog(collector: QueueCollector) -> dict[tuple[str, str], float]:
    (backlog,) = [f for f in collector.collect() if f.name == "durable_task_queue_backlog"]
    return {(s.labels["queue"], s.labels["kind"]): s.value for s in backlog.samples}


def test_backlog_gauges_include_queues_no_live_worker_serves(store: RedisStore) -> None:
    """A run started on a queue nobody serves: a worker's port (its own queues given) and the
    operator server's (none given) both report that queue's backlog, as `durable workers` does."""
    # A name of its own: a process notes a queue name once, and other tests used theirs (the
    # tests flush Redis in between; a deployment never deletes the set of known queues).
    nobody = f"nobody-{uuid.uuid4().hex[:8]}"
    WorkflowStub.make(Waiter, queue=nobody).start(0.01)
    WorkflowStub.make(Waiter, queue=nobody).start(0.01)
    for queues in (["default"], None):
        backlog = _backlog(QueueCollector(store, queues))
        assert backlog[(nobody, "workflow")] == 2, (queues, backlog)
        assert backlog[("default", "workflow")] == 0
    # The known queues come after a worker's own: the scan limit drops those first.
    assert QueueCollector(store, ["mine"])._queue_names() == ["mine", nobody]


def test_backlog_text_of_a_scrape_names_the_unserved_queue(store: RedisStore) -> None:
    """The same through the exposition a scraper reads (the operator server's `/metrics`)."""
    from workers import metrics  # noqa: PLC0415 - after the importorskip above

    unserved = f"unserved-{uuid.uuid4().hex[:8]}"  # a name of its own, as above
    WorkflowStub.make(Waiter, queue=unserved).start(0.01)
    body, _ = metrics.exposition(metrics.registry_for(store, ["default"], fresh=True))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    key = ("durable_task_queue_backlog", (("kind", "workflow"), ("queue", unserved)))
    assert samples.get(key) == 1


def test_worker_gauges_say_each_workers_state_and_what_a_drain_has_left(store: RedisStore) -> None:
    """`durable_workers` by queue, build and state; `durable_worker_drain_pinned_runs` per draining
    worker: an alert finds a drain that waits on a run that does not finish."""
    now = store.server_time_ms()
    entries = [
        WorkerInfo(name="w-serving", build="v2", queues=("q",), started=now, seen=now),
        WorkerInfo(name="w-plain", queues=("q", "@w-plain"), started=now, seen=now),
        WorkerInfo(
            name="w-draining", build="v1", queues=("q",), started=now, seen=now, draining=now, pinned_left=2
        ),
        WorkerInfo(name="w-stopping", build="v1", queues=("q",), started=now, seen=now, stopping=now),
    ]
    for entry in entries:
        store.register_worker(entry)
    families = {f.name: f for f in QueueCollector(store, ["q"]).collect()}
    workers = {
        (s.labels["queue"], s.labels["build"], s.labels["state"]): s.value
        for s in families["durable_workers"].samples
    }
    assert workers == {
        ("q", "", "serving"): 1,
        ("q", "v2", "serving"): 1,
        ("q", "v1", "draining"): 1,
        ("q", "v1", "stopping"): 1,
    }
    left = [
        (s.labels["worker"], s.labels["build"], s.value)
        for s in families["durable_worker_drain_pinned_runs"].samples
    ]
    assert left == [("w-draining", "v1", 2)]
    # A queue whose tasks wait while no worker serves it reads 0 serving (the documented alert's
    # `sum by (queue) (durable_workers{state="serving"}) == 0`), not no series at all; a queue
    # used once and left, no series (the alert fired for ever on each retired or mistyped queue).
    lonely, retired = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("lonely", "retired"))
    store.note_queues([retired])

    def serving() -> dict[str, float]:
        families = {f.name: f for f in QueueCollector(store, ["q"]).collect()}
        out: dict[str, float] = {}
        for sample in families["durable_workers"].samples:
            if sample.labels["state"] == "serving":
                out[sample.labels["queue"]] = out.get(sample.labels["queue"], 0) + sample.value
        return out

    assert serving() == {"q": 2}
    WorkflowStub.make(Waiter, queue=lonely).start(0.01)
    assert serving() == {lonely: 0, "q": 2}


def test_a_scrape_with_redis_down_says_so_in_durable_redis_up(fresh_redis, tmp_path) -> None:  # noqa: ANN001
    """`durable server`'s /metrics with its Redis gone: 200 with an empty body, every gauge left
    out, so alerts on backlogs resolved during the outage instead of firing."""
    import httpx  # noqa: PLC0415 - the dev extra's
    from server_procs import ServerProc  # noqa: PLC0415 - beside the tests

    def up() -> float | None:
        body = httpx.get(f"{server.url}/metrics", timeout=30).text
        samples = {s.name: s.value for f in text_string_to_metric_families(body) for s in f.samples}
        return samples.get("durable_redis_up")

    server = ServerProc(fresh_redis.url, tmp_path / "server.log")
    try:
        assert up() == 1
        fresh_redis.stop()
        assert up() == 0
    finally:
        server.stop()
