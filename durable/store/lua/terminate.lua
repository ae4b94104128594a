-- Terminate a run now: append WorkflowTerminated after the last seq, close the
-- run, void its pending activities and inputs. No workflow code runs.
-- KEYS: instance, run, history, inbox, activities, log, outbox
-- ARGV: run id, WorkflowTerminated data (msgpack), message telling the parent (or '')
-- Returns {'OK', seq, snapshot} | {'MOVED', current run id} | {'CLOSED', status}
local instance, run, history, inbox, acts, log, outbox = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local rid, data, to_parent = ARGV[1], ARGV[2], ARGV[3]
local current = redis.call('HGET', instance, 'run')
if current ~= rid then return {'MOVED', current or ''} end
local fields = redis.call('HMGET', run, 'status', 'seq', 'snapshot')
if not is_open(fields[1]) then return {'CLOSED', fields[1] or 'missing'} end
local ts = now_ms()
local seq = tonumber(fields[2]) + 1
redis.call('XADD', history, '0-' .. seq, 'e', envelope('WorkflowTerminated', ts, data))
for _, item in ipairs(redis.call('LRANGE', inbox, 0, -1)) do
  redis.call('XADD', log, '*', 'kind', 'dropped', 'e', item, 'reason', 'run terminated', 'ts', ts)
end
redis.call('DEL', inbox, acts)
redis.call('HSET', run, 'seq', seq, 'status', 'terminated', 'closed', ts, 'outcome', 'terminated', 'task', '0',
  'updated', ts)
redis.call('HSET', instance, 'status', 'terminated', 'updated', ts)
index_closed(run, rid)
close_hooks(run)
if to_parent ~= '' then redis.call('XADD', outbox, '*', 'm', to_parent) end
return {'OK', seq, fields[3] or ''}
