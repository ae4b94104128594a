-- Unblock a run after a fixed deploy: clear the reason, enqueue a workflow task.
-- KEYS: run
-- ARGV: run id
-- Returns {'OK'} | {'CLOSED', status}
local run, rid = KEYS[1], ARGV[1]
local status = redis.call('HGET', run, 'status')
if not is_open(status) then return {'CLOSED', status or 'missing'} end
redis.call('HDEL', run, 'blocked', 'blocked_kind', 'sticky')
redis.call('HSET', run, 'task', '1')
redis.call('XADD', redis.call('HGET', run, 'wq'), '*', 'run', rid)
return {'OK'}
