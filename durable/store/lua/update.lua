-- Deliver an update to one run, once per update id: the first delivery of an id pushes
-- the UpdateRequested onto the run's inbox and wakes the run; a later one (a client's
-- retry) writes nothing, whatever the run's status: its caller reads the first one's outcome.
-- KEYS: run, inbox, updates (update id -> ms delivered)
-- ARGV: run id, update id, event type, event data (msgpack), limits (msgpack or '': see
--       take_input in _lib.lua)
-- Returns {'OK'} | {'DUP'} | {'CLOSED', status} | {'LIMIT', limit, count}
local run, inbox, updates = KEYS[1], KEYS[2], KEYS[3]
local rid, uid, type_name, data = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

if redis.call('HEXISTS', updates, uid) == 1 then return {'DUP'} end
local status = redis.call('HGET', run, 'status')
if not is_open(status) then return {'CLOSED', status or 'missing'} end
local limits = (ARGV[5] and ARGV[5] ~= '') and cmsgpack.unpack(ARGV[5]) or nil
local refused = take_input(run, inbox, rid, limits, type_name, data)
if refused then return refused end
redis.call('HSET', updates, uid, now_ms())
return {'OK'}
