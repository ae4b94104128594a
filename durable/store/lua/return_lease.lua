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
local current = redis.call('HMGET', acts, aid, aid .. '#', aid .. '@')
if not current[1] or tonumber(current[2]) ~= attempt or not current[3] then return 0 end
if not is_open(redis.call('HGET', run, 'status')) then return 0 end
redis.call('XADD', current[3], '*', 'run', rid, 'act', aid, 'body', current[1])
-- As for a retry: a task in a private stream keeps its host a session host (unstick.lua).
local private = string.match(current[3], ':aq:(@.+)$')
if private then redis.call('SADD', sessions, private) end
return 1
