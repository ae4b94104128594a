-- Give back a leased attempt (eager mode, a local activity) that a worker holds but never started
-- (it waited for a thread behind threads busy with long attempts, or the worker is stopping): the
-- same attempt goes to its activity queue's stream for any worker, and its lease (or deadline)
-- goes with the worker's hold on it: its timeout starts when a worker starts it.
-- KEYS: run, activities, running, sessions
-- ARGV: run id, activity id, attempt
-- Returns 1 when the task was added to its queue; 0 when there is nothing to run (the attempt is
-- no longer current, or the run closed).
local run, acts, running, sessions = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local rid, aid, attempt = ARGV[1], ARGV[2], tonumber(ARGV[3])

redis.call('ZREM', running, rid .. '|' .. aid .. '|' .. attempt)
return requeue_attempt(run, acts, sessions, rid, aid, attempt)
