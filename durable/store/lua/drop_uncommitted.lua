-- Undo what a commit that failed half-way wrote past its run record's count (a Redis error
-- inside the script, a key of the wrong kind: Redis does not undo a script's earlier writes):
-- those history entries move beside it, to the run's log (kind 'dropped'), the inputs among them
-- go back to the head of the inbox in their order, and the run is queued to be decided again.
-- Only what the record never counted is moved: the history up to its seq stays as it is.
-- KEYS: run, history, inbox, log, blocked index
-- ARGV: run id, the record's seq and the history's top seq the caller read, then the seqs of
--       the entries that are inputs
-- Returns {'OK', entries moved} | {'MOVED'} (the run or its history changed: read again)
--   | {'CLOSED', status}
local run, history, inbox, log = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local rid, seq, top = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local status = redis.call('HGET', run, 'status')
if not is_open(status) then return {'CLOSED', status or 'missing'} end
local last = redis.call('XREVRANGE', history, '+', '-', 'COUNT', 1)[1]
if tonumber(redis.call('HGET', run, 'seq')) ~= seq or not last or last[1] ~= '0-' .. top then
  return {'MOVED'}
end
local MOVED = 'dropped by durable repair --drop-uncommitted: written past the run record'
local inputs = {}
for i = 4, #ARGV do inputs[ARGV[i]] = true end
local extra = redis.call('XRANGE', history, '0-' .. (seq + 1), '+')
local ts = now_ms()
for i = #extra, 1, -1 do  -- back to the inbox's head, last first: in their order
  local id, fields = extra[i][1], extra[i][2]
  local e = fields[2]
  if inputs[string.sub(id, 3)] then redis.call('LPUSH', inbox, e) end
end
for _, entry in ipairs(extra) do
  local e = entry[2][2]
  local back = inputs[string.sub(entry[1], 3)] and '; put back in the inbox' or ''
  local reason = string.format('%s (seq %d) by a commit that failed half-way%s', MOVED, seq, back)
  log_add(log, 'kind', 'dropped', 'e', e, 'reason', reason, 'ts', ts)
  redis.call('XDEL', history, entry[1])
end
-- The stream's last id stays at the deleted entries' (XADD takes only a greater one): set back,
-- so the next commit writes seq + 1 again.
redis.call('XSETID', history, '0-' .. seq)
redis.call('HDEL', run, 'blocked', 'blocked_kind', 'blocked_input', 'sticky')
redis.call('ZREM', KEYS[5], rid)
redis.call('HSET', run, 'task', '1')
redis.call('XADD', redis.call('HGET', run, 'wq'), '*', 'run', rid)
return {'OK', #extra}
