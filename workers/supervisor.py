"""Run N worker processes under one parent (``durable worker --processes N``).

Each child runs ``python -m workers.cli worker-process``: one worker, configured
by the :class:`~workers.config.WorkerConfig` the supervisor puts in its
environment (never on its command line, which ``ps`` shows to everyone: the
Redis URL may hold a password). The supervisor

* forwards SIGTERM and SIGINT to every child and exits once all of them have
  stopped (exit status 0 if every child exited 0, or was ended by the forwarded
  signal itself);
* restarts a child that dies without being asked to, after a backoff that
  doubles on each quick death of that slot (1 s up to 30 s; reset once a child
  has lived for a minute). A child that exits with
  :data:`~workers.watchdog.RUNAWAY_EXIT` gave up a runaway decision (its run is
  blocked, the child was healthy): it is restarted after the shortest backoff;
* sets ``DURABLE_SUPERVISOR_PID`` in the children's environment, so that a child
  whose supervisor vanishes (SIGKILL) stops by itself;
* with ``--metrics-port``, serves the port itself: the children write their metrics
  to a fresh ``PROMETHEUS_MULTIPROC_DIR`` (``prometheus-client``'s multiprocess
  mode), a scrape sums them, and the directory is removed when the supervisor stops.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workers import metrics
from workers.config import WorkerConfig
from workers.watchdog import RUNAWAY_EXIT

log = logging.getLogger("durable.supervisor")

PARENT_ENV = "DURABLE_SUPERVISOR_PID"


@dataclass
class _Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    backoff: float = 0.0
    restart_at: float | None = None
    exit_codes: list[int] = field(default_factory=list)


class Supervisor:
    """Start ``processes`` copies of ``argv`` and keep them running until a signal.

    Args:
        argv: The child command line (``[sys.executable, "-m", "workers.cli", ...]``).
        processes: How many children.
        min_backoff, max_backoff: Restart delay bounds in seconds.
        stable_after: Seconds a child must live for its slot's backoff to reset.
        kill_after: Seconds after the first stop signal before children still
            running are killed (``None``: wait for them).
        metrics_dir: The children's multiprocess metrics directory (removed when
            :meth:`run` returns; a dead child's live gauges leave the sum).
    """

    def __init__(
        self,
        argv: Sequence[str],
        processes: int,
        *,
        env: dict[str, str] | None = None,
        min_backoff: float = 1.0,
        max_backoff: float = 30.0,
        stable_after: float = 60.0,
        kill_after: float | None = None,
        poll_interval: float = 0.1,
        metrics_dir: str | None = None,
    ) -> None:
        if processes < 1:
            raise ValueError("processes must be at least 1")
        self.argv = list(argv)
        self.env = dict(os.environ if env is None else env)
        self.env[PARENT_ENV] = str(os.getpid())
        self.slots = [_Slot(i) for i in range(processes)]
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self.stable_after = stable_after
        self.kill_after = kill_after
        self.poll_interval = poll_interval
        self.stopping_since: float | None = None
        self.stop_signals: set[int] = set()
        self.restarts = 0
        self.metrics_dir = metrics_dir

    # ------------------------------------------------------------ children
    def _spawn(self, slot: _Slot) -> None:
        slot.proc = subprocess.Popen(self.argv, env=self.env)
        slot.started = time.monotonic()
        slot.restart_at = None
        log.info("started worker process %d (pid %d)", slot.index, slot.proc.pid)

    def _forward(self, signum: int) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                try:
                    slot.proc.send_signal(signum)
                except ProcessLookupError:
                    pass

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop: forward ``signum`` to the children; :meth:`run` returns once they are gone."""
        self.stop_signals.add(int(signum))
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()
            log.info(
                "received %s: stopping %d worker processes", signal.Signals(signum).name, len(self.slots)
            )
        self._forward(signum)

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            self.stop(signum)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    # ----------------------------------------------------------------- loop
    def run(self) -> int:
        """Supervise until stopped; returns the exit status (0 if every child exited 0)."""
        try:
            return self._supervise()
        finally:
            if self.metrics_dir is not None:
                shutil.rmtree(self.metrics_dir, ignore_errors=True)

    def _supervise(self) -> int:
        for slot in self.slots:
            if self.stopping_since is None:
                self._spawn(slot)
        failed = False
        while True:
            now = time.monotonic()
            alive = 0
            for slot in self.slots:
                proc = slot.proc
                if proc is not None:
                    code = proc.poll()
                    if code is None:
                        alive += 1
                        continue
                    slot.proc = None
                    slot.exit_codes.append(code)
                    if self.metrics_dir is not None:
                        metrics.process_dead(proc.pid, self.metrics_dir)
                    if self.stopping_since is not None:
                        # Killed by the very signal we forwarded (e.g. before its handler was
                        # installed) still counts as a clean stop.
                        failed = failed or (code != 0 and -code not in self.stop_signals)
                        log.info("worker process %d (pid %d) exited with %d", slot.index, proc.pid, code)
                        continue
                    lived = now - slot.started
                    if lived >= self.stable_after:
                        slot.backoff = 0.0
                    if code == RUNAWAY_EXIT:
                        slot.restart_at = now + self.min_backoff
                        log.warning(
                            "worker process %d (pid %d) gave up a runaway decision (see its log: the run is "
                            "blocked); restarting in %.1f s",
                            slot.index,
                            proc.pid,
                            self.min_backoff,
                        )
                        continue
                    slot.backoff = min(self.max_backoff, max(self.min_backoff, slot.backoff * 2))
                    slot.restart_at = now + slot.backoff
                    log.warning(
                        "worker process %d (pid %d) died unexpectedly with %d after %.1f s; restarting in %.1f s",
                        slot.index,
                        proc.pid,
                        code,
                        lived,
                        slot.backoff,
                    )
                if self.stopping_since is None and slot.restart_at is not None and now >= slot.restart_at:
                    self.restarts += 1
                    self._spawn(slot)
                    alive += 1
            if self.stopping_since is not None:
                if alive == 0:
                    return 1 if failed else 0
                if self.kill_after is not None and now - self.stopping_since > self.kill_after:
                    log.warning(
                        "worker processes still running %.0f s after stop; killing them", self.kill_after
                    )
                    self._forward(signal.SIGKILL)
            time.sleep(self.poll_interval)


#: The hidden ``durable`` command a supervised worker process runs.
CHILD_COMMAND = "worker-process"


def worker_supervisor(
    config: WorkerConfig, processes: int, *, store: Any = None, **options: Any
) -> Supervisor:
    """A supervisor of ``processes`` worker processes, each configured by ``config``.

    ``options`` are :class:`Supervisor`'s keyword arguments (backoff, ``kill_after``...).
    With ``config.metrics_port`` the supervisor serves the children's metrics (and the
    task queues of ``store``) on that port.

    Raises:
        RuntimeError: ``--metrics-port`` without ``prometheus-client``.
        OSError: the metrics port cannot be bound.
    """
    env = dict(os.environ)
    env.update(config.to_env())
    metrics_dir = None
    if config.metrics_port:
        if not metrics.available():
            metrics.serve(config.metrics_port, None, ())  # raises, naming the extra to install
        metrics_dir = tempfile.mkdtemp(prefix="durable-metrics-")
        env[metrics.MULTIPROC_ENV] = metrics_dir
        try:
            metrics.serve(config.metrics_port, store, config.queues, multiproc_dir=metrics_dir)
        except BaseException:
            shutil.rmtree(metrics_dir, ignore_errors=True)
            raise
    argv = [sys.executable, "-m", "workers.cli", CHILD_COMMAND]
    return Supervisor(argv, processes, env=env, metrics_dir=metrics_dir, **options)
