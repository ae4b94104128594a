-- Create or update a schedule: its spec, args, next time and the partition's indexes.
-- KEYS: record, claimed, buffer, runs, actions, lock, due index, busy index, all index
--       (keys.schedule_keys)
-- ARGV: schedule id, mode ('create' | 'update'), spec (JSON), args (payload), next time (ms, ''
--       = none: ended), paused ('1' | '0' | '' = keep), note ('=' .. text: set it, '' = keep),
--       action (JSON or '')
-- Returns 'OK' | 'EXISTS' (create of an existing id) | 'MISSING' (update of an unknown id).
local record, actions, due, all = KEYS[1], KEYS[5], KEYS[7], KEYS[9]
local sid, mode, spec, args, nxt, paused, note, action =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]

local exists = redis.call('EXISTS', record) == 1
if mode == 'create' and exists then return 'EXISTS' end
if mode ~= 'create' and not exists then return 'MISSING' end

local ts = now_ms()
if mode == 'create' then
  redis.call('HSET', record, 'created', ts, 'fired', 0, 'started', 0, 'last', '')
  redis.call('SADD', all, sid)
end
redis.call('HSET', record, 'spec', spec, 'args', args, 'next', nxt, 'updated', ts)
if paused ~= '' then redis.call('HSET', record, 'paused', paused) end
if note ~= '' then redis.call('HSET', record, 'note', string.sub(note, 2)) end
if redis.call('HGET', record, 'paused') == '1' or nxt == '' then
  redis.call('ZREM', due, sid)
else
  redis.call('ZADD', due, nxt, sid)
end
if action ~= '' then
  redis.call('LPUSH', actions, action)
  redis.call('LTRIM', actions, 0, 49)
end
return 'OK'
