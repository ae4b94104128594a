-- Deliver an input (signal, cancel request, hook payload, child result) to
-- a workflow's current run, or to exactly one run: stamp it, push it onto the
-- run's inbox, wake the run. Resolving the current run here (not in the
-- caller) makes a signal one round trip and immune to a continue-as-new racing it.
-- KEYS: instance[, run, inbox] (run and inbox only with an exact run id)
-- ARGV: run id ('' = the instance's current run), event type, event data (msgpack)
--       [, most inbox items, most history events: refuse at or beyond them (0: no limit)
--       [, a client signal's T:sent key, its time to live (ms)]]
-- Returns {'OK', run id} | {'CLOSED', status, run id} | {'NOTFOUND'} | {'LIMIT', limit, count, run id}
--   (a client's signal sent again after its reply was lost: {'OK', the run it went to})
local instance, run, inbox = KEYS[1], KEYS[2], KEYS[3]
local rid, type_name, data = ARGV[1], ARGV[2], ARGV[3]
local sent = sent_before(ARGV[6])
if sent then return {'OK', sent} end

if rid == '' then
  rid = redis.call('HGET', instance, 'run')
  if not rid then return {'NOTFOUND'} end
  local tag = string.match(instance, '^(.-{%d+})')
  run, inbox = tag .. ':run:' .. rid, tag .. ':in:' .. rid
end
local status = redis.call('HGET', run, 'status')
if not is_open(status) then return {'CLOSED', status or 'missing', rid} end
local max_inbox, max_events = tonumber(ARGV[4] or '0') or 0, tonumber(ARGV[5] or '0') or 0
if max_inbox > 0 or max_events > 0 then
  local pending = redis.call('LLEN', inbox)
  if max_inbox > 0 and pending >= max_inbox then return {'LIMIT', 'max_pending_signals', pending, rid} end
  local events = (tonumber(redis.call('HGET', run, 'seq')) or 0) + pending
  if max_events > 0 and events >= max_events then return {'LIMIT', 'max_history_events', events, rid} end
end
redis.call('RPUSH', inbox, envelope(type_name, now_ms(), data))
note_sent(ARGV[6], rid, ARGV[7])
wake(run, rid)
return {'OK', rid}
