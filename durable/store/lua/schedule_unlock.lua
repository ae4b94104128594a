-- Release a schedule's lock if it is still ours (it may have expired and been taken since).
-- KEYS: lock
-- ARGV: token
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
