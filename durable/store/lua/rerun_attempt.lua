-- Run a leased attempt (eager mode, a local activity) again, as the same attempt, from its
-- activity queue: its lease lapsed, so the worker running it died (workers/worker_deaths.py).
-- Like the reclaim of a queued task, this costs the activity no attempt of its retry policy; the
-- begins counted in `<aid>:worker` (begin_attempt.lua) bound how often that may happen.
-- Safe to run from many schedulers at once (all of them see the lapsed deadline): only the
-- first adds the task, and marks the attempt in `<aid>:rerun`. The lapsed lease's deadline goes
-- in the same step (a scheduler that died between the two lost the attempt: nothing ran it again).
-- KEYS: run, activities, sessions, running
-- ARGV: run id, activity id, attempt
-- Returns 1 when the task was added to its queue, else 0 (another scheduler did, the attempt is
-- no longer current, or the run is closed)
local run, acts, sessions, running = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local rid, aid, attempt = ARGV[1], ARGV[2], tonumber(ARGV[3])

redis.call('ZREM', running, rid .. '|' .. aid .. '|' .. attempt)

if tonumber(redis.call('HGET', acts, aid .. ':rerun')) == attempt then return 0 end
if requeue_attempt(run, acts, sessions, rid, aid, attempt) == 0 then return 0 end
redis.call('HSET', acts, aid .. ':rerun', attempt)
return 1
