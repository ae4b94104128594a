-- Deliver an update to one run, once per update id: the first delivery of an id pushes
-- the UpdateRequested onto the run's inbox and wakes the run; a later one (a client's
-- retry) writes nothing, whatever the run's status: its caller reads the first one's outcome.
-- KEYS: run, inbox, updates (update id -> ms delivered)
-- ARGV: run id, update id, event type, event data (msgpack), most inbox items, most history events
--       (refuse at or beyond them; 0: no limit)
-- Returns {'OK'} | {'DUP'} | {'CLOSED', status} | {'LIMIT', limit, count}
local run, inbox, updates = KEYS[1], KEYS[2], KEYS[3]
local rid, uid, type_name, data = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

if redis.call('HEXISTS', updates, uid) == 1 then return {'DUP'} end
local status = redis.call('HGET', run, 'status')
if not is_open(status) then return {'CLOSED', status or 'missing'} end
local max_inbox, max_events = tonumber(ARGV[5]) or 0, tonumber(ARGV[6]) or 0
local pending = redis.call('LLEN', inbox)
if max_inbox > 0 and pending >= max_inbox then return {'LIMIT', 'max_pending_signals', pending} end
local events = (tonumber(redis.call('HGET', run, 'seq')) or 0) + pending
if max_events > 0 and events >= max_events then return {'LIMIT', 'max_history_events', events} end
local ts = now_ms()
redis.call('HSET', updates, uid, ts)
redis.call('RPUSH', inbox, envelope(type_name, ts, data))
wake(run, rid)
return {'OK'}
