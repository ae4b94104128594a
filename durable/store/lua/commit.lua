-- Commit one decision atomically (append_if_sequence):
--   consumed inbox items + new command events -> history (seq expected+1 ...),
--   activity tasks, timers, outbox messages, run record + snapshot, ack the
--   workflow task; re-wake the run if inputs arrived meanwhile.
-- KEYS: run, history, inbox, instance, timers, activities, log, outbox, hooks, dead, running, sessions,
--       then every stream the plan names (activity queues, next run's keys, its inbox included).
-- ARGV: plan (msgpack map, built by store/runs.py RunStore.commit_args from a CommitPlan)
-- Returns {'OK', new seq, inbox length (0 when not read: eager, closed), claimed tasks
--       ({stream, entry id, fields, began ms or 0})}
--       | {'CONFLICT', seq} | {'CLOSED', status}
--       | {'INPUTS', seq} (closing, while signals arrived after the decision read the inbox: nothing written)
--       | {'STALE', activity id} (an eager completion is no longer current; nothing written)
--       | {'LOST', seq} (the run's history stream is gone; nothing written)
--       | {'WRONGKIND', key, the kind it holds, the kind expected} (nothing written)
local run, history, inbox, instance = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local timers, acts, log, outbox, hooks, dead = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local running, sessions = KEYS[11], KEYS[12]
local plan = cmsgpack.unpack(ARGV[1])
local rid = plan.rid
-- The plan leaves out the lists a decision does not use (most are empty in most decisions).
local NONE = {}

-- Whether an inbox item is a signal: its envelope (see envelope() in _lib.lua, and the same
-- bytes from the client) starts with its type; a garbled item is simply not one.
local SIGNAL_HEAD = '\131' .. cmsgpack.pack('type') .. cmsgpack.pack('SignalReceived')
local CANCEL_HEAD = '\131' .. cmsgpack.pack('type') .. cmsgpack.pack('CancelRequested')
local function is_signal(item)
  return string.sub(item, 1, #SIGNAL_HEAD) == SIGNAL_HEAD
end
-- What a run continued as new hands its next run: signals, and a cancel (of the workflow id).
local function carried(item)
  return is_signal(item) or string.sub(item, 1, #CANCEL_HEAD) == CANCEL_HEAD
end

-- Check before writing anything: a Lua error does not undo earlier writes.
local st = redis.call('HMGET', run, 'seq', 'status')
local seq = tonumber(st[1])
if seq == nil then return {'CLOSED', 'missing'} end
if seq ~= plan.seq then return {'CONFLICT', seq} end
if not is_open(st[2]) then return {'CLOSED', st[2]} end
-- A run with events has its history: gone (evicted under an allkeys-* maxmemory policy, or
-- deleted by hand), a commit would start a new one at seq+1 and the run go on without its past.
if seq > 0 and redis.call('EXISTS', history) == 0 then return {'LOST', seq} end
-- Eager completions: this worker ran these attempts itself; each must still be current.
for _, e in ipairs(plan.eager or NONE) do
  if tonumber(redis.call('HGET', acts, e[1] .. '#')) ~= e[2] then return {'STALE', e[1]} end
end

-- The kinds of the keys this plan writes, before anything is written: a command failing on a
-- key of the wrong kind (made by hand) would leave the history written and the record not, the
-- run lost; refused here, nothing is written, and the run goes on once the key is mended. Only
-- the keys the plan touches are read (one TYPE each; the history and inbox always).
local kinds = {history, 'stream', inbox, 'list'}
local function expect(key, kind) kinds[#kinds + 1], kinds[#kinds + 2] = key, kind end
if plan.activities or plan.leased or plan.eager or plan.cancel_activities then expect(acts, 'hash') end
if plan.leased or plan.eager or plan.activities then expect(running, 'zset') end
if plan.dropped or plan.eager or plan.close then expect(log, 'stream') end
if plan.dropped then expect(dead, 'stream') end
if plan.timers or plan.untimers or plan.cancel_activities or plan.next then expect(timers, 'zset') end
if plan.outbox then expect(outbox, 'stream') end
if plan.hooks or plan.unhooks or plan.close then expect(hooks, 'hash') end
local wrong = wrong_kind(kinds)
if wrong then return {'WRONGKIND', wrong[1], wrong[2], wrong[3]} end
-- A run closing (a run continued as new hands them on) while signals arrived after its decision
-- read the inbox: decided again with them (the driver applies a decision's signals first), so
-- that no signal a client was told was delivered is only noted as dropped beside the history.
if plan.close ~= nil and plan.next == nil then
  for _, item in ipairs(redis.call('LRANGE', inbox, plan.consumed, -1)) do
    if is_signal(item) then return {'INPUTS', seq} end
  end
end

local ts = now_ms()
for i, e in ipairs(plan.events) do
  redis.call('XADD', history, '0-' .. (seq + i), 'e', e)
end
local new_seq = seq + #plan.events
if plan.consumed > 0 then redis.call('LTRIM', inbox, plan.consumed, -1) end

-- Inputs read but not applied (duplicates, late results) stay beside the history;
-- undecodable ones are parked as dead letters too.
for _, d in ipairs(plan.dropped or NONE) do
  log_add(log, 'kind', 'dropped', 'e', d[1], 'reason', d[2], 'ts', ts)
  if d[3] == 1 then
    redis.call('XADD', dead, '*', 'kind', 'inbox', 'run', rid, 'e', d[1], 'reason', d[2], 'ts', ts)
  end
end
-- A task the committing worker claims (a[4], a[5]: it has room for it in its backlog) is read
-- here, for it, into the consumer group's pending list: it runs without a read of its own,
-- and is recovered like any read task if that worker dies. The read takes the stream's oldest
-- undelivered task: when that is the one just added, its attempt begins here too (started ms
-- a[4], deadline a[5]: begin_attempt.lua's bookkeeping) and the worker skips that round trip.
local claimed = {}
for _, a in ipairs(plan.activities or NONE) do
  local id = add_task(a[1], sessions, 'run', rid, 'act', a[2], 'body', a[3])
  local begun = 0
  if a[4] then
    -- pcall: a stream deleted meanwhile has no consumer group (NOGROUP), and an error here
    -- would leave this commit half written. The task then just waits for a read.
    local got = redis.pcall('XREADGROUP', 'GROUP', GROUP, plan.claimer, 'COUNT', 1, 'STREAMS', a[1], '>')
    local entry = type(got) == 'table' and not got.err and got[1][2][1]
    if entry then
      if entry[1] == id then
        begun = ts
        if a[5] > 0 then redis.call('ZADD', running, a[5], rid .. '|' .. a[2] .. '|1') end
      end
      claimed[#claimed + 1] = {a[1], entry[1], entry[2], begun}
    end
  end
  -- The activity's fields (and, begun here, its start and who began it) in one write.
  local fields = {a[2], a[3], a[2] .. '#', 1, a[2] .. '@', a[1]}
  if begun > 0 then
    fields[7], fields[8], fields[9], fields[10] = a[2] .. ':started', a[4], a[2] .. ':worker', 1 .. '|' .. plan.claimer .. '|' .. 1
  end
  redis.call('HSET', acts, unpack(fields))
end
-- Leased activities run on the committing worker (local activities, eager mode): no
-- task in a stream, only a lease; if the worker dies, the lease expires and the
-- scheduler retries the attempt through the activity's stream.
for _, a in ipairs(plan.leased or NONE) do
  redis.call('HSET', acts, a[2], a[3], a[2] .. '#', 1, a[2] .. '@', a[1])
  redis.call('ZADD', running, a[4], rid .. '|' .. a[2] .. '|1')
end
for _, e in ipairs(plan.eager or NONE) do
  forget_activity(acts, e[1])
  redis.call('ZREM', running, rid .. '|' .. e[1] .. '|' .. e[2])
  ack(e[4], e[5]) -- a claimed task's entry (its result comes with the decision); none when leased
  log_add(log, 'kind', 'attempt', 'act', e[1], 'attempt', e[2], 'outcome', 'completed',
    'record', e[3], 'reason', '', 'ts', ts)
end
for _, t in ipairs(plan.timers or NONE) do redis.call('ZADD', timers, t[2], t[1]) end
for _, m in ipairs(plan.untimers or NONE) do redis.call('ZREM', timers, m) end
for _, aid in ipairs(plan.cancel_activities or NONE) do
  forget_activity(acts, aid)
  redis.call('ZREM', timers, 'r|' .. rid .. '|' .. aid)
end
for _, m in ipairs(plan.outbox or NONE) do redis.call('XADD', outbox, '*', 'm', m) end
for _, h in ipairs(plan.hooks or NONE) do hook_add(run, rid, h[2], h[1]) end
for _, hid in ipairs(plan.unhooks or NONE) do hook_remove(run, hid) end

if plan.sticky ~= nil then
  -- The committing worker holds the run's driver in its cache: its next tasks go there.
  redis.call('HSET', run, 'seq', new_seq, 'status', plan.status, 'snapshot', plan.snapshot, 'updated', ts,
    'sticky', plan.sticky)
else
  redis.call('HSET', run, 'seq', new_seq, 'status', plan.status, 'snapshot', plan.snapshot, 'updated', ts)
end
-- Search attributes and memo the decision upserted; the status index follows the status.
if plan.sa ~= nil then sx_set(run, rid, plan.sa[1], plan.sa[2]) end
if plan.memo ~= nil then redis.call('HSET', run, 'memo', plan.memo) end
if plan.status ~= st[2] then sx_status(run, rid) end
if plan.pin ~= nil and (redis.call('HGET', run, 'build') or '') == '' then
  -- First decision of a versioned worker: the run is pinned to its build from now on.
  redis.call('HSET', run, 'build', plan.pin[1], 'wq', plan.pin[2])
  sx_keyword(run, rid, 'build_id', plan.pin[1])
end
local closed = plan.close ~= nil
-- The instance mirrors its current run's status (and when it last changed).
local current = nil
if closed or plan.status ~= st[2] then
  current = redis.call('HGET', instance, 'run') == rid
  if current then redis.call('HSET', instance, 'status', plan.status, 'updated', ts) end
end
if closed then
  redis.call('HSET', run, 'closed', ts, 'outcome', plan.close)
  index_closed(run, rid)
  close_hooks(run)
  local nxt = plan.next
  -- Continued as new: signals and cancels are addressed to the workflow id, whose current run is
  -- the next one, so those the decision read too late (plan.carry) and those that arrived
  -- meanwhile go to its inbox, in order. Anything else still in the inbox is kept beside the history.
  local carry_to = (nxt ~= nil and current) and nxt.inbox or nil
  for _, item in ipairs(plan.carry or NONE) do
    if carry_to then
      redis.call('RPUSH', carry_to, item)
    else
      log_add(log, 'kind', 'dropped', 'e', item, 'reason', 'run closed', 'ts', ts)
    end
  end
  for _, item in ipairs(redis.call('LRANGE', inbox, 0, -1)) do
    if carry_to and carried(item) then
      redis.call('RPUSH', carry_to, item)
    else
      log_add(log, 'kind', 'dropped', 'e', item, 'reason', 'run closed', 'ts', ts)
    end
  end
  redis.call('DEL', inbox, acts)
  if nxt ~= nil and current then
    -- continue-as-new: the next run of the same workflow id (same partition).
    redis.call('HSET', instance, 'run', nxt.rid, 'status', 'pending', 'updated', ts)
    redis.call('HSET', nxt.run, 'workflow_id', nxt.wid, 'type', nxt.type, 'queue', nxt.queue,
      'status', 'pending', 'seq', 1, 'task', '1', 'created', ts, 'updated', ts, 'wq', nxt.wq,
      'parent', nxt.parent, 'previous', rid, 'build', nxt.build)
    local keep = redis.call('HGET', run, 'retention')
    if keep then redis.call('HSET', nxt.run, 'retention', keep) end
    redis.call('XADD', nxt.history, '0-1', 'e', envelope('WorkflowStarted', ts, nxt.data))
    redis.call('XADD', nxt.wq, '*', 'run', nxt.rid)
    redis.call('ZADD', nxt.runs, ts, nxt.rid)
    -- Workflow timeouts: the execution deadline stays, the run timeout starts again.
    for _, d in ipairs(nxt.deadlines or {}) do
      local due = tonumber(d[2]) or 0
      if due <= 0 then due = ts + tonumber(d[3]) end
      redis.call('ZADD', timers, due, d[1])
    end
    sx_start(nxt.run, nxt.rid, nxt.sx)
  end
  -- A closed run's workflow timeouts have nothing left to time out.
  for _, m in ipairs(plan.undeadlines or {}) do redis.call('ZREM', timers, m) end
end

if plan.task ~= nil then ack(plan.task[1], plan.task[2]) end
-- An eager commit (no workflow task) of an open run leaves the task flag alone: a task already
-- pending (inputs arrived) stays pending and will read them; the inbox is not read for it.
local waiting = 0
if closed then
  redis.call('HSET', run, 'task', '0')
elseif plan.task ~= nil then
  waiting = redis.call('LLEN', inbox)
  if waiting > 0 then
    -- Inputs arrived during the decision: keep the task flag and enqueue a new
    -- task, or they would be stranded behind the task just acked.
    redis.call('XADD', task_stream(run), '*', 'run', rid)
  else
    redis.call('HSET', run, 'task', '0')
  end
end
return {'OK', new_seq, waiting, claimed}
