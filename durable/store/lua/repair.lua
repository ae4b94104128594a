-- Unblock a run after a fixed deploy: clear the reason, enqueue a workflow task.
-- With drop = '1' the inbox item that blocks the run (its position recorded when it
-- was parked, else the first) moves to the dead-letter stream first.
-- KEYS: run, inbox, dead, log, blocked index
-- ARGV: run id, drop ('1' | '0')
-- Returns {'OK', dropped ('1' | '0')} | {'CLOSED', status}
local run, inbox, dead, log = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local rid, drop = ARGV[1], ARGV[2] == '1'
local status = redis.call('HGET', run, 'status')
if not is_open(status) then return {'CLOSED', status or 'missing'} end
local dropped = '0'
if drop then
  local at = (tonumber(redis.call('HGET', run, 'blocked_input')) or 1) - 1
  local item = redis.call('LINDEX', inbox, at)
  if item then
    local ts = now_ms()
    local reason = 'dropped by durable repair: ' .. (redis.call('HGET', run, 'blocked') or 'not blocked')
    -- An identical earlier item would have blocked first: removing the first copy removes this one.
    redis.call('LREM', inbox, 1, item)
    redis.call('XADD', dead, '*', 'kind', 'inbox', 'run', rid, 'e', item, 'reason', reason, 'ts', ts)
    log_add(log, 'kind', 'dropped', 'e', item, 'reason', reason, 'ts', ts)
    dropped = '1'
  end
end
redis.call('HDEL', run, 'blocked', 'blocked_kind', 'blocked_input', 'sticky')
redis.call('ZREM', KEYS[5], rid)
redis.call('HSET', run, 'task', '1')
redis.call('XADD', redis.call('HGET', run, 'wq'), '*', 'run', rid)
return {'OK', dropped}
