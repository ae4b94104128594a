-- Park a task that cannot run: copy it with the reason to the dead-letter
-- stream and ack it, so it is never lost and never retried blindly. With
-- block = '1' the run is marked blocked (its task flag stays set, so inputs
-- queue in the inbox until `durable repair` re-queues it).
-- KEYS: dead, task stream, run (or any key of the partition), runs index, blocked index
-- ARGV: task entry id, kind, reason, task fields (msgpack), run id or '', block, blocked kind or '',
--       position (1-based) of the inbox item that blocks the run or '' (`repair --drop-input` drops it)
local dead, stream, run = KEYS[1], KEYS[2], KEYS[3]
local entry_id, kind, reason, fields, rid, block = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local block_kind, input_at = ARGV[7] or '', ARGV[8] or ''
local ts = now_ms()
redis.call('XADD', dead, '*', 'kind', kind, 'stream', stream, 'entry', entry_id, 'run', rid,
  'reason', reason, 'task', fields, 'ts', ts)
ack(stream, entry_id)
if rid ~= '' and block == '1' and redis.call('EXISTS', run) == 1 then
  redis.call('HSET', run, 'blocked', reason, 'blocked_kind', block_kind, 'updated', ts)
  if input_at ~= '' then redis.call('HSET', run, 'blocked_input', input_at) end
  -- Indexed by creation time, as in the runs index, so a listing pages through both alike.
  local created = redis.call('ZSCORE', KEYS[4], rid)
  if created then redis.call('ZADD', KEYS[5], created, rid) end
end
return {'OK'}
