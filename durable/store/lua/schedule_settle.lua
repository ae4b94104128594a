-- Settle one claimed or buffered time of a schedule (the overlap policy decided in Python):
--   start_claimed / start_buffered: its run was started; remember the run as the schedule's
--   skip: drop the claimed time;  buffer: move it to the buffer;  replace_buffer: the buffer
--   keeps only it;  drop_buffered: drop a buffered time (the policy keeps fewer now);
--   forget: a run of the schedule closed (member = its workflow id)
-- KEYS: record, claimed, buffer, runs, actions, lock, due index, busy index, all index
-- ARGV: schedule id, lock token ('' = none), op, member, workflow id, scheduled ms, action
--       (JSON or '')
-- Returns 'OK' | 'GONE' (the time was settled already) | 'LOST' (the lock is not ours) |
--         'MISSING' (the schedule was deleted).
local record, claimed, buffer, runs, actions, lock, busy =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[8]
local sid, token, op, member, wid, scheduled, action =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]

if redis.call('EXISTS', record) == 0 then return 'MISSING' end
if token ~= '' and redis.call('GET', lock) ~= token then return 'LOST' end
local found = 1
if op == 'start_claimed' or op == 'skip' or op == 'buffer' or op == 'replace_buffer' then
  found = redis.call('ZREM', claimed, member)
elseif op == 'start_buffered' or op == 'drop_buffered' then
  found = redis.call('LREM', buffer, 1, member)
elseif op == 'forget' then
  redis.call('ZREM', runs, wid)
end
if found == 0 then return 'GONE' end

if op == 'start_claimed' or op == 'start_buffered' then
  redis.call('ZADD', runs, scheduled, wid)
  redis.call('HINCRBY', record, 'started', 1)
elseif op == 'buffer' then
  redis.call('RPUSH', buffer, member)
elseif op == 'replace_buffer' then
  redis.call('DEL', buffer)
  redis.call('RPUSH', buffer, member)
end
if redis.call('ZCARD', claimed) == 0 and redis.call('LLEN', buffer) == 0 then
  redis.call('SREM', busy, sid)
else
  redis.call('SADD', busy, sid)
end
if action ~= '' then
  redis.call('LPUSH', actions, action)
  redis.call('LTRIM', actions, 0, 49)
end
return 'OK'
