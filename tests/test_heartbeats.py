"""An attempt's heartbeats are throttled: a loop may heartbeat every item, Redis sees a write
per interval, and the details held back are still written (and still push the deadline)."""

from __future__ import annotations

import threading
import time

from durable import codec
from workers.heartbeats import MAX_INTERVAL_S, AttemptHeartbeat, Flusher, interval_for


class Writes:
    """Records each write (details, the heartbeat's wall time); answers ``cancelled``."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, float]] = []
        self.threads: list[str] = []
        self.cancelled = False
        self.written = threading.Event()

    def __call__(self, details: bytes, beat_at: float) -> bool:
        self.calls.append((codec.loads(details) if details else None, beat_at))
        self.threads.append(threading.current_thread().name)
        self.written.set()
        return self.cancelled


def test_the_interval_is_a_quarter_of_the_heartbeat_timeout_at_most_a_second() -> None:
    assert interval_for(2) == 0.5
    assert interval_for(60) == MAX_INTERVAL_S == interval_for(None)
    # Under a second, not throttled: CPU-bound loops held the interpreter past a 0.2 s timeout.
    assert interval_for(0.2) == 0.0 == interval_for(0.99)


def test_an_unthrottled_attempt_writes_every_heartbeat() -> None:
    writes = Writes()
    beat = AttemptHeartbeat(writes, 0.0, Flusher())
    for i in range(5):
        beat(i)
    assert [d for d, _ in writes.calls] == [0, 1, 2, 3, 4]


def test_a_loop_of_heartbeats_is_one_write_now_and_the_latest_details_an_interval_later() -> None:
    writes = Writes()
    beat = AttemptHeartbeat(writes, 0.2, Flusher())
    started = time.monotonic()
    for i in range(1000):
        assert beat(i) is False
    assert time.monotonic() - started < 0.2, "the loop outran the interval: the machine is too slow"
    assert [d for d, _ in writes.calls] == [0]  # the first at once, the rest held back
    deadline = time.monotonic() + 5
    while len(writes.calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # no further write comes: nothing is waiting
    assert [d for d, _ in writes.calls] == [0, 999]
    # The held-back write carries when the last heartbeat was made, not when it was written:
    # the deadline it pushes counts from the heartbeat.
    assert writes.calls[1][1] < time.time() - 0.2


def test_a_heartbeat_without_details_keeps_the_details_waiting() -> None:
    writes = Writes()
    beat = AttemptHeartbeat(writes, 0.1, Flusher())
    beat("first")
    beat("page 7")
    beat(None)
    beat.close(flush=True)
    assert [d for d, _ in writes.calls] == ["first", "page 7"]


def test_a_cancel_a_held_back_write_learns_is_raised_by_the_next_heartbeat() -> None:
    writes = Writes()
    beat = AttemptHeartbeat(writes, 0.1, Flusher())
    assert beat(1) is False
    writes.cancelled, writes.written = True, threading.Event()
    assert beat(2) is False  # held back: not written yet
    assert writes.written.wait(5)
    time.sleep(0.05)
    assert beat(3) is True


def test_the_end_of_an_attempt_writes_its_waiting_details_only_when_it_failed() -> None:
    failed, completed = Writes(), Writes()
    for writes, flush in ((failed, True), (completed, False)):
        beat = AttemptHeartbeat(writes, 0.1, Flusher())
        beat("a")
        beat("b")
        beat.close(flush=flush)
    time.sleep(0.3)  # a closed attempt's flush, due meanwhile, writes nothing
    assert [d for d, _ in failed.calls] == ["a", "b"]
    assert [d for d, _ in completed.calls] == ["a"]


def test_a_loop_that_goes_on_heartbeating_writes_on_its_own_thread() -> None:
    """The flusher wrote while the loop went on: behind 16 CPU-bound activities its write waited
    for the interpreter past a 0.2 s heartbeat timeout, every heartbeat meanwhile held back. The
    loop's own calls write; the flusher only once the code has gone quiet."""
    writes = Writes()
    beat = AttemptHeartbeat(writes, 0.05, Flusher())
    until, i = time.monotonic() + 0.4, 0
    while time.monotonic() < until:
        beat(i)
        i += 1
    # Two calls in a row: the second comes within an interval of any write the first made, so it
    # is held for the flusher (the loop's last call alone sometimes wrote itself: a CI run).
    beat(i)
    beat(i + 1)
    time.sleep(0.2)
    loop = threading.current_thread().name
    assert len(writes.threads) >= 5 and set(writes.threads[:-1]) == {loop}, writes.threads
    assert writes.threads[-1] == "durable-heartbeats" and writes.calls[-1][0] == i + 1
