-- Finish one activity attempt: ack its task, log the attempt, then either
-- schedule a retry (timers set, after backoff) or push ActivityCompleted /
-- ActivityFailed onto the run's inbox and wake the run.
-- KEYS: run, inbox, activities, log, timers, running, activity task stream[, the caller's private
--       workflow task stream of this partition]
-- ARGV: run id, activity id, attempt, task entry id, outcome ('completed'|'failed'|'retry'),
--       inbox event type, inbox event data (msgpack), retry delay ms, next attempt body,
--       attempt record (msgpack)[, the caller's consumer name ('' for none)[, '1': the outcome was
--       kept after a key of the wrong kind refused it]]
-- Returns {'OK', 1 if it enqueued the run's workflow task else 0[, a task entry read for the caller]}
--       | {'RETRY', due ms} | {'STALE', why}
local run, inbox, acts, log, timers, running, stream = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local rid, aid, attempt, entry_id, outcome = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]

local ts = now_ms()
-- Reads first: one of a key of the wrong kind (made by hand) fails here, before anything is
-- written (Redis does not undo a script's earlier writes: the task was acked and lost).
local current = tonumber(redis.call('HGET', acts, aid .. '#'))
local open = is_open(redis.call('HGET', run, 'status'))
redis.call('XLEN', log)
redis.call('LLEN', inbox)
-- A kept outcome (a key of the wrong kind refused it before) whose activities hash is absent: the
-- key is being mended (deleted, the hash set aside renamed back) or was deleted by hand. Not
-- "no longer pending": discarded, the run would wait for this activity forever. Refused like the
-- wrong kind, before any write, so the worker keeps it and tries again.
if not current and open and ARGV[12] == '1' and redis.call('EXISTS', acts) == 0 then
  local said = 'WRONGTYPE %s (the activities hash of open run %s) is missing: a result a key of the wrong kind refused waits for it; rename the hash set aside back'
  return redis.error_reply(string.format(said, acts, rid))
end
redis.call('ZREM', running, rid .. '|' .. aid .. '|' .. attempt)
ack(stream, entry_id)

-- A result nobody waits for any more is kept in the log, marked discarded.
local stale = nil
if not current then
  stale = 'activity is no longer pending (cancelled, timed out or already done)'
elseif current ~= attempt then
  stale = 'a newer attempt is current'
elseif not open then
  stale = 'run is closed'
end
local logged = outcome
if stale then logged = 'discarded' end
log_add(log, 'kind', 'attempt', 'act', aid, 'attempt', attempt, 'outcome', logged,
  'record', ARGV[10], 'reason', stale or '', 'ts', ts)
if stale then return {'STALE', stale} end

if outcome == 'retry' then
  local due = ts + tonumber(ARGV[8])
  redis.call('HSET', acts, aid, ARGV[9], aid .. '#', attempt + 1)
  redis.call('ZADD', timers, due, 'r|' .. rid .. '|' .. aid)
  return {'RETRY', due}
end
forget_activity(acts, aid)
redis.call('RPUSH', inbox, envelope(ARGV[6], ts, ARGV[7]))
local woke = wake(run, rid)
-- The caller's private stream (KEYS[8], consumer ARGV[11]): the woken task went there when the
-- run is sticky to the caller; read it for the caller now, so it decides the run without a
-- read of its own. pcall: that stream may have lost its consumer group (the caller recreates it).
if woke == 1 and KEYS[8] then
  local got = redis.pcall('XREADGROUP', 'GROUP', GROUP, ARGV[11], 'COUNT', 1, 'STREAMS', KEYS[8], '>')
  if type(got) == 'table' and not got.err and got[1] then return {'OK', woke, got[1][2][1]} end
end
return {'OK', woke}
