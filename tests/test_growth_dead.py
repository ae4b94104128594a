"""Expired dead letters are swept as fast as they come: one sweep step per partition per pass
(200 entries every 10 s) took minutes to clear 5,000 expired letters, and poison input above
~20 letters/s per partition made ``T:dead`` grow past its retention. A pass now takes steps
while they come back full, within a budget, and asks for the next pass at once when letters
were still being deleted as the budget ran out (as the run purge does).

Real Redis (the shared test server); the retention pass is called directly.
"""

from __future__ import annotations

import time

from durable.store.redis_store import RedisStore
from durable.store.retention import Purger

EXPIRED = 5000
OLD_MS = 1_000_000  # 1970: far past any retention


def add_letters(store: RedisStore, p: int, n: int, run_of: str = "gone-{i}", start: int = 0) -> None:
    """``n`` dead letters in partition ``p`` written long ago (their ids carry the time)."""
    with store.redis.pipeline(transaction=False) as pipe:
        for i in range(start, start + n):
            fields = {"kind": "activity", "run": run_of.format(i=i), "reason": "poison", "ts": OLD_MS + i}
            pipe.xadd(store.keys.dead(p), fields, id=f"{OLD_MS + i}-0")
        pipe.execute()


def dead_len(store: RedisStore, p: int) -> int:
    return int(store.redis.xlen(store.keys.dead(p)))


def test_a_backlog_of_expired_dead_letters_is_cleared_in_a_pass_or_two(store: RedisStore) -> None:
    add_letters(store, 3, EXPIRED)
    add_letters(store, 5, 300)
    purger = Purger(store, sweep_budget_s=5.0)  # the rounds bound this pass, not the clock
    started = time.monotonic()
    assert purger.run_pass() is True  # 20 steps of 200 in partition 3: more was being deleted
    first = EXPIRED - dead_len(store, 3)
    # Old code: 200 per partition per pass (every 10 s): 25 passes, over 4 minutes.
    assert first == purger.rounds * purger.sweep_count and dead_len(store, 5) == 0
    passes = 2
    while purger.run_pass():
        passes += 1
    took = time.monotonic() - started
    print(f"{EXPIRED} expired letters: {first} in the first pass, all in {passes} passes, {took:.2f} s")
    assert dead_len(store, 3) == 0 and passes == 2 and purger.dead_swept == EXPIRED + 300


def test_the_time_budget_bounds_a_pass_and_the_next_one_goes_on(store: RedisStore) -> None:
    add_letters(store, 2, 1000)
    purger = Purger(store, sweep_budget_s=0.0)  # one step per partition, then stop
    assert purger.run_pass() is True
    assert dead_len(store, 2) == 1000 - purger.sweep_count
    # The scheduler runs the next pass at once (tick: due now), not in `interval` seconds.
    purger.tick(now=100.0)
    purger.tick(now=100.0)
    assert dead_len(store, 2) == 1000 - 3 * purger.sweep_count


def test_letters_of_open_runs_are_kept_and_do_not_keep_the_sweep_busy(store: RedisStore) -> None:
    k = store.keys
    store.redis.hset(k.run(4, "open-run"), mapping={"status": "running"})
    add_letters(store, 4, 1000, run_of="open-run")
    add_letters(store, 4, 10, start=1000)  # after them: expired, their run gone
    purger = Purger(store, sweep_count=50, rounds=2)
    # A pass walks past 100 kept letters and asks for no early pass (it deleted nothing): the
    # scan resumes there at the next one, and reaches the expired letters behind them.
    assert purger.run_pass() is False
    assert purger.dead_swept == 0
    for _ in range(10):
        purger.run_pass()
    assert dead_len(store, 4) == 1000 and purger.dead_swept == 10
