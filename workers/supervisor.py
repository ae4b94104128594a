"""Run N worker processes under one parent (``durable worker --processes N``).

Each child runs ``python -m workers.cli worker-process``: one worker, configured
by the :class:`~workers.config.WorkerConfig` the supervisor puts in its
environment (never on its command line, which ``ps`` shows to everyone: the
Redis URL may hold a password). The supervisor

* forwards SIGTERM and SIGINT to every child and exits once all of them have
  stopped (exit status 0 if every child exited 0, or was ended by the forwarded
  signal itself); SIGUSR1 the same way: each child drains (finishes the runs pinned to its
  build, starts no new run), then stops;
* restarts a child that dies without being asked to, after a backoff that
  doubles on each quick death of that slot (1 s up to 30 s; reset once a child
  has lived for a minute). A child that exits with
  :data:`~workers.watchdog.RUNAWAY_EXIT` gave up a runaway decision (its run is
  blocked, the child was healthy): it is restarted after the shortest backoff; one that
  exits with :data:`DRAINED_EXIT` drained (``durable drain``) and is not restarted (a reload
  starts its slot again): once every child has, the supervisor exits 0;
* gives up when the children cannot start: a child says on a pipe (named by
  ``DURABLE_SUPERVISOR_READY_FD`` in its environment) once it has joined the
  worker registry. If no child ever joined and every slot's first few children
  (``start_attempts``) died before joining, the same fault (the app does not
  import, the store refuses the worker) would end every restart: the supervisor
  stops and keeps the children's ``error: ...`` line in :attr:`Supervisor.startup_error`
  for ``durable worker`` to print, as one worker process would. Once any child
  has joined, deaths are restarted as above whatever their cause (a deploy
  half-way through is not a reason to stop serving);
* on SIGHUP, replaces the children one at a time with new ones (a deploy: they import the
  app's code as it is now on disk): each new child must join the worker registry before the
  one it replaces is sent SIGTERM (which finishes its activities, up to ``--grace``), so the
  queues are served throughout; the last child of a build the new children do not share is
  sent SIGUSR1 instead: it drains the runs pinned to that build, then stops by itself. A new
  child that dies before joining (the new code does not import, say) stops the reload: the
  children not replaced yet keep running the code they started with, and the supervisor says
  why (:attr:`Supervisor.reload_error`);
* forwards each child's stderr to its own, line by line, but for the child's
  ``error: ...`` line, which it says in its own line about that child's end;
* sets ``DURABLE_SUPERVISOR_PID`` in the children's environment, so that a child
  whose supervisor vanishes (SIGKILL) stops by itself;
* with ``--metrics-port``, serves the port itself: the children write their metrics
  to a fresh ``PROMETHEUS_MULTIPROC_DIR`` (``prometheus-client``'s multiprocess
  mode), a scrape sums them, and the directory is removed when the supervisor stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers import metrics
from workers.config import mask_secrets
from workers.watchdog import RUNAWAY_EXIT

log = logging.getLogger("durable.supervisor")

PARENT_ENV = "DURABLE_SUPERVISOR_PID"

#: Names the write end of the pipe on which a child says it joined (see :data:`JOINED`).
READY_FD_ENV = "DURABLE_SUPERVISOR_READY_FD"
#: What a child writes on that pipe once it is in the worker registry, before its build id.
JOINED = b"joined"
#: Exit status of a supervised worker process that drained (asked by `durable drain`, SIGUSR1):
#: it finished what it had to and is not restarted.
DRAINED_EXIT = 79
#: Seconds the children get to stop once the supervisor gave up on them (none of them
#: serves anything: a child stuck importing its app is not waited for).
GIVE_UP_KILL_AFTER = 10.0
#: Longest wait, once a child is dead, for the last lines of its stderr (a grandchild that
#: inherited the pipe may hold it open).
DRAIN_S = 1.0
#: The prefix of the one line the ``durable`` command prints when it fails.
ERROR_PREFIX = "error: "
#: Longest wait, in a reload, for a new child to join the registry before the reload stops
#: (an app whose import hangs must not leave the supervisor half-way for ever).
RELOAD_JOIN_S = 120.0


def joined_message(build: str) -> bytes:
    """What a child writes on its join pipe: :data:`JOINED` and its build id (``""``:
    unversioned), one line, short enough to be written at once."""
    return JOINED + b" " + build.replace("\n", " ").encode()[:1024] + b"\n"


@dataclass
class _Said:
    """What one child wrote on its stderr that the supervisor reports (written by its pump)."""

    error: str = ""  # its `error: ...` line
    last_line: str = ""  # its last other line


@dataclass
class _Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    backoff: float = 0.0
    restart_at: float | None = None
    exit_codes: list[int] = field(default_factory=list)
    ready: int | None = None  # the read end of the current child's join pipe, until it said or died
    joined: bool = False  # the current child joined the registry
    build: str = ""  # the build id the current child said when it joined
    draining: bool = False  # replaced by a reload, it finishes its build's pinned runs first
    drained: bool = False  # its process drained (DRAINED_EXIT): it is not restarted
    startup_failures: int = 0  # children of this slot that died before joining (none joined yet)
    pump: threading.Thread | None = None  # forwards the current child's stderr
    # Per child, not per slot: a pump still draining a pipe a dead child's grandchild holds
    # must not write over what the next child says.
    said: _Said = field(default_factory=_Said)


@dataclass
class _Reload:
    """A SIGHUP's replacement of the children, one slot at a time."""

    index: int = 0  # the slot being replaced
    new: _Slot | None = None  # its replacement, started and not joined yet
    replaced: int = 0


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
        start_attempts: Children each slot starts before the supervisor gives up, while
            every one of them died before joining (``None``: restart for ever).

    Attributes:
        startup_error: Set when the supervisor gave up because no child could start: the
            last one's ``error: ...`` line (or one saying how it ended); :meth:`run` then
            returns 1.
        reloads: Reloads (SIGHUP, :meth:`reload`) that replaced every child.
        reload_error: Why the last reload stopped before it replaced every child (``None``:
            it did not): the new child's ``error: ...`` line, or how it ended.
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
        start_attempts: int | None = 3,
        on_start_failure: Callable[[str | None, float], None] | None = None,
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
        self.start_attempts = start_attempts
        # Told (error line, seconds to the next restart) each time a child dies before joining,
        # and (None, 0) when one joins: the operator views say it (durable.store.start_failures).
        self.on_start_failure = on_start_failure
        self._failing = False
        self.ever_joined = False
        self.startup_error: str | None = None
        self._last_failure = ""
        self._output_lock = threading.Lock()
        self.reloads = 0
        self.reload_error: str | None = None
        self._reload_asked = False  # set by SIGHUP (a signal handler only sets it)
        self._reload: _Reload | None = None
        self._retiring: list[_Slot] = []  # replaced by a reload, stopping (each keeps its proc)

    # ------------------------------------------------------------ children
    def _spawn(self, slot: _Slot) -> None:
        read, write = os.pipe()
        os.set_blocking(read, False)  # polled by the supervision loop
        try:
            env = dict(self.env, **{READY_FD_ENV: str(write)})
            slot.proc = subprocess.Popen(self.argv, env=env, stderr=subprocess.PIPE, pass_fds=(write,))
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)  # the child's copy is the only one: its death is the pipe's end
        slot.ready = read
        slot.joined, slot.build, slot.draining, slot.drained = False, "", False, False
        slot.said = _Said()
        slot.started = time.monotonic()
        slot.restart_at = None
        slot.pump = threading.Thread(
            target=self._pump,
            args=(slot.said, slot.proc.stderr),
            name=f"durable-stderr-{slot.index}",
            daemon=True,
        )
        slot.pump.start()
        log.info("started worker process %d (pid %d)", slot.index, slot.proc.pid)
        if self.stopping_since is not None:
            # A stop signal came while this child was being started (a restart): the stop's
            # forwarding did not see it, and the supervisor would wait for it for ever.
            for signum in sorted(self.stop_signals):
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.send_signal(signum)

    def _pump(self, said: _Said, stream: Any) -> None:
        """Forward one child's stderr to ours, keeping its ``error: ...`` line back: the
        supervisor says it in its own line about that child's end (and, giving up, once)."""
        with stream:
            for raw in stream:
                text = raw.decode(errors="replace").rstrip()
                if text.startswith(ERROR_PREFIX):
                    said.error = text
                    continue
                if text:
                    said.last_line = text
                self._write(raw if raw.endswith(b"\n") else raw + b"\n")

    def _write(self, data: bytes) -> None:
        with self._output_lock:  # whole lines: the children's output does not interleave
            try:
                while data:
                    data = data[os.write(2, data) :]
            except OSError:
                pass  # our stderr is gone: nothing can show the children's output either

    def _check_joined(self, slot: _Slot) -> None:
        """Read the child's join pipe: :data:`JOINED`, or its end (the child died without)."""
        if slot.ready is None:
            return
        try:
            message = os.read(slot.ready, 2048)
        except BlockingIOError:
            return  # still starting
        os.close(slot.ready)
        slot.ready = None
        if message.startswith(JOINED):
            slot.build = message[len(JOINED) :].strip().decode(errors="replace")
            slot.joined = True
            slot.startup_failures = 0
            self.ever_joined = True
            if self._failing:
                self._failing = False
                self._tell(None, 0.0)

    def _reap(self, slot: _Slot, proc: subprocess.Popen[bytes]) -> None:
        """Done with a dead child: whether it joined, its last lines, its metrics."""
        self._check_joined(slot)  # before its death counts: it may have joined, then died at once
        if slot.ready is not None:  # (not at its end yet: a grandchild holds the pipe)
            os.close(slot.ready)
            slot.ready = None
        if slot.pump is not None:
            slot.pump.join(DRAIN_S)  # its `error: ...` line is among its last
            slot.pump = None
        if self.metrics_dir is not None:
            metrics.process_dead(proc.pid, self.metrics_dir)

    def _children(self) -> list[subprocess.Popen[bytes]]:
        """Every child still running: the slots', a reload's new one, the replaced ones."""
        slots = [*self.slots, *([self._reload.new] if self._reload and self._reload.new else [])]
        procs = [slot.proc for slot in slots if slot.proc is not None]
        procs += [slot.proc for slot in self._retiring if slot.proc is not None]
        return [proc for proc in procs if proc.poll() is None]

    def _forward(self, signum: int) -> None:
        for proc in self._children():
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop: forward ``signum`` to the children; :meth:`run` returns once they are gone."""
        self.stop_signals.add(int(signum))
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()
            what = "draining (each stops once drained)" if signum == signal.SIGUSR1 else "stopping"
            log.info(
                "received %s: %s %d worker processes", signal.Signals(signum).name, what, len(self.slots)
            )
        self._forward(signum)

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            self.stop(signum)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGUSR1, handler)  # a drain: each child stops once drained
        signal.signal(signal.SIGHUP, lambda _signum, _frame: self.reload())

    def reload(self) -> None:
        """Replace every child with a new one, one at a time (what SIGHUP does; see the module
        docstring). Asked during a reload, another follows it."""
        self._reload_asked = True

    # ----------------------------------------------------------------- loop
    def run(self) -> int:
        """Supervise until stopped; returns the exit status (0 if every child exited 0)."""
        try:
            return self._supervise()
        finally:
            if self._failing:  # stopped: it restarts nothing any more
                self._tell(None, 0.0)
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
                    self._check_joined(slot)
                    code = proc.poll()
                    if code is None:
                        alive += 1
                        continue
                    slot.proc = None
                    slot.exit_codes.append(code)
                    self._reap(slot, proc)
                    if self.stopping_since is not None:
                        # Killed by the very signal we forwarded (e.g. before its handler was
                        # installed) still counts as a clean stop.
                        failed = failed or (code not in (0, DRAINED_EXIT) and -code not in self.stop_signals)
                        log.info(
                            "worker process %d (pid %d) exited with %d%s",
                            slot.index,
                            proc.pid,
                            code,
                            _said(slot),
                        )
                        continue
                    self._schedule_restart(slot, proc.pid, code, now)
                if self.stopping_since is None and slot.restart_at is not None and now >= slot.restart_at:
                    self.restarts += 1
                    self._spawn(slot)
                    alive += 1
            self._reap_retired()
            if self.stopping_since is None:
                self._step_reload(now)
            if self.stopping_since is None and self._cannot_start():
                self._give_up()
            if self.stopping_since is None and self._all_drained():
                log.info("every worker process drained; exiting")
                return 0
            if self.stopping_since is not None:
                if alive == 0 and not self._children():
                    return 1 if failed or self.startup_error is not None else 0
                if self.kill_after is not None and now - self.stopping_since > self.kill_after:
                    log.warning(
                        "worker processes still running %.0f s after stop; killing them", self.kill_after
                    )
                    self._forward(signal.SIGKILL)
            time.sleep(self.poll_interval)

    # --------------------------------------------------------------- reload
    def _step_reload(self, now: float) -> None:
        """Move a reload on: start a slot's new child, or swap it in once it joined."""
        if self._reload is None:
            if not self._reload_asked:
                return
            self._reload_asked, self._reload, self.reload_error = False, _Reload(), None
            log.info("reload: replacing %d worker processes one at a time", len(self.slots))
        reload = self._reload
        if reload.index == len(self.slots):
            self.reloads += 1
            self._reload = None
            log.info("reload done: %d worker processes replaced", reload.replaced)
            return
        slot = self.slots[reload.index]
        if reload.new is None:
            if slot.proc is None and not slot.drained:  # dead, its restart due: that starts the new code
                reload.index += 1
                return
            # (A drained slot gets a process again: a reload runs N processes of the code on disk.)
            reload.new = _Slot(slot.index)
            self._spawn(reload.new)
            return
        new = reload.new
        assert new.proc is not None
        self._check_joined(new)
        if new.joined:
            self.slots[reload.index] = new
            reload.new, reload.index, reload.replaced = None, reload.index + 1, reload.replaced + 1
            if slot.proc is not None:
                self._retire(slot, new, later=self.slots[reload.index :])
            return
        code = new.proc.poll()
        if code is None and now - new.started < RELOAD_JOIN_S:
            return  # still starting
        if code is None:
            new.proc.kill()
            code = new.proc.wait()
            ended = f"did not join within {RELOAD_JOIN_S:.0f} s"
        else:
            ended = f"exited with {code} before it joined"
        self._reap(new, new.proc)
        said = new.said.error or (f"its last output: {new.said.last_line}" if new.said.last_line else "")
        self.reload_error = mask_secrets(f"the new worker process {ended}" + (f" ({said})" if said else ""))
        self._reload = None
        log.error(
            "reload stopped: %s; %d of %d worker processes replaced, the others keep the code they "
            "started with (fix the code, then send SIGHUP again)",
            self.reload_error,
            reload.replaced,
            len(self.slots),
        )

    def _retire(self, old: _Slot, new: _Slot, later: list[_Slot]) -> None:
        """Stop the child a reload replaced: SIGTERM (it finishes its activities first), or, the
        last child of a build the new code does not share, SIGUSR1: it drains (finishes the
        runs pinned to its build, starts no new one), then stops by itself."""
        assert old.proc is not None and new.proc is not None
        old.draining = bool(
            old.build
            and new.build != old.build
            and not any(s.proc is not None and s.build == old.build for s in later)
        )
        if old.draining:
            log.info(
                "reload: worker process %d (pid %d) joined with build %s; pid %d, the last of build "
                "%s, drains: it finishes the runs pinned to %s, starts no new run, and stops once none "
                "is open (`durable workers` says how many are left)",
                new.index,
                new.proc.pid,
                new.build,
                old.proc.pid,
                old.build,
                old.build,
            )
        else:
            log.info(
                "reload: worker process %d (pid %d) joined; stopping pid %d (it finishes its "
                "activities first)",
                new.index,
                new.proc.pid,
                old.proc.pid,
            )
        self._retiring.append(old)
        with contextlib.suppress(ProcessLookupError):
            old.proc.send_signal(signal.SIGUSR1 if old.draining else signal.SIGTERM)

    def _reap_retired(self) -> None:
        """Done with the children a reload replaced once they have stopped."""
        for slot in list(self._retiring):
            proc = slot.proc
            assert proc is not None  # only a slot with a child is retired
            code = proc.poll()
            if code is None:
                continue
            self._retiring.remove(slot)
            self._reap(slot, proc)
            if code == DRAINED_EXIT:
                log.info(
                    "reload: the replaced worker process %d (pid %d) of build %s drained (no run pinned "
                    "to that build is open) and exited",
                    slot.index,
                    proc.pid,
                    slot.build,
                )
                continue
            clean = code in (0, -signal.SIGTERM)
            (log.info if clean else log.warning)(
                "reload: the replaced worker process %d (pid %d) exited with %d%s",
                slot.index,
                proc.pid,
                code,
                _said(slot),
            )
            if slot.draining and not clean:
                log.warning(
                    "runs pinned to build %s wait for a worker of it (`durable list --status blocked`): "
                    "start `durable worker --build-id %s` on that build's code, or move one with `durable repair ID --build-id NEW`",
                    slot.build,
                    slot.build,
                )

    def _schedule_restart(self, slot: _Slot, pid: int, code: int, now: float) -> None:
        """A child died unasked: when to start its slot's next one (and say why)."""
        lived = now - slot.started
        if code == DRAINED_EXIT and slot.joined:  # (before joining it cannot have drained)
            slot.drained = True
            log.info(
                "worker process %d (pid %d) drained (`durable drain`, or SIGUSR1 to it): not restarted",
                slot.index,
                pid,
            )
            return
        if code == RUNAWAY_EXIT:
            slot.restart_at = now + self.min_backoff
            log.warning(
                "worker process %d (pid %d) gave up a runaway decision (see its log: the run is "
                "blocked); restarting in %.1f s",
                slot.index,
                pid,
                self.min_backoff,
            )
            return
        if lived >= self.stable_after:
            slot.backoff = 0.0
        slot.backoff = min(self.max_backoff, max(self.min_backoff, slot.backoff * 2))
        slot.restart_at = now + slot.backoff
        if slot.joined:
            log.warning(
                "worker process %d (pid %d) %s after %.1f s%s; restarting in %.1f s",
                slot.index,
                pid,
                # Exit code 0: stopped gracefully by someone else (a SIGTERM sent to it), not a crash.
                "stopped (exit code 0; not by this supervisor)"
                if code == 0
                else f"died unexpectedly with {code}",
                lived,
                _said(slot),
                slot.backoff,
            )
            return
        # Counted (see _cannot_start): what ends a child before it joins likely ends the next too.
        slot.startup_failures += 1
        self._last_failure = slot.said.error or (
            f"{ERROR_PREFIX}worker process exited with {code} before it joined"
            + (f" (its last output: {slot.said.last_line})" if slot.said.last_line else "")
        )
        then = "" if self._cannot_start() else f"; restarting in {slot.backoff:.1f} s"
        self._failing = True
        self._tell(mask_secrets(self._last_failure), slot.backoff)
        log.warning(
            "worker process %d (pid %d) exited with %d before it joined%s%s",
            slot.index,
            pid,
            code,
            _said(slot),
            then,
        )

    def _tell(self, error: str | None, retry_s: float) -> None:
        if self.on_start_failure is None:
            return
        try:
            self.on_start_failure(error, retry_s)
        except Exception as exc:  # noqa: BLE001 - Redis away, say: the supervisor goes on
            log.debug("could not note the start failure in Redis: %s", exc)

    def _all_drained(self) -> bool:
        """Every slot's process drained (none is restarted) and nothing else runs."""
        return self._reload is None and not self._children() and all(slot.drained for slot in self.slots)

    def _cannot_start(self) -> bool:
        """No child ever joined, and every slot's first ``start_attempts`` children died before."""
        if self.start_attempts is None or self.ever_joined:
            return False
        return all(slot.startup_failures >= self.start_attempts for slot in self.slots)

    def _give_up(self) -> None:
        """Stop the children still starting and keep the last one's error line for the caller."""
        self.startup_error = mask_secrets(self._last_failure)
        log.error(
            "no worker process could start (%d attempts each, none joined); stopping",
            self.start_attempts or 0,
        )
        # None of them serves anything yet: one stuck importing its app is not waited for.
        self.kill_after = min(self.kill_after or GIVE_UP_KILL_AFTER, GIVE_UP_KILL_AFTER)
        self.stopping_since = time.monotonic()  # (stop() would log a signal nobody sent)
        self.stop(signal.SIGTERM)


def _said(slot: _Slot) -> str:
    """The dead child's own ``error: ...`` line, for the supervisor's line about its end."""
    return f" ({slot.said.error})" if slot.said.error else ""
