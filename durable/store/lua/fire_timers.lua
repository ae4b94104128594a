-- Fire due timers of one partition: a workflow timer becomes TimerFired in
-- its run's inbox; an activity retry re-enqueues the activity's next attempt;
-- a workflow timeout (run or execution deadline) becomes WorkflowTimeoutFired; a task
-- handed back by a worker that lacks its type goes back to its queue, carrying since when
-- no live worker served the type ('unserved', ms; 0: some worker does).
-- Safe to run from many workers at once: each member is removed before use.
-- KEYS: timers
-- ARGV: partition key tag, max members
-- Returns {members taken, next due ms or -1, workflow timers and retry backoffs fired (the
-- last leaves out hand-backs, timeouts and members of closed runs: what the metric counts),
-- {member, key, the kind it holds, the kind expected} of each member left for a key of its run
-- of the wrong kind (it fires once the key is mended; removed first, it was lost)}
local timers = KEYS[1]
local tag, limit = ARGV[1], tonumber(ARGV[2])
local ts = now_ms()
local due = redis.call('ZRANGEBYSCORE', timers, '-inf', ts, 'LIMIT', 0, limit)
local fired, left = 0, {}
for _, member in ipairs(due) do
  local kind, rid, id = string.match(member, '^(%a)|([^|]+)|(.+)$')
  -- A member that names no timer of ours (written by something else) is dropped, not fatal.
  local run = tag .. ':run:' .. (rid or '')
  local wrong = kind and wrong_kind({run, 'hash', tag .. ':in:' .. rid, 'list', tag .. ':act:' .. rid, 'hash'})
  if wrong then
    left[#left + 1] = {member, wrong[1], wrong[2], wrong[3]}
    kind = nil
  else
    redis.call('ZREM', timers, member)
  end
  if kind and is_open(redis.call('HGET', run, 'status')) then
    if kind == 't' then
      redis.call('RPUSH', tag .. ':in:' .. rid, envelope('TimerFired', ts, cmsgpack.pack({id = id})))
      wake(run, rid)
      fired = fired + 1
    elseif kind == 'r' then
      local task = redis.call('HMGET', tag .. ':act:' .. rid, id, id .. '@')
      if task[1] then
        add_task(task[2], tag .. ':sessions', 'run', rid, 'act', id, 'body', task[1])
        fired = fired + 1
      end
    elseif kind == 'd' then
      -- The decision that applies it closes the run as failed (WorkflowTimeout).
      redis.call('RPUSH', tag .. ':in:' .. rid, envelope('WorkflowTimeoutFired', ts, cmsgpack.pack({timeout = id})))
      wake(run, rid)
    elseif kind == 'w' then
      local wq = redis.call('HGET', run, 'wq')
      if wq then redis.call('XADD', wq, '*', 'run', rid, 'unserved', id) end
    elseif kind == 'u' then
      local aid, first = string.match(id, '^(.+)|(%d+)$')
      local task = {false}
      if aid then task = redis.call('HMGET', tag .. ':act:' .. rid, aid, aid .. '@') end
      if task[1] then
        add_task(task[2], tag .. ':sessions', 'run', rid, 'act', aid, 'body', task[1], 'unserved', first)
      end
    end
  end
end
local nxt = redis.call('ZRANGE', timers, 0, 0, 'WITHSCORES')
local next_due = -1
if nxt[2] then next_due = tonumber(nxt[2]) end
return {#due - #left, next_due, fired, left}
