-- Begin one activity attempt, before any of its code runs: the run must be open and the
-- attempt still the activity's current one (not completed, cancelled, superseded, or voided
-- when the run closed or was terminated: closing deletes the activities hash). A refused
-- attempt's task entry is acked and deleted: the task is void, nothing runs.
-- A begun attempt is marked started (with its deadline, if any), and gets the activity's
-- last heartbeat details, whichever attempt recorded them and however it was re-delivered.
-- `<aid>:worker` says who began it last and how often the attempt has begun
-- ("<attempt>|<worker>|<begins>"): each begin whose outcome never came ended with its worker
-- (workers/crash_loops.py counts those deaths; a task only read or claimed did not begin).
-- A begin after one whose outcome never came is logged beside the history as a `lost` attempt
-- record naming the worker that began it, so `durable describe` shows what happened to it.
-- KEYS: run, activities, running, the attempt's task stream, the run's log
-- ARGV: run id, activity id, attempt, task entry id ('' = none: a leased attempt),
--       deadline ms (0 = none), started ms, worker (who runs it: `durable describe` tells
--       whether it is still alive)
-- Returns {'OK', heartbeat details or '', now ms} | {'SKIP', why}
local run, acts, running, stream, log = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local rid, aid, attempt, entry_id = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local deadline = tonumber(ARGV[5])

local why = nil
local current = redis.call('HMGET', acts, aid .. '#', aid .. ':hb', aid .. ':worker', aid .. ':started', aid .. ':handed')
if not is_open(redis.call('HGET', run, 'status')) then
  why = 'the run is closed'
elseif not current[1] then
  why = 'the activity is no longer pending (completed, cancelled or timed out)'
elseif tonumber(current[1]) ~= attempt then
  why = 'a newer attempt is current'
end
if why then
  ack(stream, entry_id)
  return {'SKIP', why}
end
-- The same attempt begun before (a reclaim, a leased attempt run again): one more begin.
local now = now_ms()
local begins = 1
local last_attempt, last_begins = string.match(current[3] or '', '^(%d+)|[^|]*|(%d+)$')
if not last_attempt then last_attempt = string.match(current[3] or '', '^(%d+)|') end
if tonumber(last_attempt) == attempt then
  begins = (tonumber(last_begins) or 1) + 1
  local before = string.match(current[3], '^%d+|([^|]*)') or ''
  local since = tonumber(current[4] or '')
  local ago = since and string.format(' %d s before', math.floor((now - since) / 1000)) or ''
  local handed_by, why = string.match(current[5] or '', '^([^|]*)|(.*)$')
  if handed_by == before then
    -- Its worker handed it back (a stop past --grace, an outage): not a death of a worker.
    begins = begins - 1
    local reason = string.format('worker %s began it%s and handed it back (%s); %s runs it again', before, ago, why, ARGV[7])
    log_add(log, 'kind', 'attempt', 'act', aid, 'attempt', attempt, 'outcome', 'handed_back', 'reason', reason, 'ts', now)
  else
    local said = 'worker %s began it%s and never reported its outcome (it died, hung or was taken for dead, or a Redis outage hid the task from it); %s runs it again'
    local reason = string.format(said, before, ago, ARGV[7])
    log_add(log, 'kind', 'attempt', 'act', aid, 'attempt', attempt, 'outcome', 'lost', 'reason', reason, 'ts', now)
  end
  redis.call('HDEL', acts, aid .. ':handed')
end
redis.call('HSET', acts, aid .. ':started', ARGV[6], aid .. ':worker', attempt .. '|' .. ARGV[7] .. '|' .. begins)
if deadline > 0 then redis.call('ZADD', running, deadline, rid .. '|' .. aid .. '|' .. attempt) end
return {'OK', current[2] or '', now}
