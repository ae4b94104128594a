-- Start a run: instance + run record + WorkflowStarted (seq 1) + first workflow task.
-- KEYS: instance, run, history, workflow task stream, runs index
-- ARGV: workflow id, run id, type, queue, WorkflowStarted data (msgpack), parent (msgpack or ''),
--       retention ms of the type ('' = the namespace's),
--       search index data ('' or msgpack {sa, sx, memo, sched}: see sx_start in _lib.lua)
-- Returns {'OK', run id, ts} | {'ALREADY', current run id} (a start retried with the same
-- run id is idempotent and returns OK).
local instance, run, history, wq, runs = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local wid, rid, wtype, queue, data, parent = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]

local current = redis.call('HMGET', instance, 'run', 'status')
if current[1] == rid then return {'OK', rid, 0} end
if current[1] and is_open(current[2]) then return {'ALREADY', current[1]} end

local ts = now_ms()
redis.call('HSET', instance, 'run', rid, 'type', wtype, 'status', 'pending', 'updated', ts)
redis.call('HSETNX', instance, 'created', ts)
redis.call('HSET', run, 'workflow_id', wid, 'type', wtype, 'queue', queue, 'status', 'pending',
  'seq', 1, 'task', '1', 'created', ts, 'updated', ts, 'wq', wq, 'parent', parent)
if ARGV[7] and ARGV[7] ~= '' then redis.call('HSET', run, 'retention', ARGV[7]) end
sx_start(run, rid, (ARGV[8] and ARGV[8] ~= '') and cmsgpack.unpack(ARGV[8]) or nil)
redis.call('XADD', history, '0-1', 'e', envelope('WorkflowStarted', ts, data))
redis.call('XADD', wq, '*', 'run', rid)
redis.call('ZADD', runs, ts, rid)
return {'OK', rid, ts}
