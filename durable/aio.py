"""The asyncio client: :class:`AsyncWorkflowStub`, a :class:`~durable.WorkflowStub` to ``await``.

For FastAPI, aiohttp and other asyncio code: nothing here blocks the event loop.

* Waits (``result()``, an update's outcome) are asynchronous all the way down: every
  ``await stub.result()`` of one event loop shares one blocking ``XREAD`` on one
  ``redis.asyncio`` connection (:mod:`durable.store.aio`), so 500 awaiting coroutines
  cost one read and no thread.
* The short calls (``start``, ``signal``, ``query``, delivering an update, ``describe``...)
  run the synchronous stub's code on durable's own executor (:data:`THREADS` threads, not
  the loop's default one): each is one or two round trips, done in a moment, and running
  the very code the synchronous client runs keeps one implementation of the start
  policies, limits, Lua script replies, cluster routing and query replay. No thread is held
  while a run is awaited. While Redis is unreachable each call holds its thread for up to
  10 s (riding the outage out): on the loop's default executor (a few threads) that
  starved the rest of the app -- ``loop.getaddrinfo``, so every httpx/aiohttp connection
  to another service, waited behind them.

Workflow code itself stays synchronous (greenlets): only clients and activities may be
``async``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, Self, TypeVar, Unpack, overload

from . import codec
from . import events as ev
from .client import WorkflowStub
from .client_updates import send_update
from .handlers import Handles
from .options import MakeOptions, wait_seconds
from .runinfo import HistoryEvent, RunDescription, closing_error
from .store.aio import async_waiter_for
from .store.aio import wait_update as await_update_outcome
from .store.outage import ride_out_async
from .store.redis_store import RedisStore
from .store.updates import update_result
from .store.waits import RunMoved, wait_alone
from .waiting import not_closed
from .workflow import Workflow

R = TypeVar("R")
T = TypeVar("T")

THREADS = 32
"""Threads of the executor the short calls run on (shared by every event loop of the process)."""

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="durable-aio")
        return _pool


def _forget_executor() -> None:
    # A forked child has none of its parent's threads: the pool would wait for them for ever.
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_executor)


async def _off_loop(call: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)`` on durable's executor, in this task's context (as
    ``asyncio.to_thread`` runs it, but not on the loop's default executor)."""
    context = contextvars.copy_context()
    bound = functools.partial(context.run, call, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_executor(), bound)


class AsyncWorkflowStub(Generic[R]):
    """A handle on one workflow instance for asyncio code; its methods (``load`` too) are coroutines, except ``make``.

    ``AsyncWorkflowStub.make(Order)`` takes what :meth:`WorkflowStub.make` takes and is typed
    like it (``await stub.result()`` has ``Order.handle``'s return type). ``make`` is a plain
    call (it reads nothing); :meth:`load` reads the id's current run, so it is awaited:
    ``stub = await AsyncWorkflowStub.load("order-42")``.

    Example:
        ```python
        stub = await AsyncWorkflowStub.make(OrderWorkflow, id="order-42").start("order-42", 1999)
        await stub.signal("approve", "alice")
        print(await stub.result(timeout=30))
        same = await AsyncWorkflowStub.load("order-42")
        ```
    """

    def __init__(self, stub: WorkflowStub[R]) -> None:
        self._stub = stub

    @overload
    @classmethod
    def make(
        cls, workflow: type[Handles[T]], id: str | None = None, **options: Unpack[MakeOptions]
    ) -> AsyncWorkflowStub[T]: ...  # noqa: A002

    @overload
    @classmethod
    def make(
        cls, workflow: str, id: str | None = None, **options: Unpack[MakeOptions]
    ) -> AsyncWorkflowStub[Any]: ...  # noqa: A002

    @classmethod
    def make(
        cls,
        workflow: type[Workflow] | type[Handles[Any]] | str,
        id: str | None = None,  # noqa: A002
        **options: Unpack[MakeOptions],
    ) -> AsyncWorkflowStub[Any]:
        """A stub for a new workflow instance; ``options`` as for :meth:`WorkflowStub.make`
        (``queue``, ``store``, id policies, timeouts, search attributes, memo). Nothing is
        written until :meth:`start`.

        Raises:
            ConfigurationError: as :meth:`WorkflowStub.make`.
        """
        return cls(WorkflowStub.make(workflow, id, **options))

    @classmethod
    async def load(cls, id: str, *, store: RedisStore | None = None) -> AsyncWorkflowStub[Any]:  # noqa: A002
        """A stub for an existing workflow id (its current run).

        Raises:
            WorkflowNotFound: no workflow with that id.
        """
        return cls(await _off_loop(WorkflowStub.load, id, store=store))

    async def _open_store(self) -> RedisStore:
        """The stub's store; the process's default one opened off the loop at its first use
        (opening rides out an outage: 10 s the loop would have stood still)."""
        if self._stub._opened is None:
            return await _off_loop(lambda: self._stub.store)
        return self._stub.store

    @property
    def sync(self) -> WorkflowStub[R]:
        """The synchronous stub behind this one (same id, run, store and policies)."""
        return self._stub

    @property
    def id(self) -> str:
        """The workflow id."""
        return self._stub.id

    @property
    def workflow_type(self) -> str:
        """The workflow type name."""
        return self._stub.workflow_type

    @property
    def run_id(self) -> str | None:
        """The run id this stub last saw (``None`` before :meth:`start` or a wait)."""
        return self._stub._run_id

    # ------------------------------------------------------------- actions
    async def start(self, *args: Any) -> Self:
        """Start a run with ``args`` (see :meth:`WorkflowStub.start`); returns this stub."""
        await _off_loop(self._stub.start, *args)
        return self

    async def signal_with_start(self, name: str, *args: Any, start_args: Sequence[Any] = ()) -> Self:
        """Signal, starting a run first if the id has none open (:meth:`WorkflowStub.signal_with_start`)."""
        await _off_loop(self._stub.signal_with_start, name, *args, start_args=start_args)
        return self

    async def signal(self, name: str, *args: Any) -> None:
        """Send signal ``name`` with ``args`` to the current run (:meth:`WorkflowStub.signal`)."""
        await _off_loop(self._stub.signal, name, *args)

    async def query(self, name: str, *args: Any) -> Any:
        """Call the ``@query`` method ``name`` (:meth:`WorkflowStub.query`; the replay runs on
        the executor, off the loop)."""
        return await _off_loop(self._stub.query, name, *args)

    async def update(
        self, name: str, *args: Any, timeout: float | None = None, update_id: str | None = None
    ) -> Any:
        """Run the ``@update`` handler ``name`` and return its result (:meth:`WorkflowStub.update`).

        The delivery (with the client interceptors' ``update_workflow``, whose headers are
        recorded with the update) runs on the executor; the wait for the outcome is awaited.

        Raises:
            UpdateRejected: the validator raised, no such ``@update``, undecodable arguments.
            Exception: whatever the handler raised.
            WorkflowNotFound, WorkflowClosed: as :meth:`WorkflowStub.update`.
            TimeoutError: ``timeout`` passed first (call again with the same ``update_id``).
        """
        loop = asyncio.get_running_loop()
        timeout = wait_seconds(timeout)
        deadline = None if timeout is None else loop.time() + timeout
        store = await self._open_store()
        ref, uid, after = await _off_loop(
            send_update, store, self.workflow_type, self.id, name, args, update_id
        )
        self._stub._run_id = ref.run_id
        outcome = await await_update_outcome(async_waiter_for(store), ref, uid, after, deadline)
        return update_result(outcome, self.id, name)

    async def cancel(self, reason: str = "") -> None:
        """Request cancellation (:meth:`WorkflowStub.cancel`)."""
        await _off_loop(self._stub.cancel, reason)

    async def terminate(self, reason: str = "") -> None:
        """Close the run now (:meth:`WorkflowStub.terminate`)."""
        await _off_loop(self._stub.terminate, reason)

    # --------------------------------------------------------------- reads
    async def status(self) -> str:
        """The current run's status (:meth:`WorkflowStub.status`)."""
        return await _off_loop(self._stub.status)

    async def describe(self, run_id: str | None = None) -> RunDescription:
        """Everything known about the current run, or ``run_id`` (:meth:`WorkflowStub.describe`)."""
        return await _off_loop(self._stub.describe, run_id)

    async def history(self, run_id: str | None = None) -> list[HistoryEvent]:
        """The current run's events, or ``run_id``'s (:meth:`WorkflowStub.history`)."""
        return await _off_loop(self._stub.history, run_id)

    async def _ride(self, call: Callable[[], Awaitable[T]], deadline: float | None) -> T:
        """``await call()`` of :meth:`result` through a short Redis outage, within ``deadline``
        (the loop's clock), as :meth:`RedisStore.ride` does for the sync stub."""
        store = await self._open_store()
        within = store.client_ride_s
        if deadline is not None:
            within = max(0.0, min(within, deadline - asyncio.get_running_loop().time()))
        what = f"result() of workflow {self.id!r}"
        return await ride_out_async(call, url=store.url, what=what, within=within, outage=store.client_outage)

    async def result(self, timeout: float | None = None) -> R:
        """Wait for the run to close and return its result (follows continue-as-new).

        Holds no thread: the event loop's waits share one blocking read (on a Redis
        Cluster, where one read cannot span slots, each wait blocks an executor thread).

        Raises:
            WorkflowFailed: the run failed, was cancelled or terminated.
            WorkflowBlocked: the run is (or becomes) blocked; raised at once.
            WorkflowNotFound: no such workflow id, or its run is gone.
            TimeoutError: ``timeout`` seconds passed first.
        """
        store = await self._open_store()
        waiter = async_waiter_for(store)
        loop = asyncio.get_running_loop()
        timeout = wait_seconds(timeout)
        deadline = None if timeout is None else loop.time() + timeout
        # As WorkflowStub.result: the known run is checked current by the first look.
        stub = self._stub
        current = stub._run_id is not None
        known = stub._run_id
        if known is None:
            known = (await self._ride(lambda: waiter.ref(self.id), deadline)).run_id
        ref = stub._at_run(known)
        while True:
            try:
                # As WorkflowStub.result: a wait that cannot begin (Redis down) is tried again.
                if store.cluster:
                    wall = None if deadline is None else time.monotonic() + (deadline - loop.time())
                    waited = lambda: asyncio.to_thread(wait_alone, store, ref, wall, current=current)  # noqa: B023, E731
                else:
                    waited = lambda: waiter.wait(ref, deadline, current=current)  # noqa: B023, E731
                closing = await self._ride(waited, deadline)
            except TimeoutError:
                raise TimeoutError(await _off_loop(not_closed, store, ref, timeout)) from None
            except RunMoved as moved:
                ref = stub._at_run(moved.current or (await waiter.ref(self.id)).run_id)
                current = False
                continue
            current = False
            if isinstance(closing.event, ev.WorkflowCompleted):
                result: R = codec.loads(closing.event.result)
                return result
            if isinstance(closing.event, ev.WorkflowContinuedAsNew):
                ref = stub._at_run(closing.event.new_run_id)
                continue
            raise closing_error(closing, self.id)
