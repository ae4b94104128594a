-- Make a build the queue's current one, but only if the current one is still the
-- build the caller saw (so two workers failing over at once do not flip-flop).
-- KEYS: the queue's current-build key (prefix:build:<queue>)
-- ARGV: expected current build ('' = none), new build
-- Returns 1 when set, 0 when another writer changed it first.
local now = redis.call('GET', KEYS[1]) or ''
if now ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
