-- Deliver an input (signal, cancel request, hook payload, child result) to
-- a workflow's current run: stamp it, push it onto the inbox, wake the run.
-- KEYS: instance, run, inbox
-- ARGV: run id (the caller's view of the current run), event type, event data (msgpack),
--       '1' to accept any run id (child results address one run exactly)
-- Returns {'OK'} | {'MOVED', current run id} | {'CLOSED', status}
local instance, run, inbox = KEYS[1], KEYS[2], KEYS[3]
local rid, type_name, data, exact = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

if exact ~= '1' then
  local current = redis.call('HGET', instance, 'run')
  if current ~= rid then return {'MOVED', current or ''} end
end
local status = redis.call('HGET', run, 'status')
if not is_open(status) then return {'CLOSED', status or 'missing'} end
redis.call('RPUSH', inbox, envelope(type_name, now_ms(), data))
wake(run, rid)
return {'OK'}
