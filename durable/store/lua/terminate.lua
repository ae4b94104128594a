-- Terminate a run now: append WorkflowTerminated after the last seq, close the
-- run, void its pending activities and inputs, tell its parent and close its children
-- (outbox messages). No workflow code runs.
-- KEYS: instance, run, history, inbox, activities, log, outbox
-- ARGV: run id, WorkflowTerminated data (msgpack), message telling the parent (or ''),
--       SHA1 of the run's snapshot the messages closing its children were made from, its timers
--       members (a msgpack list), then those messages...
-- Returns {'OK', seq} | {'MOVED', current run id} | {'STALE'} (the snapshot changed: read it
--   again) | {'CLOSED', status} | {'WRONGKIND', key, the kind it holds, the kind expected}
local instance, run = KEYS[1], KEYS[2]
local rid, data, to_parent = ARGV[1], ARGV[2], ARGV[3]
local wrong = wrong_kind({instance, 'hash', run, 'hash'})
if wrong then return {'WRONGKIND', wrong[1], wrong[2], wrong[3]} end
local current = redis.call('HGET', instance, 'run')
if current ~= rid then return {'MOVED', current or ''} end
local fields = redis.call('HMGET', run, 'status', 'snapshot')
if not is_open(fields[1]) then return {'CLOSED', fields[1] or 'missing'} end
wrong = wrong_kind({KEYS[3], 'stream', KEYS[4], 'list', KEYS[5], 'hash', KEYS[6], 'stream', KEYS[7], 'stream',
  string.match(run, '^(.-{%d+})') .. ':timers', 'zset'})
if wrong then return {'WRONGKIND', wrong[1], wrong[2], wrong[3]} end
if redis.sha1hex(fields[2] or '') ~= ARGV[4] then return {'STALE'} end
local to_children = {}
for i = 6, #ARGV do to_children[#to_children + 1] = ARGV[i] end  -- not unpack(): a fan-out may be long
local seq = terminate_run(rid, instance, run, KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], data, to_parent,
  to_children, cmsgpack.unpack(ARGV[5]))
return {'OK', seq}
