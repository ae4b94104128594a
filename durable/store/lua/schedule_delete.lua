-- Delete a schedule: its record, claimed and buffered times, runs list, actions, lock, and its
-- entries in the partition's indexes. The runs it started are left alone.
-- KEYS: record, claimed, buffer, runs, actions, lock, due index, busy index, all index
-- ARGV: schedule id
-- Returns 1 (deleted) | 0 (no such schedule).
local sid = ARGV[1]
local existed = redis.call('EXISTS', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
redis.call('ZREM', KEYS[7], sid)
redis.call('SREM', KEYS[8], sid)
redis.call('SREM', KEYS[9], sid)
return existed
