"""Test support: a real Redis, an in-process worker, time skipping, activity mocks, replay checks.

Two ways in:

* **pytest**: installing durable registers this module as a pytest plugin (the
  ``pytest11`` entry point ``durable.testing``), so tests use the fixtures with no
  ``conftest.py`` import (``pytest_plugins = ["durable.testing"]`` still works):

  - ``durable_redis_url`` (session): an embedded ``redis-server`` in a temporary
    dir, stopped when the session ends (or ``$DURABLE_TEST_REDIS_URL``: a Redis
    you provide, whose database is **flushed before every test**);
    ``durable_redis_server`` is that server (``None`` for a Redis you provide);
  - ``durable_clean_redis_url``: the same URL, flushed for this test (the
    server restarted first if a test stopped it), ``DURABLE_REDIS_URL`` set to it;
  - ``durable_store``: a :class:`~durable.store.redis_store.RedisStore` on it,
    flushed for this test; ``DURABLE_REDIS_URL`` points at it meanwhile;
  - ``durable_env``: a started :class:`TestEnvironment` (worker thread included);
    mark a test ``@pytest.mark.durable(time_skipping=True)`` to turn on time skipping
    (or override the ``durable_env_options`` fixture, which returns those keyword arguments);
  - ``durable_worker``: the environment's :class:`~workers.worker.Worker`;
  - ``durable_stub``: ``durable_stub(WorkflowCls, id=None)`` -> an unstarted stub
    bound to the environment (like ``WorkflowStub.make``).

* **anywhere**: ``with TestEnvironment() as env: stub = env.start(Wf, *args)``.

Time skipping (``TestEnvironment(time_skipping=True)``): while a test waits in
``result()`` of a stub made by the environment and every run is waiting only on
timers (no workflow task, activity task or outbox message pending, no activity
running), the environment's clock jumps to the next due timer. A workflow that
sleeps 30 days finishes in milliseconds and its ``now()`` says 30 days later.
``env.skip(timedelta(...))`` moves the clock by hand. The clock is an offset the
Redis scripts add to ``TIME`` (``RedisStore.set_clock_offset``); activity
start-to-close deadlines keep the real clock, and heartbeat/schedule-to-close
timeouts are not reliable while the clock is skipped.

:func:`replay_history` checks that today's code still decides as a recorded
history says: give it a stub, the stored entries, or a ``durable history ID
--json`` export.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

from . import events as ev
from . import registry
from .activity import Activity
from .client import HistoryEvent, WorkflowStub
from .errors import ConfigurationError
from .exports import from_export
from .handlers import Handles
from .options import Seconds, to_seconds
from .replay import Driver
from .replay import replay_history as _replay_entries
from .store.connect import flush_database
from .store.embedded import EmbeddedRedis
from .store.redis_store import RedisStore
from .untrusted import json_loads
from .workflow import Workflow

if TYPE_CHECKING:
    from workers.worker import Worker

__all__ = ["TestEnvironment", "TestWorkflowStub", "replay_history"]

#: Environment variable naming a Redis the fixtures use instead of an embedded one (it is flushed!).
TEST_REDIS_ENV = "DURABLE_TEST_REDIS_URL"


# --------------------------------------------------------------------------- stubs


R = TypeVar("R")
T = TypeVar("T")


class TestWorkflowStub(WorkflowStub[R]):
    """A :class:`~durable.WorkflowStub` bound to a :class:`TestEnvironment`.

    Its :meth:`result` lets the environment skip time while it waits (when the
    environment has ``time_skipping=True``).
    """

    __test__ = False  # not a pytest test class

    _env: TestEnvironment

    def result(self, timeout: float | None = None) -> R:
        with self._env._waiting():
            return super().result(timeout=timeout)


# --------------------------------------------------------------------------- environment


class TestEnvironment:
    """A Redis, a store, a worker thread and a clock for tests (a context manager).

    Args:
        redis_url: Redis to use. Default: an embedded ``redis-server`` in a fresh
            temporary dir, started on enter and stopped (and removed) on exit.
        store: Use this store instead (``redis_url`` is then ignored; nothing is flushed).
        time_skipping: Jump the clock to the next due timer whenever a test waits
            in ``result()`` and every run is only waiting on timers.
        flush: FLUSHDB the Redis on enter. Default: only when the environment
            started the Redis itself.
        queues, concurrency: Passed to the worker.
        worker: Start a worker thread (default True).
        eager: Run the worker in eager mode (it runs activities itself and
            commits each result with the next decision).

    Example:
        ```python
        with TestEnvironment(time_skipping=True) as env:
            env.mock_activity(charge, {"charge": "ch-test"})
            stub = env.start(Order, "order-1")
            assert stub.result(timeout=10)["charge"] == "ch-test"
        ```
    """

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        *,
        redis_url: str | None = None,
        store: RedisStore | None = None,
        time_skipping: bool = False,
        flush: bool | None = None,
        queues: Sequence[str] = ("default",),
        concurrency: int = 4,
        worker: bool = True,
        eager: bool = False,
    ) -> None:
        self.time_skipping = time_skipping
        self._redis_url = redis_url
        self._given_store = store
        self._flush = flush
        self._queues = list(queues)
        self._concurrency = concurrency
        self._want_worker = worker
        self._eager = eager
        self._server: Any = None
        self._tmpdir: str | None = None
        self._store: RedisStore | None = None
        self._worker: Worker | None = None
        self._worker_thread: Any = None
        self._mock_undos: list[Callable[[], None]] = []
        self._saved_env: str | None = None
        self._env_set = False
        self._lock = threading.Lock()
        self._waiters = 0
        self._stop = threading.Event()
        self._skipper: threading.Thread | None = None
        self.skips = 0

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> TestEnvironment:
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _open(self) -> None:
        # durable never imports workers at module level (workers imports durable); the
        # environment needs a worker only when it is opened.
        from workers.worker import Worker, WorkerThread

        if self._given_store is not None:
            self._store = self._given_store
            flush = bool(self._flush)
        else:
            url = self._redis_url
            if url is None:
                self._tmpdir = tempfile.mkdtemp(prefix="durable-test-")
                self._server = EmbeddedRedis(self._tmpdir)
                url = self._server.ensure()
            flush = self._flush if self._flush is not None else self._server is not None
            self._store = RedisStore(url)
        if flush:
            self._store.flush()
        self._store.set_clock_offset(0)
        if self._store.url:
            self._saved_env = os.environ.get("DURABLE_REDIS_URL")
            os.environ["DURABLE_REDIS_URL"] = self._store.url
            self._env_set = True
        if self._want_worker:
            self._worker = Worker(
                self._store,
                queues=self._queues,
                concurrency=self._concurrency,
                grace=5.0,
                claim_idle_ms=2000,
                block_ms=100,
                eager=self._eager,
                unknown_type_grace=0.0,  # the only worker: a type it lacks is a typo, park it at once
            )
            self._worker_thread = WorkerThread(self._worker)
            self._worker_thread.__enter__()
        if self.time_skipping:
            self._skipper = threading.Thread(target=self._skip_loop, name="durable-time-skipper", daemon=True)
            self._skipper.start()

    def close(self) -> None:
        """Stop the skipper and the worker, undo mocks, reset the clock, stop an owned Redis."""
        self._stop.set()
        if self._skipper is not None:
            self._skipper.join(timeout=5)
            self._skipper = None
        if self._worker_thread is not None:
            self._worker_thread.__exit__(None, None, None)
            self._worker_thread = None
        self.restore_activities()
        if self._env_set:
            if self._saved_env is None:
                os.environ.pop("DURABLE_REDIS_URL", None)
            else:
                os.environ["DURABLE_REDIS_URL"] = self._saved_env
            self._env_set = False
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.set_clock_offset(0)
            if self._store is not self._given_store:
                self._store.close()
            self._store = None
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    # ------------------------------------------------------------ accessors
    @property
    def store(self) -> RedisStore:
        """The environment's store."""
        if self._store is None:
            raise ConfigurationError("the TestEnvironment is not open (use it in a `with` block)")
        return self._store

    @property
    def worker(self) -> Worker:
        """The in-process worker (``worker=False``: raises)."""
        if self._worker is None:
            raise ConfigurationError("this TestEnvironment runs no worker (worker=False) or is not open")
        return self._worker

    # ---------------------------------------------------------------- stubs
    @overload
    def stub(
        self, workflow: type[Handles[T]], id: str | None = None, *, queue: str | None = None
    ) -> TestWorkflowStub[T]: ...  # noqa: A002
    @overload
    def stub(
        self, workflow: str, id: str | None = None, *, queue: str | None = None
    ) -> TestWorkflowStub[Any]: ...  # noqa: A002
    def stub(
        self,
        workflow: type[Workflow] | type[Handles[Any]] | str,
        id: str | None = None,
        *,
        queue: str | None = None,
    ) -> TestWorkflowStub[Any]:  # noqa: A002
        """An unstarted stub bound to this environment (like ``WorkflowStub.make``)."""
        base = WorkflowStub.make(workflow, id=id, queue=queue, store=self.store)
        return self._bind(base)

    @overload
    def start(
        self, workflow: type[Handles[T]], *args: Any, id: str | None = None, queue: str | None = None
    ) -> TestWorkflowStub[T]: ...  # noqa: A002
    @overload
    def start(
        self, workflow: str, *args: Any, id: str | None = None, queue: str | None = None
    ) -> TestWorkflowStub[Any]: ...  # noqa: A002
    def start(
        self,
        workflow: type[Workflow] | type[Handles[Any]] | str,
        *args: Any,
        id: str | None = None,  # noqa: A002
        queue: str | None = None,
    ) -> TestWorkflowStub[Any]:
        """Start a run of ``workflow`` with ``args``; returns its stub."""
        stub = self.stub(workflow, id=id, queue=queue)
        stub.start(*args)
        return stub

    def load(self, id: str) -> TestWorkflowStub[Any]:  # noqa: A002
        """A stub for an existing workflow id (e.g. a child), bound to this environment."""
        return self._bind(WorkflowStub.load(id, store=self.store))

    def _bind(self, base: WorkflowStub[Any]) -> TestWorkflowStub[Any]:
        stub: TestWorkflowStub[Any] = TestWorkflowStub.from_stub(base)
        stub._env = self
        return stub

    # ---------------------------------------------------------------- clock
    @property
    def clock_offset(self) -> timedelta:
        """How far the environment's clock is ahead of real time."""
        return timedelta(milliseconds=self.store.clock_offset())

    def now(self) -> datetime:
        """The environment's current time (UTC): what a workflow's ``now()`` would say."""
        ms = self.store.server_time_ms() + self.store.clock_offset()
        return datetime.fromtimestamp(ms / 1000, tz=UTC)

    def skip(self, duration: Seconds) -> None:
        """Move the clock forward by ``duration`` (seconds or timedelta); due timers fire at once."""
        seconds = to_seconds(duration, "skip duration")
        assert seconds is not None
        with self._lock:
            self._shift(int(round(seconds * 1000)))

    def _shift(self, ms: int) -> None:
        if ms <= 0:
            return
        self.store.set_clock_offset(self.store.clock_offset() + ms)
        if self._worker is not None:
            self._worker.scheduler.notify(0)  # its sleep is real time: wake it now

    @contextlib.contextmanager
    def _waiting(self) -> Iterator[None]:
        with self._lock:
            self._waiters += 1
        try:
            yield
        finally:
            with self._lock:
                self._waiters -= 1

    def _skip_loop(self) -> None:
        while not self._stop.wait(0.01):
            if not self._waiters:
                continue
            try:
                with self._lock:
                    self._maybe_skip()
            except Exception:  # noqa: BLE001 - Redis may be going away at shutdown
                if self._stop.is_set():
                    return

    def _maybe_skip(self) -> bool:
        """Jump to the next due timer if nothing but timers is outstanding; True if it jumped."""
        store = self.store
        keys = store.keys
        worker = self._worker
        if worker is not None and worker.busy:
            return False
        streams: list[str] = []
        for p in range(keys.partitions):
            streams.append(keys.outbox(p))
            for q in self._queues:
                streams += [keys.workflow_tasks(p, q), keys.activity_tasks(p, q)]
            if worker is not None:
                streams += worker.sticky_streams[p : p + 1]
        busy, due, now = store.probe_idle(streams)
        if busy or due is None:
            return False  # a task is pending or an activity is running (time must not move), or no timer
        if due <= now:
            if worker is not None:
                worker.scheduler.notify(0)
            return False
        self._shift(due - now)
        self.skips += 1
        return True

    # ---------------------------------------------------------------- mocks
    def mock_activity(self, target: Any, replacement: Any, *, exact: bool = False) -> None:
        """Replace an activity for this environment (undone on exit).

        Args:
            target: The activity: an ``Activity`` subclass, a function, or its name.
            replacement: A function called with the activity's arguments, an
                ``Activity`` subclass, an exception instance (raised on every
                attempt), or any other value (returned as the result).
            exact: Take a name as given even when it is close to another activity's (an
                activity another process defines, ``"charge_cards"`` beside this process's
                ``charge_card``); by default such a name is refused as a likely typo.

        Raises:
            ConfigurationError: a name that is no activity but close to one (``exact`` unset).
        """
        if isinstance(target, str) and not exact:
            _check_mocked_name(target)
        try:
            undo = registry.override_activity(target, _as_function(replacement))
        except ConfigurationError:
            if isinstance(target, str):
                raise
            raise ConfigurationError(
                f"mock_activity needs an Activity class, a named function or a name, not {target!r}"
            ) from None
        self._mock_undos.append(undo)

    def restore_activities(self) -> None:
        """Undo every :meth:`mock_activity` of this environment."""
        while self._mock_undos:
            self._mock_undos.pop()()


def _check_mocked_name(name: str) -> None:
    """Refuse a mocked name that is no activity but close to one (a typo would let the real one
    run: a test stubbing out a payment provider charged a card). A name nothing is close to may
    be an activity this process does not define (another service's): it is taken."""
    known = set(registry.activities())
    for workflow in registry.workflows().values():
        module = sys.modules.get(workflow.__module__)
        if module is not None:
            known.update(attr for attr, _ in registry.plain_functions(module))
    if name in known:
        return
    near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
    if near:
        raise ConfigurationError(
            f"mock_activity({name!r}): no activity has that name; did you mean {near[0]!r}? (pass the "
            "function or Activity class itself to be sure; exact=True for an activity another process defines)"
        )


def _as_function(replacement: Any) -> Callable[..., Any]:
    if isinstance(replacement, type) and issubclass(replacement, Activity):
        return lambda *args: replacement().handle(*args)
    if isinstance(replacement, BaseException):

        def fail(*_args: Any) -> Any:
            raise replacement

        return fail
    if callable(replacement):
        return replacement
    return lambda *_args: replacement


# --------------------------------------------------------------------------- replay


def replay_history(history: Any, workflow: type[Workflow] | None = None) -> Driver:
    """Replay a recorded history with today's code.

    Args:
        history: One of: a :class:`~durable.WorkflowStub` (its current run's
            stored history), a list of stored entries (``durable.events.Entry``),
            a path to a ``durable history ID --json`` export, or the list of
            dicts loaded from such a file (each needs its ``raw`` field).
            ``WorkflowStub.history()`` events are not accepted: their payloads
            are decoded, so they cannot be replayed byte for byte.
        workflow: The workflow class (default: the type the history names, from the registry).

    Returns:
        The (closed) replay driver; ``.status`` is the run's status as replayed.

    Raises:
        NondeterminismError: today's code decides differently from the history.
    """
    return _replay_entries(_entries(history), workflow)


def _entries(history: Any) -> list[ev.Entry]:
    if isinstance(history, WorkflowStub):
        store = history.store
        return store.history(store.ref(history.id))
    if isinstance(history, str | os.PathLike):
        path = Path(history)
        try:
            items = json_loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"{path}: not a JSON history export ({exc})") from None
        return from_export(items, str(path))
    if isinstance(history, Sequence):
        items = list(history)
        if all(isinstance(item, ev.Entry) for item in items):
            return items
        if any(isinstance(item, HistoryEvent) for item in items):
            raise ConfigurationError(
                "replay_history needs the stored entries, not WorkflowStub.history() events (their payloads "
                "are decoded); pass the stub itself, or an export from `durable history ID --json`"
            )
        return from_export(items, "history")
    raise ConfigurationError(f"replay_history cannot read a history from {type(history).__name__}")


# --------------------------------------------------------------------------- pytest plugin

try:  # the fixtures exist only where pytest is installed; the rest works without it
    import pytest
except ImportError:  # pragma: no cover
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    def pytest_configure(config: pytest.Config) -> None:
        config.addinivalue_line(
            "markers", "durable(**options): TestEnvironment options for durable_env, e.g. time_skipping=True"
        )

    @pytest.fixture(scope="session")
    def durable_redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis | None]:
        """The session's embedded ``redis-server`` in a tmp dir; ``None`` when ``$DURABLE_TEST_REDIS_URL`` is set."""
        if os.environ.get(TEST_REDIS_ENV):
            yield None
            return
        server = EmbeddedRedis(tmp_path_factory.mktemp("durable-redis"))
        server.ensure()
        try:
            yield server
        finally:
            server.stop()

    @pytest.fixture(scope="session")
    def durable_redis_url(durable_redis_server: EmbeddedRedis | None) -> str:
        """A Redis for the session: ``$DURABLE_TEST_REDIS_URL``, else the embedded server."""
        if durable_redis_server is None:
            return os.environ[TEST_REDIS_ENV]
        return durable_redis_server.url

    @pytest.fixture
    def durable_clean_redis_url(
        durable_redis_server: EmbeddedRedis | None, durable_redis_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> str:
        """The session Redis, flushed for this test; ``DURABLE_REDIS_URL`` points at it."""
        if durable_redis_server is not None:
            durable_redis_server.ensure()  # restarts it if a test stopped it
        flush_database(durable_redis_url)
        monkeypatch.setenv("DURABLE_REDIS_URL", durable_redis_url)
        return durable_redis_url

    @pytest.fixture
    def durable_store(durable_clean_redis_url: str) -> Iterator[RedisStore]:
        """A store on the session Redis, flushed for this test; ``DURABLE_REDIS_URL`` points at it."""
        store = RedisStore(durable_clean_redis_url)
        try:
            yield store
        finally:
            store.close()

    @pytest.fixture
    def durable_env_options(request: pytest.FixtureRequest) -> dict[str, Any]:
        """Keyword arguments of ``durable_env``'s :class:`TestEnvironment`.

        From ``@pytest.mark.durable(...)``; or override this fixture, or
        ``@pytest.mark.parametrize("durable_env_options", [{"time_skipping": True}])``.
        """
        marker = request.node.get_closest_marker("durable")
        return dict(marker.kwargs) if marker is not None else {}

    @pytest.fixture
    def durable_env(
        durable_store: RedisStore, durable_env_options: dict[str, Any]
    ) -> Iterator[TestEnvironment]:
        """A started :class:`TestEnvironment` on ``durable_store`` (options: ``durable_env_options``)."""
        with TestEnvironment(store=durable_store, **durable_env_options) as env:
            yield env

    @pytest.fixture
    def durable_worker(durable_env: TestEnvironment) -> Worker:
        """The in-process worker of ``durable_env``."""
        return durable_env.worker

    @pytest.fixture
    def durable_stub(durable_env: TestEnvironment) -> Callable[..., TestWorkflowStub]:
        """``durable_stub(WorkflowCls, id=None, queue=None)``: an unstarted stub bound to ``durable_env``."""
        return durable_env.stub
