-- Take the expiry of one running attempt's deadline: of every worker's scheduler that read it as
-- passed, one deals with the attempt. The deadline is moved `hold` ms on, not removed: what the
-- taker then does (fail the attempt, run a lapsed lease again) removes it in its own script, so a
-- taker that dies in between (its process killed, Redis gone) leaves the deadline to expire again
-- for another scheduler, instead of an attempt no deadline, task or lease points to any more.
-- KEYS: running
-- ARGV: attempt member (run|activity|attempt), now ms, held until ms
-- Returns 1 when this call took it, 0 when another scheduler did (or it was dealt with already)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) > tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return 1
