-- Deliver an input (signal, cancel request, hook payload, child result) to
-- a workflow's current run, or to exactly one run: stamp it, push it onto the
-- run's inbox, wake the run. Resolving the current run here (not in the
-- caller) makes a signal one round trip and immune to a continue-as-new racing it.
-- KEYS: instance[, run, inbox] (run and inbox only with an exact run id)
-- ARGV: run id ('' = the instance's current run), event type, event data (msgpack)
--       [, limits (msgpack {most inbox items, most history events, most bytes of client inputs}
--       or ''): refuse beyond them (see take_input in _lib.lua)
--       [, a client signal's T:sent key, its time to live (ms)]]
-- Returns {'OK', run id} | {'CLOSED', status, run id} | {'NOTFOUND'} | {'LIMIT', limit, count, run id}
--   (a client's signal sent again after its reply was lost: {'OK', the run it went to})
local instance, run, inbox = KEYS[1], KEYS[2], KEYS[3]
local rid, type_name, data = ARGV[1], ARGV[2], ARGV[3]
local sent = sent_before(ARGV[5])
if sent then return {'OK', sent} end

if rid == '' then
  rid = redis.call('HGET', instance, 'run')
  if not rid then return {'NOTFOUND'} end
  local tag = string.match(instance, '^(.-{%d+})')
  run, inbox = tag .. ':run:' .. rid, tag .. ':in:' .. rid
end
local status = redis.call('HGET', run, 'status')
if not is_open(status) then return {'CLOSED', status or 'missing', rid} end
local limits = (ARGV[4] and ARGV[4] ~= '') and cmsgpack.unpack(ARGV[4]) or nil
local refused = take_input(run, inbox, rid, limits, type_name, data)
if refused then return {refused[1], refused[2], refused[3], rid} end
note_sent(ARGV[5], rid, ARGV[6])
return {'OK', rid}
