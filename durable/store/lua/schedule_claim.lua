-- Claim scheduled times of a schedule: the times move into its claimed set and its next time
-- moves forward, at once. The compare-and-set on the next time makes each scheduled time
-- claimed exactly once however many schedulers race (the loser gets 'STALE').
-- KEYS: record, claimed, buffer, runs, actions, lock, due index, busy index, all index
-- ARGV: schedule id, lock token ('' = none needed: trigger, backfill), expected next time
--       ('*' = do not check or move it), new next time ('' = ended), last claimed scheduled
--       time, scheduled times claimed (count), action (JSON or ''), then pairs
--       (start due ms, member "<scheduled ms>|<kind>|<overlap>")
-- Returns 'OK' | 'STALE' | 'LOST' (the lock is not ours) | 'MISSING'.
local record, claimed, actions, lock, due, busy = KEYS[1], KEYS[2], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local sid, token, expected, nxt, last, count, action =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6]), ARGV[7]

if redis.call('EXISTS', record) == 0 then return 'MISSING' end
if token ~= '' and redis.call('GET', lock) ~= token then return 'LOST' end
if expected ~= '*' then
  local current = redis.call('HGET', record, 'next')
  if current ~= expected then return 'STALE' end
  redis.call('HSET', record, 'next', nxt, 'last', last)
  if nxt == '' or redis.call('HGET', record, 'paused') == '1' then
    redis.call('ZREM', due, sid)
  else
    redis.call('ZADD', due, nxt, sid)
  end
end
if count > 0 then redis.call('HINCRBY', record, 'fired', count) end
for i = 8, #ARGV, 2 do
  redis.call('ZADD', claimed, ARGV[i], ARGV[i + 1])
end
if #ARGV >= 8 then redis.call('SADD', busy, sid) end
if action ~= '' then
  redis.call('LPUSH', actions, action)
  redis.call('LTRIM', actions, 0, 49)
end
return 'OK'
