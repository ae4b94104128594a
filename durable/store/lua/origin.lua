-- Make a partition's origin marker if it is missing, and say whether the caller's is gone.
-- `T:origin` is made once, by the first worker, with a random id. A Redis that comes back
-- without it (restarted without persistence, flushed, a replica promoted before it had it)
-- lost everything of the partition written before: no run, timer or task of it is there any
-- more, and nothing else says so. The first caller that remembers the old id writes when it
-- found it gone (`lost`, ms) and who it is (`lost_by`), for the operator's views.
-- KEYS: the partition's origin marker
-- ARGV: an id for a new marker, the id the caller saw last ('': none yet), the caller's name
-- Returns {the marker's id, when its partition's data was found lost (ms; 0: never)}
local key = KEYS[1]
local id = redis.call('HGET', key, 'id')
if not id then
  id = ARGV[1]
  redis.call('HSET', key, 'id', id, 'created', real_now_ms())
end
if ARGV[2] ~= '' and ARGV[2] ~= id and redis.call('HSETNX', key, 'lost', real_now_ms()) == 1 then
  redis.call('HSET', key, 'lost_by', ARGV[3])
end
return {id, tonumber(redis.call('HGET', key, 'lost') or '0')}
