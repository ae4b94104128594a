-- Park a task that cannot run: copy it with the reason to the dead-letter
-- stream and ack it, so it is never lost and never retried blindly. With
-- block = '1' the run is marked blocked (its task flag stays set, so inputs
-- queue in the inbox until `durable repair` re-queues it).
-- KEYS: dead, task stream, run (or any key of the partition)
-- ARGV: task entry id, kind, reason, task fields (msgpack), run id or '', block, blocked kind or ''
local dead, stream, run = KEYS[1], KEYS[2], KEYS[3]
local entry_id, kind, reason, fields, rid, block = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local block_kind = ARGV[7] or ''
local ts = now_ms()
redis.call('XADD', dead, '*', 'kind', kind, 'stream', stream, 'entry', entry_id, 'run', rid,
  'reason', reason, 'task', fields, 'ts', ts)
ack(stream, entry_id)
if rid ~= '' and block == '1' and redis.call('EXISTS', run) == 1 then
  redis.call('HSET', run, 'blocked', reason, 'blocked_kind', block_kind, 'updated', ts)
end
return {'OK'}
