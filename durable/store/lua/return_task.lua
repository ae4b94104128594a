-- Give back an activity task a worker holds but never started (it waited for a thread, behind
-- threads that are busy with long attempts, or the worker is stopping): it goes to the end of its
-- stream as a new entry, for any worker, and the entry it had is acked and deleted.
-- When the commit that claimed the task for this worker began its attempt there, that begin is
-- undone (its start, who began it, its deadline): nothing of it ran, so it counts no begin (the
-- crash-loop bound) and its timeout starts when a worker starts it.
-- KEYS: run, activities, running, the task's stream
-- ARGV: consumer group, worker (the consumer holding the entry), entry id, run id, activity id,
--       attempt, '1' when the claim began the attempt
-- Returns 1 when the task went back; 0 when the entry is no longer this worker's (another took
-- it over after --claim-idle: it runs there) or is gone.
local run, acts, running, stream = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, worker, entry = ARGV[1], ARGV[2], ARGV[3]
local rid, aid, attempt = ARGV[4], ARGV[5], ARGV[6]

local ok, held = pcall(redis.call, 'XPENDING', stream, group, entry, entry, 1, worker)
if not ok or #held == 0 then return 0 end
if ARGV[7] == '1' and redis.call('HGET', acts, aid .. ':worker') == attempt .. '|' .. worker .. '|1' then
  redis.call('HDEL', acts, aid .. ':started', aid .. ':worker')
  redis.call('ZREM', running, rid .. '|' .. aid .. '|' .. attempt)
end
local found = redis.call('XRANGE', stream, entry, entry)
redis.call('XACK', stream, group, entry)
if #found == 0 then return 0 end
redis.call('XADD', stream, '*', unpack(found[1][2]))
redis.call('XDEL', stream, entry)
return 1
