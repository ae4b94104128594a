-- Terminate a run now: append WorkflowTerminated after the last seq, close the
-- run, void its pending activities and inputs. No workflow code runs.
-- KEYS: instance, run, history, inbox, activities, log, outbox
-- ARGV: run id, WorkflowTerminated data (msgpack), message telling the parent (or '')
-- Returns {'OK', seq, snapshot} | {'MOVED', current run id} | {'CLOSED', status}
local instance, run = KEYS[1], KEYS[2]
local rid, data, to_parent = ARGV[1], ARGV[2], ARGV[3]
local current = redis.call('HGET', instance, 'run')
if current ~= rid then return {'MOVED', current or ''} end
local fields = redis.call('HMGET', run, 'status', 'snapshot')
if not is_open(fields[1]) then return {'CLOSED', fields[1] or 'missing'} end
local seq = terminate_run(rid, instance, run, KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], data, to_parent)
return {'OK', seq, fields[2] or ''}
