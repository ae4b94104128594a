-- Delete a schedule: its record, claimed and buffered times, runs list, actions, lock, and its
-- entries in the partition's indexes. The runs it started are left alone.
-- KEYS: record, claimed, buffer, runs, actions, lock, due index, busy index, all index
--       [, the delete call's T:sent note]
-- ARGV: schedule id[, the note's time to live (ms)]
-- Returns 1 (deleted; or deleted by this call already, its reply lost in an outage) | 0 (no such schedule).
local sid = ARGV[1]
if sent_before(KEYS[10]) then return 1 end
local existed = redis.call('EXISTS', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
redis.call('ZREM', KEYS[7], sid)
redis.call('SREM', KEYS[8], sid)
redis.call('SREM', KEYS[9], sid)
if existed == 1 then note_sent(KEYS[10], sid, ARGV[2]) end
return existed
