-- Start a run: instance + run record + WorkflowStarted (seq 1) + first workflow task, after the
-- workflow id's start policies (durable/start_policy.py), and with signal-with-start the signal
-- on the started (or the open) run's inbox: one script, so no other start, signal or close
-- can come between the check and the writes.
-- KEYS: instance, run, history, workflow task stream, runs index, timers, inbox
--       [, the open run's run, history, inbox, activities, log keys and the outbox: terminate_existing]
-- ARGV: workflow id, run id, type, queue, WorkflowStarted data (msgpack), parent (msgpack or ''),
--       retention ms of the type ('' = the namespace's),
--       options (msgpack map or ''): reuse, conflict (policy names; default allow_duplicate, fail),
--       expect (the open run terminate_existing may terminate), terminated (its WorkflowTerminated
--       data), to_parent (message telling its parent, or ''), to_children (messages closing its
--       children, made from its snapshot with SHA1 snapshot_sha1), signal ({type, data}),
--       limits (of an open run taking the signal: see take_input in _lib.lua),
--       sent ({T:sent key, ms}: the signal's note, so that a retried send is not delivered twice),
--       deadlines ({{timers member, due ms or 0, ms from now}}: the run's workflow timeouts),
--       search index data ('' or msgpack {sa, sx, memo, sched}: see sx_start in _lib.lua)
-- Returns {'OK', run id, ts, id of the run it terminated or ''} | {'ALREADY', open run id}
--   | {'EXISTING', open run id} | {'REJECTED', closed run id, status}
--   | {'MOVED', open run id} (not the one to terminate, or its snapshot changed: read it again)
--   | {'LIMIT', limit, count, open run id}
--   | {'WRONGKIND', key, the kind it holds, the kind expected} (nothing written)
-- A start retried with the same run id returns OK again; a signal-with-start whose signal went
-- to an open run, EXISTING with that run again (their first reply was lost in an outage).
local instance, run, history, wq, runs, timers, inbox = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local wid, rid, wtype, queue, data, parent = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local opt = {}
if ARGV[8] and ARGV[8] ~= '' then opt = cmsgpack.unpack(ARGV[8]) end
local reuse, conflict = opt.reuse or 'allow_duplicate', opt.conflict or 'fail'

-- A start or signal-with-start sent again after its reply was lost in an outage: done already.
if redis.call('EXISTS', run) == 1 then return {'OK', rid, 0, ''} end
local kinds = {instance, 'hash', history, 'stream', wq, 'stream', runs, 'zset'}
for key, kind in pairs({[timers or ''] = 'zset', [inbox or ''] = 'list'}) do  -- (not given by a bulk loader)
  if key ~= '' then kinds[#kinds + 1], kinds[#kinds + 2] = key, kind end
end
local wrong = wrong_kind(kinds)
if wrong then return {'WRONGKIND', wrong[1], wrong[2], wrong[3]} end
local sent = sent_before(opt.sent and opt.sent[1])
if sent then return {'EXISTING', sent} end
local current = redis.call('HMGET', instance, 'run', 'status')
local replaced = ''
if current[1] and is_open(current[2]) then
  local cur = current[1]
  if conflict == 'use_existing' then
    if opt.signal then
      local tag = string.match(instance, '^(.-{%d+})')
      local cur_run, cur_inbox = tag .. ':run:' .. cur, tag .. ':in:' .. cur
      local refused = take_input(cur_run, cur_inbox, cur, opt.limits, opt.signal[1], opt.signal[2])
      if refused then return {refused[1], refused[2], refused[3], cur} end
      note_sent(opt.sent and opt.sent[1], cur, opt.sent and opt.sent[2])
    end
    return {'EXISTING', cur}
  elseif conflict == 'terminate_existing' then
    if opt.expect ~= cur or not KEYS[8] then return {'MOVED', cur} end
    local fields = redis.call('HMGET', KEYS[8], 'status', 'snapshot')
    if is_open(fields[1]) then
      if redis.sha1hex(fields[2] or '') ~= opt.snapshot_sha1 then return {'MOVED', cur} end
      replaced = cur
      terminate_run(cur, instance, KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13], opt.terminated,
        opt.to_parent or '', opt.to_children, opt.timers)
    end
  else
    return {'ALREADY', cur}
  end
elseif current[1] then
  if reuse == 'reject_duplicate' or (reuse == 'allow_duplicate_failed_only' and current[2] == 'completed') then
    return {'REJECTED', current[1], current[2] or 'missing'}
  end
end

local ts = now_ms()
redis.call('HSET', instance, 'run', rid, 'type', wtype, 'status', 'pending', 'updated', ts)
redis.call('HSETNX', instance, 'created', ts)
redis.call('HSET', run, 'workflow_id', wid, 'type', wtype, 'queue', queue, 'status', 'pending',
  'seq', 1, 'task', '1', 'created', ts, 'updated', ts, 'wq', wq, 'parent', parent)
if ARGV[7] and ARGV[7] ~= '' then redis.call('HSET', run, 'retention', ARGV[7]) end
sx_start(run, rid, (ARGV[9] and ARGV[9] ~= '') and cmsgpack.unpack(ARGV[9]) or nil)
redis.call('XADD', history, '0-1', 'e', envelope('WorkflowStarted', ts, data))
redis.call('XADD', wq, '*', 'run', rid)
redis.call('ZADD', runs, ts, rid)
for _, d in ipairs(opt.deadlines or {}) do
  local due = tonumber(d[2]) or 0
  if due <= 0 then due = ts + tonumber(d[3]) end
  redis.call('ZADD', timers, due, d[1])
end
-- Signal-with-start: the first workflow task (queued above) reads it after WorkflowStarted.
if opt.signal then redis.call('RPUSH', inbox, envelope(opt.signal[1], ts, opt.signal[2])) end
return {'OK', rid, ts, replaced}
