-- Record an activity heartbeat: push the attempt's deadline, keep its details.
-- KEYS: activities (field "<id>#" = current attempt), running
-- ARGV: run id, activity id, attempt, details (msgpack payload or ''), deadline ms from now (0 = none)
-- Returns 0 to go on, 1 when the activity was cancelled or superseded.
local acts, running = KEYS[1], KEYS[2]
local rid, aid, attempt = ARGV[1], ARGV[2], tonumber(ARGV[3])
if tonumber(redis.call('HGET', acts, aid .. '#')) ~= attempt then return 1 end
if ARGV[4] ~= '' then redis.call('HSET', acts, aid .. ':hb', ARGV[4]) end
local extend = tonumber(ARGV[5])
if extend > 0 then
  redis.call('ZADD', running, now_ms() + extend, rid .. '|' .. aid .. '|' .. attempt)
end
return 0
